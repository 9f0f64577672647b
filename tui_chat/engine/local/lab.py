"""The sampling lab: one prompt, several sampling settings (columns), decoded together in one context.

The prompt is read once, into the conversation's sequence (0). Each column's sequence starts as a copy of it
(llama.cpp tags the cells, it copies nothing), and each step decodes one token of every column still going in
one `llama_decode`, a batch row each. A column is a `_Turn` of its own, so it has the reply's every rule (its
chain, seed, stop strings, max tokens, output format, settings that change mid-reply, the inspector and the
X-ray), drawing from its row; one that stops frees its cells and the others go on. The conversation's
sequence is left holding exactly the prompt, so the next reply reuses it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import numpy as np

from ..base import (
    Done,
    EngineError,
    LabDone,
    Metrics,
    Request,
    Stage,
    StopReason,
    Stream,
    TurnMetrics,
)
from ..compare import MAX_COLUMNS, ColumnStream
from ..params import LiveParams, SamplingParams
from ..prompts import PromptFormat
from .chain import Chain
from .grammar import Constraint, FormatStuck
from .llama import METRICS_INTERVAL_S, LlamaBackend, _Turn
from .llamacpp import FIRST_COLUMN_SEQ, Inspection, LlamaSession


class LlamaLab(LlamaBackend):
    """The in-process backend with the sampling lab (`Comparing`)."""

    def compare(self, request: Request, columns: Sequence[LiveParams]) -> Stream:
        """A reply for each column of settings, decoded together over one read of the prompt. Each column's
        events come as `ColumnEvent`s, then one `LabDone` (or an `Error`)."""
        stream = Stream()
        make = partial(LabTurn, columns=tuple(columns))
        self._jobs.put(lambda: self._guarded(stream, lambda: self._generate(request, stream, make)))
        return stream


class LabTurn(_Turn):
    """The prompt's fitting, restoring from disk and reading are the reply's (`_Turn`); the decode is the lab's."""

    drafts = False

    def __init__(self, backend: LlamaBackend, session: LlamaSession, prompt_format: PromptFormat, request: Request,
                 stream: Stream, columns: Sequence[LiveParams]) -> None:
        if not 1 <= len(columns) <= MAX_COLUMNS:
            raise EngineError(f"the lab compares 1 to {MAX_COLUMNS} settings side by side (got {len(columns)})")
        if request.forced:
            raise EngineError("the lab writes replies from the prompt, not a branch of one")
        super().__init__(backend, session, prompt_format, request, stream)
        self.probs = np.empty(session.n_vocab, dtype=np.float32)  # the columns' softmax buffer, one at a time
        self.columns = [_Column(self, index, live) for index, live in enumerate(columns)]
        self.reads = 0

    def run(self) -> None:
        self._check_room()
        output = self.request.format
        for column in self.columns:
            column.constraint = Constraint(self.session, output) if output.constrained else None
        self._write()

    def _check_room(self) -> None:
        """Every column's max tokens must fit beside the one copy of the prompt: said before anything is read."""
        n_ctx, prompt = self.session.n_ctx, len(self.context)
        wanted = [column.request.params.snapshot()[1].max_tokens for column in self.columns]
        if prompt + sum(wanted) > n_ctx:
            count = len(wanted)
            each = max(n_ctx - prompt, 0) // count
            raise EngineError(
                f"{count} columns of up to {max(wanted):,} tokens after this {prompt:,}-token prompt need "
                f"{prompt + sum(wanted):,} tokens of context, and it holds {n_ctx:,}: use fewer columns, "
                f"max tokens of at most {each:,} each, or a larger context (--n-ctx)")

    def _prefill(self) -> None:
        super()._prefill()
        self.reads += 1

    def _decode(self) -> StopReason:
        """Every live column draws from its row, then one batch steps them all. Returns why the columns still
        going (none, unless cancelled) end."""
        session, governor, quick = self.session, self.backend.threads, self.backend._quick
        for column in self.columns:
            column.start()
        live = list(self.columns)
        stepped = False  # before the first step every column draws from the prompt's last logits
        next_metrics = 0.0
        try:
            while live:
                if self.stream.cancelled.is_set():
                    return "cancelled"
                drawn: list[tuple[_Column, int]] = []
                for row, column in enumerate(live):
                    session.row = row if stepped else -1
                    token = column.draw_next()
                    if token is not None:
                        drawn.append((column, token))
                live = [column for column, _ in drawn]
                if not live:
                    break
                if quick:  # an X-ray between two steps: it reads its own logits, in the scratch sequence
                    session.row = -1
                    self.backend._run_quick()
                session.step_rows([(token, column.position, column.seq) for column, token in drawn])
                stepped = True
                now = time.perf_counter()
                if now >= next_metrics:
                    for column in live:
                        column.stream.put(Metrics(column.metrics()))
                    next_metrics = now + METRICS_INTERVAL_S
                if time.monotonic() >= governor.next_check:
                    self.retune_threads()
        finally:
            session.row = -1
            for column in live:
                column.release()
        return "cancelled"

    def _finish(self, reason: StopReason) -> None:
        for column in self.columns:
            if column.done is None:
                column.end(reason)
        self.backend._last_prompt = (self.prompt_text, self.prompt)
        self.stream.put(LabDone(tuple(column.done for column in self.columns if column.done is not None), self.reads))


class _Column(_Turn):
    """One column: a reply with its own settings, in its own sequence, drawn from its row of the lab's batch."""

    drafts = False

    def __init__(self, lab: LabTurn, index: int, live: LiveParams) -> None:
        super().__init__(lab.backend, lab.session, lab.format, replace(lab.request, params=live),
                         ColumnStream(lab.stream, index), (lab.prompt_text, lab.prompt, lab.dropped_turns))
        self.lab = lab
        self.seq = FIRST_COLUMN_SEQ + index
        self.shown = True  # each token's own text goes with it: the lab shows where columns part
        self.sampler: Chain | None = None
        self.version = -1
        self.params = live.snapshot()[1]
        self.room = self.params.max_tokens  # the cells the lab set aside for it
        self.done: Done | None = None
        self.ending: list[int] = []  # the end of a thinking past its budget, still to write: a token a step

    @property
    def position(self) -> int:
        """Where its last token goes in its sequence."""
        return len(self.context) + len(self.generated) - 1

    def start(self) -> None:
        """After the lab read the prompt: its figures, and a sequence that shares the prompt's cells."""
        lab = self.lab
        self.cached, self.restored, self.prefill_s, self.decode_at = lab.cached, lab.restored, lab.prefill_s, \
            lab.decode_at
        self.text = self._new_text(self.params.stop + self.implicit_stops)
        self.session.share_prompt(self.seq)

    def draw_next(self) -> int | None:
        """Its next token from the session's row, taken into the reply; None when the reply ended with it."""
        live = self.request.params
        if live.version != self.version or self.sampler is None:
            self.version, self.params = live.snapshot()
            if self.sampler is not None:
                self.sampler.free()
            seed = self.params.seed if self.params.seed >= 0 else random.getrandbits(32)
            self.sampler = self.session.chains.build(self.params, seed, [*self.context, *self.generated])
            self.text.scanner.stops = self.params.stop + self.implicit_stops
        if len(self.generated) >= self.params.max_tokens:
            self.end("length")
            return None
        if self._budget_spent(self.params):
            self.ending = list(self.backend._end_thinking)
        inserted = bool(self.ending)
        stages: tuple[Stage, ...] = ()
        if inserted:  # as `_end_thinking` writes it, a token a step: the other columns go on meanwhile
            token = self.ending.pop(0)
            seen = self._seen(token, self.params)
            self.sampler.accept(token)
            self.inserted += 1
        else:
            try:
                token, seen, stages = self._draw(self.sampler, self.params)
            except FormatStuck as stuck:
                self.stuck = str(stuck)
                self.end("format")
                return None
            self.first_at = self.first_at or time.perf_counter()
            self.drawn += 1
        now = self.last_at = time.perf_counter()
        reason = self._take(token, now, self.version, seen, stages, inserted=inserted) or self._no_room(self.params)
        if reason is not None:
            self.end(reason)
            return None
        return token

    def _draw(self, sampler: Chain, params: SamplingParams) -> tuple[int, Inspection, tuple[Stage, ...]]:
        """The reply's draw; with the inspector off, the token's probability still."""
        token, seen, stages = super()._draw(sampler, params)
        return token, seen if seen.prob is not None else replace(seen, prob=self._prob(token)), stages

    def _seen(self, token: int, params: SamplingParams) -> Inspection:
        """What the inspector records of a token the engine writes: what the model gave it there."""
        top_n = self.request.top_logprobs
        return self.session.inspect(token, top_n, params) if top_n else Inspection(self._prob(token), (), None)

    def _prob(self, token: int) -> float:
        """`token`'s probability under this row's raw distribution: one softmax, as `inspect` computes it."""
        logits, probs = self.session.logits(), self.lab.probs
        np.subtract(logits, logits.max(), out=probs)
        np.exp(probs, out=probs)
        return float(probs[token]) * (1.0 / float(probs.sum()))

    def _no_room(self, params: SamplingParams) -> StopReason | None:
        """Max tokens raised mid-reply past what the lab set aside: the column's context is full."""
        return super()._no_room(params) or ("context" if len(self.generated) >= self.room else None)

    def metrics(self) -> TurnMetrics:
        return replace(super().metrics(), context_tokens=len(self.context) + len(self.generated))

    def end(self, reason: StopReason) -> None:
        """Its last event; its cells go back to the cache."""
        self.text.finish()
        self.done = self._done(reason)
        self.release()
        self.stream.put(self.done)

    def release(self) -> None:
        if self.sampler is not None:
            self.sampler.free()
            self.sampler = None
        self.session.drop_sequence(self.seq)
