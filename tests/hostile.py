"""Untrusted text at its worst, and how each piece must look once it reaches a screen.

Rich/Textual markup must show exactly as written (it can be honest text: `arr[i]`, a question about
Rich); terminal control sequences and bidi overrides must show as visible escapes.
"""

from __future__ import annotations

import re

MARKUP = ("[bold red]x[/]", "[link=https://evil]click[/link]", "[@click=app.quit]quit[/]", "arr[i]")
CONTROLS = {
    "\x1b[2J": r"\x1b[2J",  # CSI: clear the screen
    "\x1b]0;pwned\x07": r"\x1b]0;pwned\x07",  # OSC 0: the window title
    "\x1b]52;c;ZXZpbA==\x07": r"\x1b]52;c;ZXZpbA==\x07",  # OSC 52: write the clipboard
    "\x1b]8;;https://evil\x07x\x1b]8;;\x07": r"\x1b]8;;https://evil\x07x\x1b]8;;\x07",  # OSC 8: a hyperlink
    "\u202egnp.exe": r"\u202egnp.exe",  # right-to-left override: reads as "exe.png"
    "a\x00b": r"a\x00b",
}
HOSTILE = " ".join([*MARKUP, *CONTROLS])
SHOWN = (*MARKUP, *CONTROLS.values())
"""Each piece of HOSTILE as it must appear on screen."""

FILE_SAFE = HOSTILE.replace("/", "∕").replace("\x00", "")
"""HOSTILE as a file name can carry it (no slash, no NUL): "[bold red]x[∕]" still opens a style if parsed."""

CANDIDATES = ("[b]x[/]", "\x1b]0;t\x07", "\u202ex")
"""Short alternatives a server offers for every token: the inspector shows them in 16 columns."""
SHOWN_CANDIDATES = ('"[b]x[/]"', r'"\x1b]0;t\x07"', r'"\u202ex"')

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_APP_OWN = re.compile(r"\x1b\[[0-9;:]*[mH]|\x1b\[\?\d+[hl]")  # colours, cursor moves, synchronized output


def unsafe_in(terminal_bytes: str) -> list[str]:
    """What in a terminal's input could act rather than show: anything but the app's own CSI sequences."""
    rest = _APP_OWN.sub("", terminal_bytes)
    return re.findall(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI_CONTROLS}]", rest)
