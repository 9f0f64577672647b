"""Model output is untrusted: before it reaches a terminal, control characters become visible escapes.

An ESC would let a reply move the cursor, retitle the window (OSC 0), write the clipboard (OSC 52)
or hide a link target behind its text (OSC 8); C1 controls (U+0080-U+009F) are the same commands
in one byte, and NUL or DEL can confuse what reads the terminal. Bidi overrides and isolates would
reorder what the user reads ("\u202egnp.exe" shows as "exe.png"); the invisible bidi marks go too,
since text a user must trust should not carry invisible direction changes, and a legitimate mark
costs only a visible `\\u200f`. Newlines and tabs stay as they are.

Everything becomes `\\xNN` or `\\uNNNN`, so a user can see and report exactly what was sent. This
runs on every streamed token: one regex pass, about 0.2 µs for a clean token.

Rich/Textual markup is a separate matter: widgets take untrusted text as `Content(...)`/`Text(...)`,
never as markup, and notifications are made literal by the app (see `ChatApp.notify`).
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}" if ord(match.group()) > 0xFF else f"\\x{ord(match.group()):02x}"


def terminal_safe(text: str) -> str:
    return _UNSAFE.sub(_escape, text)


# Emoji sequences: Rich measures one as a single 2-cell grapheme, as grapheme-aware terminals draw it, but
# many terminals measure by code point. tmux 3.3a draws "⚠️" in 1 cell where Rich counts 2, "👍🏽" in 4 where
# Rich counts 2, a lone skin tone in 2 where Rich counts 0 (its cursor, measured); a terminal that measures
# by code point draws a ZWJ family in 6. The row they disagree on is drawn shifted, over the panel's edge.
# Without their joiners, emoji-style selectors and skin tones, the parts measure alike in Rich and anywhere.
_DISPUTED = re.compile("[\u200d\ufe0f\U0001f3fb-\U0001f3ff]")


def screen_safe(text: str) -> str:
    """Untrusted text for a widget that shares its rows with others: `terminal_safe`, and emoji sequences
    drawn as their parts (👨‍👩‍👧 as three people, 👍🏽 without its skin tone), so Textual and the terminal agree
    on every cell of the row. Only what is drawn: the text copied, saved or sent keeps them."""
    return _DISPUTED.sub("", terminal_safe(text))


def quoted(text: str) -> str:
    """A piece of text as a quoted literal on one line (a token, a stop sequence): backslashes, line breaks
    and tabs escaped as in Python, so spaces and newlines are visible; then made terminal-safe."""
    escaped = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return f'"{terminal_safe(escaped)}"'


# Whole terminal commands, so a paste loses "ESC ] 0 ; title BEL", not just its ESC and BEL.
_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]")


def without_controls(text: str) -> str:
    """Text typed or pasted to be sent: terminal commands and unsafe characters are dropped, not
    escaped, since the message box draws what it holds and a model gains nothing from them."""
    text = _SEQUENCE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return _UNSAFE.sub("", text)
