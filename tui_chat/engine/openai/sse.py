"""Server-sent events, as OpenAI-compatible servers stream them: lines in, each event's data out.

Pure and stateful only in the event being assembled, so it can be fed any line sequence (and fuzzed).
Follows the WHATWG event-stream rules for what we use: `data:` fields joined by newlines, a blank line
ends an event, lines starting with `:` are comments (keep-alive pings), other fields are ignored.
"""

from __future__ import annotations


class SseDecoder:
    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        """Take one line without its line ending; returns the event's data when the line ends one."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        return None

    def flush(self) -> str | None:
        """The data of an event the stream ended without a blank line after (servers often do)."""
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return data
