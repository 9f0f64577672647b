"""The sampling lab: one prompt, several sampling settings (columns), decoded together in one context.

The prompt is read once, into the conversation's sequence (0). Each column's sequence starts as a copy of it
(llama.cpp tags the cells, it copies nothing), and each step decodes one token of every column still going in
one `llama_decode`, a batch row each. A column is a `RowReply` of its own, so it has the reply's every rule (its
chain, seed, stop strings, max tokens, output format, settings that change mid-reply, the inspector and the
X-ray), drawing from its row; one that stops frees its cells and the others go on. The conversation's
sequence is left holding exactly the prompt, so the next reply reuses it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from ..base import (
    EngineError,
    LabDone,
    Metrics,
    Request,
    StopReason,
    Stream,
    TurnMetrics,
)
from ..compare import MAX_COLUMNS, ColumnStream
from ..params import LiveParams, SamplingParams
from .grammar import Constraint
from .llamacpp import FIRST_COLUMN_SEQ
from .reply import METRICS_INTERVAL_S, Host, Reply
from .rows import RowReply


class Lab:
    """The sampling lab (`Comparing`), a collaborator of the backend: its runs are jobs on the backend's worker."""

    def __init__(self, backend: Host) -> None:
        self.backend = backend

    def compare(self, request: Request, columns: Sequence[LiveParams]) -> Stream:
        """A reply for each column of settings, decoded together over one read of the prompt. Each column's
        events come as `ColumnEvent`s, then one `LabDone` (or an `Error`)."""
        make = partial(LabReply, columns=tuple(columns))
        return self.backend.worker.submit(lambda stream: self.backend.write(request, stream, make))


class LabReply(Reply):
    """The prompt's fitting, restoring from disk and reading are the reply's (`Reply`); the decode is the lab's."""

    drafts = False

    def __init__(self, backend: Host, request: Request, stream: Stream, columns: Sequence[LiveParams]) -> None:
        if not 1 <= len(columns) <= MAX_COLUMNS:
            raise EngineError(f"the lab compares 1 to {MAX_COLUMNS} settings side by side (got {len(columns)})")
        if request.forced:
            raise EngineError("the lab writes replies from the prompt, not a branch of one")
        super().__init__(backend, request, stream)
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
        session, governor, worker = self.session, self.backend.threads, self.backend.worker
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
                if worker.quick_waiting:  # an X-ray between two steps: it reads its own logits, in the scratch sequence
                    session.row = -1
                    worker.run_quick()
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
        self.backend.transcript.last_prompt = (self.prompt_text, self.prompt)
        self.stream.put(LabDone(tuple(column.done for column in self.columns if column.done is not None), self.reads))


class _Column(RowReply):
    """One column: a reply with its own settings, in its own sequence, drawn from its row of the lab's batch."""

    with_prob = True  # the lab marks how surprised each column was by what it drew

    def __init__(self, lab: LabReply, index: int, live: LiveParams) -> None:
        super().__init__(lab.backend, replace(lab.request, params=live), ColumnStream(lab.stream, index),
                         (lab.prompt_text, lab.prompt, lab.dropped_turns))
        self.lab = lab
        self.seq = FIRST_COLUMN_SEQ + index
        self.shown = True  # each token's own text goes with it: the lab shows where columns part
        self.room = self.params.max_tokens  # the cells the lab set aside for it

    def start(self) -> None:
        """After the lab read the prompt: its figures, and a sequence that shares the prompt's cells."""
        lab = self.lab
        self.cached, self.restored, self.prefill_s, self.decode_at = lab.cached, lab.restored, lab.prefill_s, \
            lab.decode_at
        self.text = self._new_text(self.params.stop + self.implicit_stops)
        self.session.share_prompt(self.seq)

    def _no_room(self, params: SamplingParams) -> StopReason | None:
        """Max tokens raised mid-reply past what the lab set aside: the column's context is full."""
        return super()._no_room(params) or ("context" if len(self.generated) >= self.room else None)

    def metrics(self) -> TurnMetrics:
        return replace(super().metrics(), context_tokens=len(self.context) + len(self.generated))

    def release(self) -> None:
        super().release()
        self.session.drop_sequence(self.seq)
