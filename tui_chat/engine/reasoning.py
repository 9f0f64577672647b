"""A reasoning model's reply as it streams: its thinking split from its answer, token by token.

A model thinks once, at the start of its reply, between its template family's markers (prompts.py's
`ThinkingSyntax`): either it opens them itself, or the prompt already did (the reply starts inside).
The markers, and the whitespace around the thinking, are in neither part; stop sequences apply to the
answer only. The model's own text, markers included, stays whole (`ReplyText.raw`): it is what the
KV cache holds, so the next turn can reuse it.
"""

from __future__ import annotations

from typing import Literal

from .prompts import ThinkingSyntax
from .stops import StopScanner, Utf8Stream

State = Literal["start", "thinking", "separator", "answer"]


class ThinkingSplitter:
    """Text in, (thinking, answer) out, holding back what could still be a marker.

    "start": the reply may open its thinking (leading whitespace, then a prefix of the open marker, waits);
    "thinking": until the close marker; "separator": the whitespace after it; "answer": the rest.
    """

    def __init__(self, syntax: ThinkingSyntax, inside: bool = False) -> None:
        self.syntax = syntax
        self.state: State = "thinking" if inside else "start"
        self.opened = inside  # the reply has (or had) a thinking block
        self.answer_at: int | None = None  # where the answer starts in the text fed
        self._held = ""  # the end of the text fed, not yet placed (always a suffix of it)
        self._blank = ""  # whitespace at the end of the thinking shown so far, shown once more follows
        self._shown_thought = False
        self._fed = 0

    @property
    def thinking(self) -> bool:
        return self.state == "thinking"

    def feed(self, text: str) -> tuple[str, str]:
        self._fed += len(text)
        if self.state == "answer":
            return "", text
        self._held += text
        return self._place(final=False)

    def flush(self) -> tuple[str, str]:
        """The reply ended: nothing more can complete a marker."""
        return self._place(final=True)

    def _place(self, final: bool) -> tuple[str, str]:
        thought: list[str] = []
        while True:
            held = self._held
            if self.state == "start":
                body = held.lstrip()
                if body.startswith(self.syntax.open):
                    self.state, self.opened, self._held = "thinking", True, body[len(self.syntax.open) :]
                    continue
                if not final and (not body or self.syntax.open.startswith(body)):
                    return "", ""
                return "", self._answer(held)
            if self.state == "thinking":
                at = held.find(self.syntax.close)
                if at >= 0:
                    thought.append(self._thought(held[:at]))
                    self.state, self._held, self._blank = "separator", held[at + len(self.syntax.close) :], ""
                    continue
                keep = 0 if final else _partial(held, self.syntax.close)
                thought.append(self._thought(held[: len(held) - keep]))
                self._held = held[len(held) - keep :]
                return "".join(thought), ""
            body = held.lstrip()  # separator: the whitespace after the close marker is in neither part
            self._held = ""
            return "".join(thought), self._answer(body) if body else ""

    def _answer(self, text: str) -> str:
        self.state, self.answer_at, self._held = "answer", self._fed - len(text), ""
        return text

    def _thought(self, text: str) -> str:
        """Thinking shown without the whitespace around it: leading dropped, trailing held until more comes."""
        if not self._shown_thought:
            text = text.lstrip()
        text = self._blank + text
        body = text.rstrip()
        self._blank = text[len(body) :]
        self._shown_thought = self._shown_thought or bool(body)
        return body


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class ReplyText:
    """A reply's text as its tokens come: whole UTF-8 characters, the thinking split off, the answer under
    its stop sequences. `raw` is everything the model wrote; `ends[i]` raw's length after token i (None
    while a character is incomplete, or for a token with no text)."""

    def __init__(self, splitter: ThinkingSplitter, scanner: StopScanner) -> None:
        self.splitter = splitter
        self.scanner = scanner
        self.utf8 = Utf8Stream()
        self.raw = ""
        self.ends: list[int | None] = []
        self.reasoning = ""

    def add(self, data: bytes) -> tuple[str, str, str]:
        """One token's bytes: (its decoded text, the thinking and the answer they made visible)."""
        decoded = self.utf8.decode(data)
        self.raw += decoded
        thought, answer = self.splitter.feed(decoded)
        self.reasoning += thought
        shown = self.scanner.feed(answer)
        self.ends.append(None if self.utf8.pending else len(self.raw))
        return decoded, thought, shown

    def add_end(self) -> None:
        """An end-of-generation token: no text."""
        self.ends.append(None)

    def finish(self) -> None:
        """The reply is over: what was held back is placed (a stop sequence cut stays cut)."""
        rest = self.utf8.flush()
        self.raw += rest
        thought, answer = self.splitter.feed(rest)
        more_thought, more_answer = self.splitter.flush()
        self.reasoning += thought + more_thought
        self.scanner.feed(answer + more_answer)
        self.scanner.flush()

    @property
    def kept_chars(self) -> int:
        """How much of `raw` the conversation holds: up to the end of the visible answer (a stop sequence and
        what followed it are cut), all of it when the reply never got past its thinking."""
        if self.splitter.answer_at is None:
            return len(self.raw)
        return self.splitter.answer_at + len(self.scanner.visible)

    def answer_from(self) -> int:
        """How many of the reply's tokens are its thinking's: those before the first one with answer text
        (all of them while it thinks; none when it did not think)."""
        if not self.splitter.opened:
            return 0
        start = self.splitter.answer_at
        if start is None:
            return len(self.ends)
        return next(i for i, end in enumerate(self.ends) if end is not None and end > start)
