"""A reply drawn from its row of a batch that steps several sequences at once: the lab's columns (lab.py) and the
server's slots (slots.py). Each is a `Reply`, so it keeps the reply's every rule (its chain and seed, stop
strings, max tokens, output format, settings changed mid-reply, the thinking's budget, the inspector); what
differs is only where its logits come from (`session.row`, set by the loop that steps them) and that it
draws one token a step, never a draft."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import numpy as np

from ..base import Done, Request, Stage, StopReason, Stream
from ..params import SamplingParams
from .chain import Chain
from .grammar import FormatStuck
from .inspector import Inspection
from .reply import Host, Reply


class RowReply(Reply):
    """One reply in sequence `seq` of the shared cache; `draw_next` draws its next token from the current row.
    `with_prob`: every token carries its probability under the raw distribution, inspector on or off."""

    drafts = False
    overlaps_inspector = False
    with_prob = False
    seq = 0

    def __init__(self, backend: Host, request: Request, stream: Stream,
                 fitted: tuple[str, list[int], int] | None = None) -> None:
        super().__init__(backend, request, stream, fitted)
        self.sampler: Chain | None = None
        self.version = -1
        self.params = self.request.params.snapshot()[1]
        self.done: Done | None = None
        self.ending: list[int] = []  # the end of a thinking past its budget, still to write: a token a step
        self._probs: np.ndarray | None = None

    @property
    def position(self) -> int:
        """Where its last token goes in its sequence."""
        return len(self.context) + len(self.generated) - 1

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
            self.ending = list(self.model.end_thinking)
        inserted = bool(self.ending)
        stages: tuple[Stage, ...] = ()
        if inserted:  # as `_end_thinking` writes it, a token a step: the other rows go on meanwhile
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
        """The reply's draw; with `with_prob`, the token's probability even with the inspector off."""
        token, seen, stages = super()._draw(sampler, params)
        assert isinstance(seen, Inspection), "rows inspect at once (overlaps_inspector)"
        if self.with_prob and seen.prob is None:
            seen = replace(seen, prob=self._prob(token))
        return token, seen, stages

    def _seen(self, token: int, params: SamplingParams) -> Inspection:
        """What the inspector records of a token the engine writes: what the model gave it there."""
        top_n = self.request.top_logprobs
        if top_n:
            return self.session.inspect(token, top_n, params)
        return Inspection(self._prob(token) if self.with_prob else None, (), None)

    def _prob(self, token: int) -> float:
        """`token`'s probability under this row's raw distribution: one softmax, as `inspect` computes it."""
        logits = self.session.logits()
        if self._probs is None:
            self._probs = np.empty(len(logits), dtype=np.float32)
        probs = self._probs
        np.subtract(logits, logits.max(), out=probs)
        np.exp(probs, out=probs)
        return float(probs[token]) * (1.0 / float(probs.sum()))

    def end(self, reason: StopReason) -> None:
        """Its last event; its cells go back to the cache (`release`)."""
        self.text.finish()
        self.done = self._done(reason)
        self.release()
        self.stream.put(self.done)

    def release(self) -> None:
        if self.sampler is not None:
            self.sampler.free()
            self.sampler = None
