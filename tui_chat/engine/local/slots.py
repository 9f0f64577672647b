"""Several requests at once (`tui-chat serve`): each in a slot of its own, all decoded together a token a step.

As llama.cpp's server does it: a slot is a sequence of the one cache, and it keeps what it last read after its
request ends, so a client that sends its conversation again, one turn longer, reads only the new part. A new
request takes the free slot whose cells share the longest prefix with its prompt (the least recently used where
none does). A request that comes while others are being written joins them at the next step: its prompt is
read in chunks inside the steps' batches, after the others' tokens (llama.cpp's server does the same), so they
go on a token a chunk instead of waiting for the whole read; then it draws from its row of each batch like them.
Each slot's reply is a `RowReply`, with every rule of a chat's reply; speculative drafting, the X-ray and the KV
cache on disk are the chat's, not the server's.

Up to MAX_SLOTS (16) slots, each a sequence of its own from FIRST_SLOT_SEQ on, all in the one unified cache
(llamacpp.py's N_SEQ_MAX): the sampling lab's column sequences and twelve more. Sharing the columns' is safe
because a backend that serves does nothing else: `tui-chat serve` asks it only for `generate_together` (embeddings
are read in a context of their own), and a chat's reply, the lab or the X-ray on the same backend would spoil the
slots' cells whatever their sequence numbers, since a chat's reply may clear the whole cache. Sequences of their
own would cost the context a larger output buffer (a row of logits per sequence: 1 MiB each on the starter) and
buy nothing. The scratch sequence and the conversation's (0) stay out of it. How many slots hold a request at once
is the server's to bound (`--parallel`, each request then in n_ctx / N); the engine bounds it by its batch too:
each generating slot puts a row in every step's batch, so no more slots are taken than the batch has rows
(`_admit`), and newcomers' prompt chunks fill what the generating rows leave (`_chunks`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

from ..base import EngineError, Error, Metrics, PromptProgress, Request, StopReason, Stream, TurnMetrics
from ..compare import MAX_SLOTS
from ..formats import FormatError
from ..params import SamplingParams
from ..prompts import PromptError
from .grammar import Constraint
from .llamacpp import FIRST_SLOT_SEQ, LlamaSession, PromptChunk
from .reply import METRICS_INTERVAL_S, Host
from .rows import RowReply


class ContextExceeded(EngineError):
    """The prompt leaves no room for a reply in the context a request may use."""


@dataclass(slots=True)
class _Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # exactly what its cells hold
    used_at: float = 0.0
    turn: SlotReply | None = None


class Slots:
    """Several requests at once (`Serving`), a collaborator of the backend: its loop is a job on the backend's
    worker, as long as any request is in flight or waiting."""

    def __init__(self, backend: Host) -> None:
        self.backend = backend
        self._slots = [_Slot(FIRST_SLOT_SEQ + index) for index in range(MAX_SLOTS)]
        self._arrivals: deque[tuple[Request, Stream, int]] = deque()
        self._arrivals_lock = threading.Lock()
        self._serving = False

    def generate_together(self, request: Request, room: int) -> Stream:
        """A reply decoded beside any others in flight, in at most `room` tokens of context; its events as
        `generate`'s. A prompt that leaves no room is an `Error` with code `context_length_exceeded`."""
        stream = Stream()
        with self._arrivals_lock:
            self._arrivals.append((request, stream, room))
            idle, self._serving = not self._serving, True
        if idle:
            self.backend.worker.post(self._serve)
        return stream

    def _serve(self) -> None:
        """The slot loop, on the worker thread, while any request is in flight or waiting: each step draws a token
        for every reply being written and reads the next chunk of the prompts waiting to be read, in one batch."""
        live: list[SlotReply] = []
        reading: list[SlotReply] = []
        next_metrics = 0.0
        try:
            while self._busy(live + reading):
                session = self.backend.loaded().session
                drawn = [(turn, token) for turn in live if (token := self._draw(turn)) is not None]
                reading += self._admit(session)
                chunks = self._chunks(reading, session.n_batch - len(drawn))
                live = [turn for turn, _ in drawn]
                if not drawn and not chunks:
                    continue
                ends = session.step_rows([(token, turn.position, turn.seq) for turn, token in drawn],
                                         [chunk for _, chunk in chunks])
                for row, (turn, token) in enumerate(drawn):
                    turn.row = row
                    turn.slot.tokens.append(token)
                for (turn, chunk), row in zip(chunks, ends, strict=True):
                    if turn.read(chunk, row):
                        reading.remove(turn)
                        live.append(turn)
                if (now := time.perf_counter()) >= next_metrics:
                    for turn in live:
                        turn.stream.put(Metrics(turn.metrics()))
                    next_metrics = now + METRICS_INTERVAL_S
                if time.monotonic() >= self.backend.threads.next_check and live:
                    live[0].retune_threads()
        except Exception as error:  # noqa: BLE001 - every request in flight ends in one line, the loop with them
            self._fail(live + reading, error if isinstance(error, EngineError) else
                       EngineError(f"internal error ({type(error).__name__}: {error})"))

    @staticmethod
    def _chunks(reading: list[SlotReply], room: int) -> list[tuple[SlotReply, PromptChunk]]:
        """The next part of each prompt being read that fits in `room` rows of this step's batch, first come
        first; a request stopped while its prompt was read ends here."""
        chunks: list[tuple[SlotReply, PromptChunk]] = []
        for turn in list(reading):
            if turn.stream.cancelled.is_set():
                reading.remove(turn)
                turn.end("cancelled")
            elif room > 0:
                chunk = turn.next_chunk(room)
                chunks.append((turn, chunk))
                room -= len(chunk.tokens)
        return chunks

    def _busy(self, live: list[SlotReply]) -> bool:
        """Whether the loop goes on; once nothing is in flight or waiting, it ends (a later arrival starts it)."""
        with self._arrivals_lock:
            self._serving = bool(live or self._arrivals)
            return self._serving

    @staticmethod
    def _draw(turn: SlotReply) -> int | None:
        if turn.stream.cancelled.is_set():
            turn.end("cancelled")
            return None
        turn.session.row = turn.row
        return turn.draw_next()

    def _admit(self, session: LlamaSession) -> list[SlotReply]:
        """Requests waiting, each into a free slot while there is one, its prompt to be read from the next step.
        No more slots are taken than a step's batch has rows: each generating one puts a row in every step."""
        admitted: list[SlotReply] = []
        while True:
            with self._arrivals_lock:
                free = [slot for slot in self._slots if slot.turn is None]
                if not free or len(self._slots) - len(free) >= session.n_batch or not self._arrivals:
                    return admitted
                request, stream, room = self._arrivals.popleft()
            try:
                turn = SlotReply(self.backend, request, stream, room)
            except ContextExceeded as error:
                stream.put(Error(str(error), code="context_length_exceeded"))
                continue
            except (EngineError, PromptError, FormatError) as error:
                stream.put(Error(str(error)))
                continue
            slot = max(free, key=lambda slot: (_shared(slot.tokens, turn.context), -slot.used_at))
            self._make_room(session, slot, turn)
            turn.begin(slot)
            admitted.append(turn)

    def _make_room(self, session: LlamaSession, slot: _Slot, turn: SlotReply) -> None:
        """Idle slots' cells go, least recently used first, while the cache could not hold this reply too."""
        reply = min(turn.params.max_tokens, turn.room - len(turn.context))
        need = len(turn.context) - _shared(slot.tokens, turn.context) + reply
        idle = sorted((other for other in self._slots if other.turn is None and other is not slot and other.tokens),
                      key=lambda other: other.used_at)
        while idle and sum(len(other.tokens) for other in self._slots) + need > session.n_ctx:
            emptied = idle.pop(0)
            session.trim_sequence(emptied.seq, 0)
            emptied.tokens.clear()

    def _fail(self, live: list[SlotReply], error: EngineError) -> None:
        """A failed step: the requests in flight and waiting end with it; the slots' cells are forgotten."""
        with self._arrivals_lock:
            waiting = [stream for _, stream, _ in self._arrivals]
            self._arrivals.clear()
            self._serving = False
        for stream in [turn.stream for turn in live] + waiting:
            stream.put(Error(str(error)))
        for slot in self._slots:
            slot.turn = None
            slot.tokens.clear()
            if (session := self.backend.session) is not None:
                session.trim_sequence(slot.seq, 0)


class SlotReply(RowReply):
    """One request's reply in a slot, within `room` tokens of context (prompt and reply)."""

    def __init__(self, backend: Host, request: Request, stream: Stream, room: int) -> None:
        self.room = room
        super().__init__(backend, request, stream)
        output = request.format
        opening = self.model.opens_thinking if not self.inside else frozenset()
        self.constraint = Constraint(self.session, output, opening) if output.constrained else None
        self.slot = _Slot(-1)
        self.row = -1  # its logits' row in the last step's batch
        self.read_started = 0.0

    def _fitted_prompt(self) -> tuple[str, list[int], int]:
        """The whole prompt (a server leaves no turn out): its text and tokens; an error where it leaves no room."""
        session, request = self.session, self.request
        if request.text_prompt is not None:
            text = request.text_prompt
        else:
            extra = self.format.options(request.thinking, request.tools)
            text = self.format.render(list(request.messages), session.bos_text, session.eos_text, extra)
        add_bos = session.add_bos and not (session.bos_text and text.startswith(session.bos_text))
        tokens = session.tokenize(text, add_bos=add_bos)
        if len(tokens) + 1 > self.room:
            raise ContextExceeded(f"the prompt takes {len(tokens):,} tokens and a request here may use {self.room:,} "
                                  "of context, prompt and reply together: send a shorter one")
        return text, tokens, 0

    def begin(self, slot: _Slot) -> None:
        """Into `slot`: its cells kept as far as they share the prompt; the rest is read a chunk a step
        (`next_chunk`, `read`)."""
        self.slot, slot.turn, self.seq = slot, self, slot.seq
        session, context = self.session, self.context
        keep = session.trim_sequence(slot.seq, min(_shared(slot.tokens, context), len(context) - 1))
        del slot.tokens[keep:]
        self.cached = keep
        self.read_started = time.perf_counter()
        self.stream.put(PromptProgress(0, len(context) - keep, 0.0, tuple(self.prompt)))

    def next_chunk(self, room: int) -> PromptChunk:
        """The next at most `room` tokens of its prompt still to read."""
        start = len(self.slot.tokens)
        tokens = self.context[start : start + room]
        return PromptChunk(self.seq, tokens, start, start + len(tokens) == len(self.context))

    def read(self, chunk: PromptChunk, row: int) -> bool:
        """`chunk` is in its cells now (`row`: its last row in the batch); True once the prompt is read, its first
        token to be drawn from that row at the next step."""
        self.slot.tokens.extend(chunk.tokens)
        elapsed = time.perf_counter() - self.read_started
        total = len(self.context) - self.cached
        self.stream.put(PromptProgress(len(self.slot.tokens) - self.cached, total, elapsed))
        if not chunk.last:
            return False
        self.prefill_s = elapsed
        self.decode_at = time.perf_counter()
        self.row = row
        return True

    def _no_room(self, params: SamplingParams) -> StopReason | None:
        if len(self.generated) >= params.max_tokens:
            return "length"
        return "context" if self.position + 2 > self.room else None

    def _cached(self) -> int:
        return len(self.slot.tokens)

    def metrics(self) -> TurnMetrics:
        return replace(super().metrics(), n_ctx=self.room)

    def release(self) -> None:
        """The sampler goes; the slot's cells stay, for the next request that starts as this one did."""
        super().release()
        self.slot.turn = None
        self.slot.used_at = time.monotonic()


def _shared(cached: list[int], prompt: list[int]) -> int:
    """How many tokens `prompt` starts with of `cached`."""
    count = 0
    for have, want in zip(cached, prompt, strict=False):
        if have != want:
            break
        count += 1
    return count

