"""Engine events cross into the UI here, in batches, from a thread worker.

One UI message per token floods the event loop at high token rates. The forwarder posts at most one
batch every ~33 ms and never a second one before the UI has handled the first: when the UI is busy,
batches simply grow. The engine never waits for any of this (its event queue is unbounded).
"""

from __future__ import annotations

import threading
import time

from textual.message import Message
from textual.message_pump import MessagePump

from ..engine.base import Event, Stream

BATCH_INTERVAL_S = 0.033
_CHECK_ALIVE_S = 0.25


class EngineBatch(Message):
    """Events of one engine job, in order. `job` says which request they answer; the handler must
    call `done()` when it has applied them, so the next batch can go out."""

    def __init__(self, job: object, events: list[Event], handled: threading.Event) -> None:
        super().__init__()
        self.job = job
        self.events = events
        self._handled = handled

    def done(self) -> None:
        self._handled.set()


def forward_events(stream: Stream, target: MessagePump, job: object) -> None:
    """Run in a thread worker: drain `stream` until its final event, posting batches to `target`.

    The first event after a quiet spell goes out at once, so TTFT on screen is not delayed.
    """
    handled = threading.Event()
    handled.set()
    last_post = 0.0
    pending: list[Event] = []
    while True:
        if pending:
            due = last_post + BATCH_INTERVAL_S - time.monotonic()
            if due > 0 and not stream.finished:
                time.sleep(due)
            while not handled.wait(_CHECK_ALIVE_S):
                if not target.is_running:
                    return
            pending += stream.drain(timeout=0)
            handled.clear()
            target.post_message(EngineBatch(job, pending, handled))
            pending = []
            last_post = time.monotonic()
        if stream.finished:
            return
        pending = stream.drain(timeout=0.5)
