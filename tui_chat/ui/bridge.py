"""Engine events cross into the UI here, in batches, from a thread worker.

One UI message per token blocks or floods the event loop at high token rates; one per ~33 ms
keeps the screen live while the model runs at full speed (the engine never waits for the UI).
"""

from __future__ import annotations

import time

from textual.message import Message
from textual.message_pump import MessagePump

from ..engine.base import Event, Stream

BATCH_INTERVAL_S = 0.033


class EngineBatch(Message):
    """Events of one engine job, in order. `job` says which request they answer."""

    def __init__(self, job: object, events: list[Event]) -> None:
        super().__init__()
        self.job = job
        self.events = events


def forward_events(stream: Stream, target: MessagePump, job: object) -> None:
    """Run in a thread worker: drain `stream` until its final event, posting batches to `target`.

    The first event after a quiet spell goes out at once (so TTFT on screen is not delayed);
    the rest are gathered for up to BATCH_INTERVAL_S.
    """
    last_post = 0.0
    while not stream.finished:
        events = stream.drain(timeout=0.5)
        if not events:
            continue
        delay = last_post + BATCH_INTERVAL_S - time.monotonic()
        if delay > 0 and not stream.finished:
            time.sleep(delay)
            events += stream.drain(timeout=0)
        target.post_message(EngineBatch(job, events))
        last_post = time.monotonic()
