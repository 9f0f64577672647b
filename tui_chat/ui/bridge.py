"""Engine events cross into the UI here, in batches, from a thread worker.

One UI message per token floods the event loop at high token rates. The forwarder posts at most one
batch every ~33 ms and never a second one before the UI has handled the first: when the UI is busy,
batches simply grow. A slow stream (a CPU's 40 tok/s: one token a batch) is posted every 150 ms instead:
every batch costs the UI a layout of the whole screen, and the UI shares the CPU with the engine, whose
threads all wait for one that the UI delays. The engine never waits for any of this (its event queue is
unbounded).

The forwarder and the UI never wait on each other for good. Every event has a number; the UI says how
many it has applied. A batch not acknowledged within `RESEND_AFTER_S` (lost, or its handler died) is
posted again together with what came since, and the UI applies only the events it has not applied yet,
so the final events always arrive while the screen runs, and a slow handler merely sees a repeat it skips.
"""

from __future__ import annotations

import threading
import time

from textual.message import Message
from textual.message_pump import MessagePump

from ..engine.base import Event, Stream

BATCH_INTERVAL_S = 0.033  # the shortest gap between two batches
SLOW_INTERVAL_S = 0.15  # the gap when a batch would hold fewer than FULL_BATCH events
FULL_BATCH = 16
# A flood (thousands of tokens a second: a GPU, a fast server) is shown ten times a second: each batch costs the UI
# a frame of the whole chat (the text moves up), and at 30 frames a second a key typed meanwhile waited 150-250 ms
# behind them in a real terminal (2 cores, 5,000 tok/s); the text is no less live at 10.
FLOOD_BATCH = 128
FLOOD_INTERVAL_S = 0.1
RESEND_AFTER_S = 2.0
_CHECK_ALIVE_S = 0.25


class Receipts:
    """How many of one job's events the UI has applied; written on the UI thread, read by the forwarder."""

    def __init__(self) -> None:
        self.applied = 0
        self.changed = threading.Condition()

    def wait_for(self, count: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.applied >= count, timeout)

    def applied_up_to(self, count: int) -> None:
        with self.changed:
            self.applied = max(self.applied, count)
            self.changed.notify_all()


class EngineBatch(Message):
    """Events of one engine job, in order, numbered from `first`. `job` says which request they answer.
    The handler takes `events` (only those not applied before) and must call `done()` when it has applied
    them, so the next batch can go out."""

    def __init__(self, job: object, events: list[Event], receipts: Receipts | None = None, first: int = 0) -> None:
        super().__init__()
        self.job = job
        self.receipts = receipts or Receipts()
        self._events = events
        self._first = first

    @property
    def events(self) -> list[Event]:
        """Read when handled: a batch posted again skips what an earlier, slower copy already applied."""
        return self._events[max(0, self.receipts.applied - self._first):]

    def done(self) -> None:
        self.receipts.applied_up_to(self._first + len(self._events))


def forward_events(stream: Stream, target: MessagePump, job: object) -> None:
    """Run in a thread worker: drain `stream` until its final event has been applied, posting batches to
    `target`. The first event after a quiet spell goes out at once, so TTFT on screen is not delayed."""
    receipts = Receipts()
    sent: list[Event] = []  # every event posted, so an unacknowledged batch can be posted again
    last_post = 0.0
    while True:
        fresh = stream.drain(timeout=0.5)  # empty once the final event was drained
        if not fresh and stream.finished and receipts.applied >= len(sent):
            return
        if fresh:
            fresh += _gathered(stream, last_post + BATCH_INTERVAL_S)
            if len(fresh) < FULL_BATCH:
                fresh += _gathered(stream, last_post + SLOW_INTERVAL_S)
            elif len(fresh) >= FLOOD_BATCH:
                fresh += _gathered(stream, last_post + FLOOD_INTERVAL_S)
        if not _acknowledged(receipts, len(sent), target):
            if not target.is_running:
                return
            fresh = sent[receipts.applied:] + fresh  # lost, or its handler died: post it again with the rest
            del sent[receipts.applied:]
        if fresh:
            first = len(sent)
            sent += fresh
            target.post_message(EngineBatch(job, fresh, receipts, first))
            last_post = time.monotonic()


def _gathered(stream: Stream, until: float) -> list[Event]:
    """The events that arrive until `until` (monotonic), or until the final one."""
    events: list[Event] = []
    while not stream.finished and (left := until - time.monotonic()) > 0:
        events += stream.drain(timeout=left)
    return events


def _acknowledged(receipts: Receipts, count: int, target: MessagePump) -> bool:
    """Wait until the UI has applied `count` events; False after RESEND_AFTER_S or once `target` stops."""
    deadline = time.monotonic() + RESEND_AFTER_S
    while not receipts.wait_for(count, _CHECK_ALIVE_S):
        if not target.is_running or time.monotonic() >= deadline:
            return False
    return True
