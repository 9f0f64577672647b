"""Speculative decoding's guesses and when they pay: the n-gram (prompt lookup) drafter and the controller
that sizes its drafts from what this reply measures.

A draft is checked by the target itself (llama.py's decode loop draws each row of one verification batch
as it would have drawn that token alone), so a guess changes only the speed, never the text. A guess is
not free: each row of the batch costs the output layer once more (on the starter, a 262,144-token
vocabulary, a 2-token batch costs ~1.8 steps), so the controller drafts only while the tokens kept per
second beat plain decoding measured in the same reply, and pauses, retrying later, when they do not.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..base import EngineError
from ..params import InvalidParameter

if TYPE_CHECKING:  # the config reads KINDS without loading llama.cpp
    from .llamacpp import LlamaSession

KINDS = ("ngram", "off")  # the drafters by name: prompt lookup, or none; else a draft model's .gguf file
VOCAB_SAMPLES = 4096  # tokens compared between a draft model's vocabulary and the target's
NGRAM_SIZES = (4, 3, 2)  # the longest recent match wins; a lone token's match guesses too poorly to pay
START_SIZE = 4  # the first draft's length; it doubles while every guess is kept
TRIALS = 4  # verifications before the controller judges whether drafting pays
LOSSES = 2  # verifications in a row at over twice plain decoding's time per token: judged at once
FIRST_PAUSE = 16  # plain tokens before drafting is tried again; doubles each time it did not pay
LONGEST_PAUSE = 512
SMOOTHING = 0.3  # weight of the newest figure in the running averages


def check_kind(kind: Any) -> str:
    """`ngram`, `off` or a draft model's .gguf path; one line otherwise."""
    if isinstance(kind, str) and (kind in KINDS or kind.lower().endswith(".gguf")):
        return kind
    raise InvalidParameter(f"draft must be one of {', '.join(KINDS)} or a draft model's .gguf file (got {kind!r})")


class Drafter(Protocol):
    def add(self, token: int) -> None: ...

    def propose(self, limit: int) -> list[int]: ...


class NgramDrafter:
    """Proposes the continuation of the most recent earlier occurrence of the text's last few tokens (prompt
    lookup decoding): a reply that copies, quotes or edits its prompt is mostly such continuations.

    An index per n-gram size maps each n-gram to where its latest occurrence with a known continuation ends;
    adding a token updates it in O(sizes), so a guess costs a few dict lookups."""

    def __init__(self, tokens: Iterable[int]) -> None:
        self.tokens: list[int] = []
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAM_SIZES}
        for token in tokens:
            self.add(token)

    def add(self, token: int) -> None:
        tokens = self.tokens
        tokens.append(token)
        end = len(tokens) - 1  # the n-grams ending before `token` now have a continuation: it
        for n, ends in self._ends.items():
            if end >= n:
                ends[tuple(tokens[end - n : end])] = end

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the longest n-gram the text ends with, the last time it occurred."""
        tokens = self.tokens
        for n, ends in self._ends.items():
            if len(tokens) >= n and (start := ends.get(tuple(tokens[-n:]))) is not None:
                return tokens[start : start + limit]
        return []


class ModelDrafter:
    """A small model sharing the target's vocabulary guesses greedily. Its own KV cache follows the text: each
    guess first drops what the target rejected (the cache keeps the longest prefix it shares with the text),
    reads what the target added, then steps through its guesses."""

    def __init__(self, session: LlamaSession, tokens: Iterable[int]) -> None:
        self.session = session
        self.tokens = list(tokens)

    def add(self, token: int) -> None:
        self.tokens.append(token)

    def propose(self, limit: int) -> list[int]:
        session = self.session
        keep = session.keep_prefix(self.tokens)
        session.prefill(self.tokens[keep:], lambda _done: None, lambda: False)
        guesses: list[int] = []
        while len(guesses) < limit:
            guesses.append(int(session.likeliest(1)[0]))
            if len(guesses) < limit:
                session.step(guesses[-1])
        return guesses


def check_vocabulary(draft: LlamaSession, target: LlamaSession, path: Path) -> None:
    """A draft model must write the target's tokens: the same vocabulary size and the same pieces (a sample
    spread over the whole vocabulary, the ends included)."""
    if draft.n_vocab != target.n_vocab:
        raise EngineError(f"the draft model {path.name} has another vocabulary ({draft.n_vocab:,} tokens, the model "
                          f"{target.n_vocab:,}): it must share the model's")
    step = max(1, target.n_vocab // VOCAB_SAMPLES)
    sample: Sequence[int] = [*range(0, target.n_vocab, step), target.n_vocab - 1]
    differs = next((t for t in sample if draft.piece(t) != target.piece(t)), None)
    if differs is not None:
        raise EngineError(f"the draft model {path.name} has another vocabulary (token {differs} is "
                          f"{draft.piece(differs)!r} there, {target.piece(differs)!r} here): it must share the model's")


class DraftController:
    """How long the next draft may be (0: do not draft now), from what the reply measures: how many guesses the
    target keeps, and the time per kept token drafting against plain decoding.

    The draft grows while every guess is kept and shrinks to what was kept last; after a few verifications
    the measured time per kept token decides whether drafting goes on or pauses for a while (the pause
    doubling each time it did not pay); two verifications in a row at over twice plain decoding's time per
    token are judged at once (a draft model guessing poorly costs its own steps too). What one reply measured
    carries to the model's next (`after`)."""

    def __init__(self, limit: int, plain_ms: float | None = None) -> None:
        self.limit = limit
        self.size = START_SIZE
        self.plain_ms = plain_ms
        self.draft_ms: float | None = None
        self.trials = 0
        self.losses = 0  # the verifications in a row that cost over twice plain decoding's time per token
        self.paused = 0
        self.pause = FIRST_PAUSE
        self.drafted = 0
        self.accepted = 0
        self.verifications = 0
        self.plain_tokens = 0
        self.plain_s = 0.0
        self.draft_tokens = 0  # tokens kept from verifications: the accepted and the one drawn after them
        self.draft_s = 0.0
        self.batch_ms: dict[int, float] = {}  # a verification's time by its draft's length (running averages)
        self.paid = True  # what the last judgement found

    @classmethod
    def after(cls, last: DraftController | None) -> DraftController:
        """A reply's controller, knowing what the model's last reply measured: plain decoding's and each draft
        length's time, and whether drafting paid at its last judgement; if not, this reply starts paused (for
        FIRST_PAUSE tokens), so a run of short replies that never pay (tool calls, chat) are not each slowed by
        a fresh round of trials."""
        control = cls(0)
        if last is not None:
            control.plain_ms, control.batch_ms = last.plain_ms, dict(last.batch_ms)
            control.paused = 0 if last.paid else FIRST_PAUSE
        return control

    def next_size(self) -> int:
        """The longest draft to ask for now; 0 while drafting is paused (or off), and once, after a few
        verifications, to time a plain step where none was timed yet (a reply that drafts from its first token)."""
        if self.paused or self.limit <= 0 or (self.plain_ms is None and self.trials >= TRIALS):
            return 0
        return min(self.size, self.limit)

    def plain(self, seconds: float) -> None:
        """One token decoded without a draft, in `seconds` (from the previous decode to this one)."""
        self.plain_tokens += 1
        self.plain_s += seconds
        self.plain_ms = _average(self.plain_ms, seconds * 1000)
        if self.paused:
            self.paused -= 1

    def verified(self, drafted: int, accepted: int, seconds: float) -> None:
        """One verification: `drafted` guesses, the first `accepted` of them kept, then one token drawn after
        them; `seconds` from the decode before it to the next."""
        self.drafted += drafted
        self.accepted += accepted
        self.verifications += 1
        self.draft_tokens += accepted + 1
        self.draft_s += seconds
        self.draft_ms = _average(self.draft_ms, seconds * 1000 / (accepted + 1))
        self.batch_ms[drafted] = _average(self.batch_ms.get(drafted), seconds * 1000)
        self.size = min(self.limit, drafted * 2) if accepted == drafted else max(self.shortest(), accepted)
        self.trials += 1
        lost = self.plain_ms is not None and seconds * 1000 / (accepted + 1) > 2 * self.plain_ms
        self.losses = self.losses + 1 if lost else 0
        if (self.trials >= TRIALS or self.losses >= LOSSES) and self.plain_ms is not None:
            self.paid = self.draft_ms < self.plain_ms
            if not self.paid:
                self.paused, self.pause = self.pause, min(LONGEST_PAUSE, self.pause * 2)
                self.trials, self.losses, self.draft_ms, self.size = 0, 0, None, START_SIZE

    def shortest(self) -> int:
        """The shortest draft that can pay: `n` guesses, all kept, give n + 1 tokens for one verification, so
        a length whose verification was measured to take as long as n + 1 plain steps cannot pay whatever is
        kept. Each row of a batch costs the 262,144-token output layer once more: on the starter a 2-row batch
        (one guess) takes ~1.8 steps, and with the guess's own cost it never pays; longer drafts share the
        batch's fixed cost and can. Lengths not measured yet are tried."""
        size = 1
        while (size < self.limit and self.plain_ms is not None and (ms := self.batch_ms.get(size)) is not None
               and ms >= (size + 1) * self.plain_ms):
            size += 1
        return size

    def stopped(self, drafted: int, accepted: int) -> None:
        """A verification the reply ended (or a setting changed) in the middle of: its guesses count, untimed."""
        self.drafted += drafted
        self.accepted += accepted
        self.verifications += 1
        self.draft_tokens += accepted


class Speculation:
    """A reply's drafting: its drafter (None: drafting is off), its controller, and the draft being verified. Row i
    of a verification batch is drawn against `guesses[i]`; the reply keeps each guess it draws as guessed and
    stops at the first it does not (that draw is the correction), then the guesses not kept leave the cache."""

    def __init__(self, drafter: Drafter | None, control: DraftController) -> None:
        self.drafter = drafter
        self.control = control
        self.guesses: list[int] = []  # the draft being walked
        self.kept = 0  # of them, those drawn as guessed so far
        self.cycle_at: float | None = None  # when the last step or verification started

    def follow(self, draft_max: int) -> None:
        """The longest draft the settings allow now."""
        if self.drafter is not None:
            self.control.limit = draft_max

    def judge(self, token: int, row: int) -> int | None:
        """The guess that `token`, drawn from `row`, was drawn against (None: no guess there); counted kept when
        they agree."""
        guess = self.guesses[row] if self.guesses and row < len(self.guesses) else None
        self.kept += token == guess
        return guess

    def taken(self, token: int) -> None:
        if self.drafter is not None:
            self.drafter.add(token)

    def advance(self, session: LlamaSession, token: int, room: int) -> None:
        """Put the token just drawn into the cache: with a draft of what follows it, where the drafter has one and
        the controller says drafting pays now (one batch), else alone (one step). `room`: the most guesses that
        fit the context and the reply's max tokens."""
        size = min(self.control.next_size(), room)
        self.cycle_at = time.perf_counter()
        draft = self.drafter.propose(size) if self.drafter is not None and size > 0 else []
        if draft:
            session.verify([token, *draft])
            self.guesses = draft
        else:
            session.step(token)

    def unverified(self, session: LlamaSession) -> int:
        """Cache cells of the guesses past the row being drawn from: not the reply's yet."""
        return len(self.guesses) - session.row if self.guesses else 0

    def settle(self, session: LlamaSession, now: float | None = None) -> None:
        """Time the step or verification whose rows were just drawn, and drop from the cache the cells of the
        guesses not kept. `now`: the row's draw ended a verification (or a step) the usual way, so it is timed;
        without it, something else cut it short (the reply ended, a setting changed, the thinking's budget)."""
        if self.guesses:
            session.truncate(len(session.tokens) - self.unverified(session))
        if now is not None and self.cycle_at is not None:
            if self.guesses:
                self.control.verified(len(self.guesses), self.kept, now - self.cycle_at)
            else:
                self.control.plain(now - self.cycle_at)
        elif self.guesses:
            self.control.stopped(len(self.guesses), self.kept)
        self.guesses, self.kept = [], 0
        self.cycle_at = None


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else mean + SMOOTHING * (value - mean)
