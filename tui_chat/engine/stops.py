"""Turning a stream of token bytes into visible text that never shows a stop sequence."""

from __future__ import annotations

import codecs


class StopScanner:
    """Holds back the tail of the text that could still grow into a stop sequence.

    `feed` returns the text that is now safe to show; once a stop sequence is complete,
    `stopped` is set, `visible` ends right before it and `matched` says which one it was.
    """

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.shown = 0
        self.stopped_at: int | None = None
        self.matched = ""

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    @property
    def visible(self) -> str:
        return self.text[: self.shown]

    def feed(self, piece: str) -> str:
        if self.stopped or not piece:
            return ""
        search_from = max(0, len(self.text) - max((len(s) for s in self.stops), default=0))
        self.text += piece
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            self.stopped_at, self.matched = min(hits, key=lambda hit: hit[0])
            return self._advance(self.stopped_at)
        return self._advance(len(self.text) - self._held_back())

    def flush(self) -> str:
        """At the end of a reply nothing more can complete a stop sequence: show the rest."""
        if self.stopped:
            return ""
        return self._advance(len(self.text))

    def _held_back(self) -> int:
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _advance(self, upto: int) -> str:
        upto = max(upto, self.shown)
        delta = self.text[self.shown : upto]
        self.shown = upto
        return delta


class Utf8Stream:
    """Decodes token bytes incrementally: a character split across two tokens appears whole."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, data: bytes) -> str:
        return self._decoder.decode(data)

    @property
    def pending(self) -> bool:
        """Whether the bytes so far end inside a character."""
        return bool(self._decoder.getstate()[0])

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
