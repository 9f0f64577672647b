"""Backends built in a real engine process by the link's tests (`test_link.py`): no model, so the link's own
behaviour — versions, answers that cannot cross, calls that never come back — is tested in a second."""

from __future__ import annotations

import threading
import time

from tui_chat.engine.base import Error, Stream


class Answering:
    """Answers `count_tokens` with the text's length, or, for the texts below, with what a bug would send."""

    info = None

    def load(self) -> Stream:
        stream = Stream()
        stream.put(Error("this backend has no model"))
        return stream

    def generate(self, request: object) -> Stream:
        return self.load()

    def count_tokens(self, text: str) -> object:
        if text == "a lock":
            return threading.Lock()  # cannot be pickled
        if text == "slowly":
            time.sleep(5)
        return len(text)

    def close(self) -> None:
        pass
