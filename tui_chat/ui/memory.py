"""Python's garbage collector while a reply streams.

A full collection walks every object the chat has made and can pause the event loop for hundreds of
milliseconds: mid-reply that is a visible stall. So a reply freezes everything made before it
(`gc.freeze`: collections skip it) and unfreezes when it ends. While it streams, the collector's own
schedule is off (the reply's thousands of new objects would still trigger full collections of
everything the reply made so far): only the youngest generation is collected, every `YOUNG_EVERY_S`,
which costs in proportion to what is new (at 5,000 tok/s into a long chat, every 0.1 s: 4 ms a collection,
at times 40; every 0.025 s: about 1, at most 12, and less in all). The collector stays off until the full
collection, once the chat is quiet after the reply, so the reply's finish is not paused by one either.
Freezing also shields the garbage made before the reply (a new chat's old widgets, a finished reply's live
Markdown): only a full collection frees it, so one runs after each reply once the chat is quiet, or before
the next reply freezes again.
Without it memory grew about 1 MB a turn.
"""

from __future__ import annotations

import gc

from textual.message_pump import MessagePump
from textual.timer import Timer

from .textual_fixes import release_styles_caches

IDLE_COLLECT_S = 1.0  # the full collection after a reply waits for a quiet moment
YOUNG_EVERY_S = 0.025


class ReplyMemory:
    def __init__(self, owner: MessagePump) -> None:
        self.owner = owner
        self._owed = False
        self._young: Timer | None = None  # collecting the youngest generation: while a reply is written

    def reply_started(self) -> None:
        """A collection still owed waits for the next quiet moment: run now, it would stall the reply's start."""
        if self._young is not None:
            return
        gc.freeze()
        gc.disable()
        self._young = self.owner.set_interval(YOUNG_EVERY_S, lambda: gc.collect(0))

    def reply_ended(self) -> None:
        if self._young is None:
            return
        self._young.stop()
        self._young = None
        self._owed = True
        self.owner.set_timer(IDLE_COLLECT_S, self._collect_when_idle)

    def close(self) -> None:
        """The screen is going: the collector back to its own schedule (a test process runs many apps)."""
        if self._young is not None:
            self._young.stop()
        if self._young is not None or self._owed:
            self._young, self._owed = None, False
            gc.unfreeze()
            gc.enable()

    def _collect_when_idle(self) -> None:
        if self._young is None:
            self._collect()

    def _collect(self) -> None:
        if self._owed:
            self._owed = False
            gc.unfreeze()
            gc.enable()
            release_styles_caches()
            gc.collect()
