"""Python's garbage collector while a reply streams.

A full collection walks every object the chat has made and can pause the event loop for hundreds of
milliseconds: mid-reply that is a visible stall. So a reply freezes everything made before it
(`gc.freeze`: collections skip it) and unfreezes when it ends. Freezing also shields the garbage made
before the reply (a new chat's old widgets, a finished reply's live Markdown): only a full collection
frees it, so one runs after each reply once the chat is quiet, or before the next reply freezes again.
Without it memory grew about 1 MB a turn.
"""

from __future__ import annotations

import gc

from textual.message_pump import MessagePump

from .textual_fixes import release_styles_caches

IDLE_COLLECT_S = 1.0  # the full collection after a reply waits for a quiet moment


class ReplyMemory:
    def __init__(self, owner: MessagePump) -> None:
        self.owner = owner
        self.streaming = False
        self._owed = False

    def reply_started(self) -> None:
        self._collect()
        gc.freeze()
        self.streaming = True

    def reply_ended(self) -> None:
        if not self.streaming:
            return
        self.streaming = False
        gc.unfreeze()
        self._owed = True
        self.owner.set_timer(IDLE_COLLECT_S, self._collect_when_idle)

    def _collect_when_idle(self) -> None:
        if not self.streaming:
            self._collect()

    def _collect(self) -> None:
        if self._owed:
            self._owed = False
            release_styles_caches()
            gc.collect()
