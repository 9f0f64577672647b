"""Model output is untrusted: before it reaches a terminal, control characters become visible escapes.

An ESC would let a reply move the cursor, retitle the window or write the clipboard (OSC 52);
bidi overrides would reorder what the user reads. Newlines and tabs stay as they are.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}" if ord(match.group()) > 0xFF else f"\\x{ord(match.group()):02x}"


def terminal_safe(text: str) -> str:
    return _UNSAFE.sub(_escape, text)
