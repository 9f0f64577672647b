"""A reply being written: its prompt fitted to the context and read, then the decode loop that draws a token at a
time (or verifies a draft's guesses in one batch), each token's event, and the reply's figures. The backend runs it
on its worker (llama.py); the lab's columns and the serving slots draw theirs from a row of a shared batch
(`RowReply`, rows.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol, TypedDict

from ..base import (
    Done,
    GrammarMask,
    Message,
    Metrics,
    PromptProgress,
    Request,
    Stage,
    StopReason,
    Stream,
    Token,
    TurnMetrics,
)
from ..context import fit_context
from ..params import SamplingParams
from ..prompts import opens_thinking
from ..reasoning import ReplyText, ThinkingSplitter
from ..stops import StopScanner
from .chain import Chain
from .cpu import ThreadGovernor
from .draft import DraftController, NgramDrafter, Speculation
from .grammar import Constraint, FormatStuck
from .inspector import Inspection, Later
from .kvcache import Restored
from .llamacpp import LlamaSession, PrefillAborted
from .model import LoadedModel
from .transcript import Transcript
from .worker import Worker

METRICS_INTERVAL_S = 0.1
_UNSEEN = Inspection(None, (), None)  # a token drawn with the inspector off
Seen = Inspection | Later  # the inspector's figures of a token, or their promise (`inspect_later`)


def kept_token_count(ends: list[int | None], visible_len: int) -> int:
    """How many generated tokens lie wholly inside the visible reply.

    `ends[i]` is the text length after token i, or None while a UTF-8 character is still incomplete.
    Tokens past the visible text (a cut stop sequence) are not part of the conversation.
    """
    kept = 0
    for i, end in enumerate(ends):
        if end is not None:
            if end > visible_len:
                break
            kept = i + 1
    return kept


class Host(Protocol):
    """What a reply, the lab and the slots use of the backend that runs them (llama.py's `LlamaBackend`): they are
    its collaborators, handed the backend itself, not subclasses of it."""

    transcript: Transcript
    drafting: DraftController | None  # the last reply's: what it measured carries to the next
    threads: ThreadGovernor
    worker: Worker

    @property
    def session(self) -> LlamaSession | None: ...

    def loaded(self) -> LoadedModel: ...

    def write(self, request: Request, stream: Stream, make: ReplyMaker | None = None) -> None: ...


ReplyMaker = Callable[[Host, Request, Stream], "Reply"]  # a reply of another shape (the lab's)


class _TokenFacts(TypedDict):
    forced: bool
    stages: tuple[Stage, ...]
    grammar: GrammarMask | None
    inserted: bool
    drafted: bool
    rejected: str


class Reply:
    """One reply: prompt, prefill with progress, then the decode loop that reads params every token.

    A reasoning model's thinking is split from its answer as the tokens come (`ReplyText`); once it has
    thought for its budget, the engine writes the end of the thinking itself and the model answers. An
    output format's grammar governs the answer only: the thinking is drawn free of it.

    Speculative decoding (draft.py): instead of one step, the token just drawn and a draft of the tokens
    guessed to follow it are decoded in one batch; the loop then draws row by row, exactly as it would
    have drawn each token alone, keeping the guesses it draws and stopping at the first it does not (that
    draw is the correction). So every token is a true draw of the target, a seeded reply draws the same
    random numbers, and stops, the grammar, the thinking budget, live settings and Esc act token by token
    as without a draft. The cells of the guesses not kept are dropped from the cache (`Speculation.settle`).
    """

    drafts = True  # the lab's turns say no: their columns step together, a row each
    overlaps_inspector = True  # its figures may come a decode later; rows of one decode (the lab's, slots') share one

    def __init__(self, backend: Host, request: Request, stream: Stream,
                 fitted: tuple[str, list[int], int] | None = None) -> None:
        self.backend = backend
        self.model = model = backend.loaded()
        self.session = model.session
        self.format = prompt_format = model.format
        self.request = request
        self.stream = stream
        self.started_at = time.perf_counter()
        self.template_s = self.tokenize_s = self.prefix_s = 0.0  # parts of the time to the first token
        self.implicit_stops = prompt_format.implicit_stops
        self.shown = bool(request.top_logprobs or request.xray)  # each token's own text goes with it
        self.forced = list(request.forced)
        self.allowance = len(self.forced) if request.continuing else 0  # tokens beyond max tokens
        # the prompt's text, tokens and turns left out: a lab's columns take the lab's
        self.prompt_text, self.prompt, self.dropped_turns = fitted or self._fitted_prompt()
        self.inside = opens_thinking(self.prompt_text, prompt_format.thinking)  # the prompt opened the thinking
        self.context = self.prompt + self.forced  # all the model reads before its first new token
        self.cached = 0
        self.restored: Restored | None = None
        self.prefill_s = 0.0
        self.generated: list[int] = []
        self.drawn = 0  # generated tokens the model chose (a branch's forced ones excluded)
        self.inserted = 0  # generated tokens the engine wrote: the end of a thinking past its budget
        self.text = self._new_text()
        self.first_at: float | None = None
        self.visible_at: float | None = None
        self.last_at: float | None = None
        self.decode_at: float | None = None  # when the reply's first token came due
        self.thought_at: float | None = None  # when its thinking ended
        self.constraint: Constraint | None = None
        self.stuck = ""  # why the output format's engine allowed no next token, where it did not
        self.later: Later | None = None  # the inspector's figures for the token event `held`
        self.held: Callable[..., Token] | None = None  # its event, to be made with them
        self.speculation = Speculation(self.model.new_drafter(self.prompt) if self.drafts else None,
                                       DraftController.after(backend.drafting))
        self.sampling_path = "python"  # where the current chain draws: "llama.cpp" (in its graph) or "python"

    def _fitted_prompt(self) -> tuple[str, list[int], int]:
        """The prompt's text and tokens, the oldest turns left out if the conversation outgrew the context."""
        backend, session = self.backend, self.session
        rendered: dict[int, tuple[str, list[int]]] = {}
        extra = self.format.options(self.request.thinking, self.request.tools)

        def count(messages: list[Message]) -> int:
            started = time.perf_counter()
            text = self.format.render(messages, session.bos_text, session.eos_text, extra)
            rendered_at = time.perf_counter()
            rendered[len(messages)] = text, backend.transcript.tokens_for(session, text, self.model.disk)
            self.template_s += rendered_at - started
            self.tokenize_s += time.perf_counter() - rendered_at
            return len(rendered[len(messages)][1]) + len(self.forced)

        _, params = self.request.params.snapshot()
        fitted = fit_context(self.request.messages, count, session.n_ctx, params.max_tokens)
        text, tokens = rendered[len(fitted.messages)]
        return text, tokens, fitted.dropped_turns

    def _new_text(self, stops: tuple[str, ...] = ()) -> ReplyText:
        return ReplyText(ThinkingSplitter(self.format.thinking, self.inside), StopScanner(stops))

    def _piece(self, token: int) -> bytes:
        return self.model.markers.get(token) or self.session.piece(token)

    def retune_threads(self) -> None:
        """Follow the machine's load: fewer threads while other processes keep cores busy; the draft model's too,
        as it decodes on the same cores between the model's batches."""
        governor = self.backend.threads
        if governor.retune(step_ms=self.speculation.control.plain_ms or self.session.step_ms_at_load):
            self.session.set_threads(governor.threads)
            if (draft := self.model.draft) is not None:
                draft.set_threads(governor.threads)

    def run(self) -> None:
        """The reply; an output format's grammar first, so a bad one is the reply's only event."""
        output = self.request.format
        opening = self.model.opens_thinking if not self.inside and not self.forced else frozenset()
        self.constraint = Constraint(self.session, output, opening) if output.constrained else None
        if self.constraint is not None:
            self.constraint.accept_given(self._given_answer())
        self._write()

    def _given_answer(self) -> list[int]:
        """A branch's given tokens that the grammar governs: those after the thinking."""
        text = self._new_text()
        for index, token in enumerate(self.forced):
            if not text.splitter.thinking:
                return self.forced[index:]
            text.add(self._piece(token))
        return []

    def _write(self) -> None:
        session, disk = self.session, self.model.disk
        self.retune_threads()
        self.restored = disk.restore(session, self.context) if disk is not None else None
        matching = time.perf_counter()
        self.cached = session.keep_prefix(self.context)
        self.prefix_s = time.perf_counter() - matching
        session.reset_perf()
        self.text = self._new_text(self.request.params.snapshot()[1].stop + self.implicit_stops)
        try:
            self._prefill()
        except PrefillAborted:
            self._finish("cancelled")
            return
        if disk is not None:
            disk.observe_prefill(len(self.context) - self.cached, self.prefill_s)
        self.decode_at = time.perf_counter()
        try:
            reason = self._replay_forced() or self._decode()
        except FormatStuck as stuck:
            reason, self.stuck = "format", str(stuck)
        self._finish(reason)

    def _prefill(self) -> None:
        todo = self.context[self.cached :]
        started = time.perf_counter()

        def progress(done: int) -> None:
            ids = tuple(self.prompt) if done == 0 else ()
            self.stream.put(PromptProgress(done, len(todo), time.perf_counter() - started, ids))
            self.retune_threads()

        progress(0)
        self.session.prefill(todo, progress, self.stream.cancelled.is_set)
        self.prefill_s = time.perf_counter() - started

    def _replay_forced(self) -> StopReason | None:
        """A branch's given tokens become the start of the reply text, as if they had been drawn."""
        for token in self.forced:
            reason = self._take(token, time.perf_counter(), -1, _UNSEEN, forced=True)
            if reason is not None:
                return reason
        return None

    def _decode(self) -> StopReason:
        session, stream, live, speculation = self.session, self.stream, self.request.params, self.speculation
        worker = self.backend.worker
        governor = self.backend.threads
        sampler: Chain | None = None
        version = -1
        in_graph = False  # the chain is to be attached after its first draw
        next_metrics = 0.0
        try:
            while True:
                if stream.cancelled.is_set():
                    return "cancelled"
                if live.version != version or sampler is None:
                    speculation.settle(session)
                    version, params = live.snapshot()
                    speculation.follow(params.draft_max)
                    if sampler is not None:
                        self._drop_sampler(sampler)
                    seed = params.seed if params.seed >= 0 else random.getrandbits(32)
                    sampler = session.new_sampler(params, seed)
                    in_graph = self._draws_in_graph()
                    self.sampling_path = "python"
                    self.text.scanner.stops = params.stop + self.implicit_stops
                if len(self.generated) >= params.max_tokens + self.allowance:
                    return "length"
                if self._budget_spent(params):
                    speculation.settle(session)
                    reason = self._end_thinking(sampler, version, params)
                    if reason is not None:
                        return reason
                    continue
                token, seen, stages = self._draw(sampler, params)
                if in_graph:  # after its first draw, on the host from the logits row: llama.cpp draws the rest
                    in_graph = False
                    self.sampling_path = "llama.cpp" if session.attach(sampler) else "python"
                now = time.perf_counter()
                self.first_at = self.first_at or now
                self.last_at = now
                self.drawn += 1
                guess = speculation.judge(token, session.row)
                reason = self._take(token, now, version, seen, stages, drafted=token == guess,
                                    rejected=guess if guess is not None and token != guess else None
                                    ) or self._no_room(params)
                if reason is not None:
                    return reason
                if token == guess:  # kept: it is in the cache already, and the batch has the next row
                    session.row += 1
                    continue
                speculation.settle(session, now)
                if worker.quick_waiting:
                    worker.run_quick()
                room = min(session.n_ctx - len(session.tokens) - 2,
                           params.max_tokens + self.allowance - len(self.generated))
                speculation.advance(session, token, room)
                if now >= next_metrics:
                    self._flush()
                    stream.put(Metrics(self.metrics()))
                    next_metrics = now + METRICS_INTERVAL_S
                if time.monotonic() >= governor.next_check:
                    self.retune_threads()
        finally:
            self._flush()
            speculation.settle(session)
            self.backend.drafting = speculation.control
            if sampler is not None:
                session.free_sampler(sampler)

    def _draws_in_graph(self) -> bool:
        """Whether this reply's chains are offered to llama.cpp to draw in its graph (`LlamaSession.attach`, which
        takes those it can): not where the host reads the model's logits row (the inspector, the X-ray, an output
        format's grammar), nor with a draft, whose verification asks several rows of the sequence (llama.cpp draws
        one a sequence a decode)."""
        request = self.request
        return not (request.top_logprobs or request.xray or self.constraint is not None
                    or self.speculation.drafter is not None)

    def _drop_sampler(self, sampler: Chain) -> None:
        """Free the chain that settings changed mid-reply replace; where it drew in llama.cpp's graph, the last
        token is read again, so that the new one draws its first token from the logits row."""
        attached = sampler.seq is not None
        self.session.free_sampler(sampler)
        if attached:
            self.session.reread_last()

    def _take(self, token: int, now: float, version: int, seen: Seen, stages: tuple[Stage, ...] = (), *,
              forced: bool = False, inserted: bool = False, drafted: bool = False,
              rejected: int | None = None) -> StopReason | None:
        """A token joins the reply: its text, split into thinking and answer, and its event. Returns why the
        reply ends with it, if it does. `drafted`: a guess of the draft, kept; `rejected`: the guess this token
        replaced (a correction). With the inspector's figures still to come, the event waits for them: it goes
        out before the next event (`_flush`), one decode later."""
        self._flush()
        if isinstance(seen, Later):
            self.later = seen
            seen = _UNSEEN
        self.generated.append(token)
        self.speculation.taken(token)
        events: _TokenFacts = {"forced": forced, "stages": stages, "grammar": seen.mask, "inserted": inserted,
                               "drafted": drafted, "rejected": "" if rejected is None else self._guess_text(rejected)}
        named = self.shown or forced  # the token's own text (or a special token's name) goes with it
        if self.session.is_end_of_generation(token):
            self.text.add_end()
            self._put_token(seen, partial(Token, token, "", now, version, "", thinking=self._thinking(),
                                          special=self.session.special_text(token) if named else "", **events))
            return "eos"
        piece = self._piece(token)
        special = self.session.special_text(token) if named and not piece else ""
        decoded, thought, shown = self.text.add(piece)
        if (thought or shown) and self.visible_at is None and not forced:
            self.visible_at = now
        if self.thought_at is None and self.text.splitter.opened and not self.text.splitter.thinking:
            self.thought_at = now
        self._put_token(seen, partial(Token, token, shown, now, version, decoded if named else "", reasoning=thought,
                                      thinking=self._thinking(), special=special, **events))
        return "stop" if self.text.scanner.stopped else None

    def _put_token(self, seen: Inspection, event: Callable[..., Token]) -> None:
        """The token's event, made with the inspector's figures: now, or when they come (`later`)."""
        if self.later is None:
            self.stream.put(event(prob=seen.prob, top=seen.top, pool=seen.pool))
        else:
            self.held = event

    def _flush(self) -> None:
        """The token event waiting for the inspector's figures, with them: out before any later event."""
        if self.held is not None and self.later is not None:
            seen = self.later.result()
            self.stream.put(self.held(prob=seen.prob, top=seen.top, pool=seen.pool))
        self.held = self.later = None

    def _guess_text(self, token: int) -> str:
        return self._piece(token).decode("utf-8", errors="replace") or self.session.special_text(token)

    def _thinking(self) -> bool:
        """Whether the token just taken belongs to the thinking, as far as is known now."""
        splitter = self.text.splitter
        return splitter.opened and splitter.answer_at is None

    def _no_room(self, params: SamplingParams) -> StopReason | None:
        if len(self.generated) >= params.max_tokens + self.allowance:
            return "length"
        if self._cached() + 1 >= self.session.n_ctx:
            return "context"
        return None

    def _cached(self) -> int:
        """Cache cells up to the row being drawn from: those of a draft's guesses past it are not the reply's yet."""
        session = self.session
        return len(session.tokens) - self.speculation.unverified(session)

    def _budget_spent(self, params: SamplingParams) -> bool:
        """Thinking off (or a budget) and the model is thinking past it, and the engine has not ended it yet.
        Counted from the start of the reply, where the thinking is."""
        budget = params.thinking_budget if self.request.thinking else 0
        return 0 <= budget <= len(self.generated) and self.text.splitter.thinking and not self.inserted

    def _end_thinking(self, sampler: Chain, version: int, params: SamplingParams) -> StopReason | None:
        """Write the template's end-of-thinking text as tokens, as if the model had; it then answers.
        With the inspector on, each carries what the model would have given it there."""
        top_n = self.request.top_logprobs
        for token in self.model.end_thinking:
            seen = self.session.inspect(token, top_n, params) if top_n else _UNSEEN
            sampler.accept(token)
            self.inserted += 1
            reason = self._take(token, time.perf_counter(), version, seen, inserted=True) or self._no_room(params)
            if reason is not None:
                return reason
            self.session.step(token)
        return None

    def _draw(self, sampler: Chain, params: SamplingParams) -> tuple[int, Seen, tuple[Stage, ...]]:
        """The next token from the chain, within the output format's grammar if there is one (past the
        thinking), and what the inspector and the X-ray record of it when they are on (nothing otherwise). The
        inspector's figures of a plain draw come later (`inspect_later`): computed while the next token decodes."""
        session, top_n = self.session, self.request.top_logprobs
        constraint = None if self.text.splitter.thinking else self.constraint
        replay = sampler.clone() if self.request.xray else None
        recent = tuple(sampler.recent) if top_n and "penalties" in sampler.stages else ()  # the pool's, before this
        if constraint is None:
            token = session.sample(sampler, inspected=bool(top_n))
        else:
            token = constraint.draw(sampler, session.logits())
        judge = constraint.judge if constraint is not None else None
        seen: Seen = _UNSEEN
        if top_n and judge is None and replay is None and self.overlaps_inspector:
            seen = session.inspect_later(token, top_n, params, recent)
        elif top_n:
            seen = session.inspect(token, top_n, params, recent, judge)
        if constraint is not None:
            constraint.accept(token)
        return token, seen, self._stages(replay, token) if replay is not None else ()

    def _stages(self, replay: Chain, token: int) -> tuple[Stage, ...]:
        """The X-ray of the token just drawn, from a clone of the chain taken before the draw."""
        try:
            return self.session.stage_reader.stages(replay, self.session.logits(), token)
        finally:
            replay.free()

    def _finish(self, reason: StopReason) -> None:
        text = self.text
        text.finish()
        kept = kept_token_count(text.ends, text.kept_chars)
        kept_text = self.prompt_text + text.raw[: text.ends[kept - 1]] if kept else self.prompt_text
        kept_tokens = self.prompt + self.generated[:kept]
        self.backend.transcript.replied((self.prompt_text, self.prompt), (kept_text, kept_tokens))
        self.stream.put(self._done(reason))

    def _done(self, reason: StopReason) -> Done:
        """The reply's last event, once its text is finished."""
        text = self.text
        constraint = self.constraint
        incomplete, note = constraint.verdict(reason == "eos", text.scanner.visible) if constraint else (False, "")
        note = "; ".join(filter(None, (note, self.stuck)))
        return Done(reason, text.scanner.visible, self.metrics(), tuple(self.prompt), incomplete,
                    text.reasoning, text.answer_from(), note, stop_sequence=text.scanner.matched)

    def _thinking_figures(self) -> tuple[int, float | None]:
        """The tokens the model drew while thinking, and how long it thought (None: it did not)."""
        if not self.text.splitter.opened or self.decode_at is None:
            return 0, None
        thought = self.text.answer_from() - min(len(self.forced), self.text.answer_from()) - self.inserted
        until = self.thought_at or self.last_at or self.decode_at
        return max(thought, 0), until - self.decode_at

    def metrics(self) -> TurnMetrics:
        first = self.visible_at or self.first_at
        restored = self.cached if self.restored else 0
        rate = self.restored.prefill_tok_s if self.restored else None
        reasoning_tokens, thinking_s = self._thinking_figures()
        drafter, control = self.speculation.drafter, self.speculation.control
        return TurnMetrics(
            prompt_tokens=len(self.context),
            cached_tokens=self.cached,
            completion_tokens=self.drawn,
            ttft_s=None if first is None else first - self.request.submitted_at,
            prefill_s=self.prefill_s,
            decode_s=0.0 if self.first_at is None or self.last_at is None else self.last_at - self.first_at,
            context_tokens=self._cached(),
            n_ctx=self.session.n_ctx,
            dropped_turns=self.dropped_turns,
            threads=self.session.threads.decode,
            restored_tokens=restored,
            restore_s=self.restored.seconds if self.restored else 0.0,
            queued_s=max(0.0, self.started_at - self.request.submitted_at),
            template_s=self.template_s,
            tokenize_s=self.tokenize_s,
            prefix_s=self.prefix_s,
            first_draw_s=0.0 if self.first_at is None or self.decode_at is None else self.first_at - self.decode_at,
            restore_avoided_s=restored / rate if rate else None,
            grammar_s=self.constraint.spent_s if self.constraint is not None else 0.0,
            reasoning_tokens=reasoning_tokens,
            thinking_s=thinking_s,
            draft_kind=("ngram" if isinstance(drafter, NgramDrafter) else "model") if drafter else "",
            drafted=control.drafted,
            draft_accepted=control.accepted,
            verifications=control.verifications,
            plain_ms_per_token=control.plain_ms,
            sampling_path=self.sampling_path,
        )
