"""terminal_safe: what could act on a terminal becomes a visible escape; everything else is left alone."""

from __future__ import annotations

import pytest

from hostile import HOSTILE, SHOWN, unsafe_in
from tui_chat.safetext import terminal_safe, without_controls


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x00", r"\x00"),
    ("\x07", r"\x07"),  # BEL ends an OSC
    ("\x08", r"\x08"),
    ("\r", r"\x0d"),  # would move back and overwrite the line
    ("\x1b", r"\x1b"),
    ("\x7f", r"\x7f"),
    ("\x9b", r"\x9b"),  # one-byte CSI
    ("\x9d", r"\x9d"),  # one-byte OSC
    ("\u202a", r"\u202a"), ("\u202b", r"\u202b"), ("\u202c", r"\u202c"), ("\u202d", r"\u202d"),
    ("\u202e", r"\u202e"),
    ("\u2066", r"\u2066"), ("\u2067", r"\u2067"), ("\u2068", r"\u2068"), ("\u2069", r"\u2069"),
    ("\u200e", r"\u200e"), ("\u200f", r"\u200f"), ("\u061c", r"\u061c"),  # invisible marks
])
def test_each_control_becomes_a_visible_escape(raw, shown):
    assert terminal_safe(f"a{raw}b") == f"a{shown}b"


@pytest.mark.parametrize("text", [
    "line one\n\tindented",
    "[bold red]x[/] [@click=app.quit]quit[/] arr[i]",  # markup is not this function's business
    "שלום עולם · مرحبا",  # right-to-left text needs no control characters
    "café · 東京 · 👩\u200d💻 · e\u0301",  # zero-width joiner and combining marks are part of the text
    "\u00a0non-breaking\u00a0space and the ¢ sign",  # Latin-1 printables next to the C1 range
])
def test_printable_text_is_left_alone(text):
    assert terminal_safe(text) == text


def test_the_hostile_fixture_shows_every_piece_and_keeps_no_control():
    safe = terminal_safe(HOSTILE)
    assert all(piece in safe for piece in SHOWN)
    assert unsafe_in(safe) == []
    assert terminal_safe(safe) == safe, "escaping twice changes nothing"


def test_escaping_token_by_token_equals_escaping_the_whole():
    """Replies are escaped per token as they stream: a sequence split over tokens is still caught."""
    for cut in range(len(HOSTILE) + 1):
        assert terminal_safe(HOSTILE[:cut]) + terminal_safe(HOSTILE[cut:]) == terminal_safe(HOSTILE)


def test_text_to_send_loses_controls_but_keeps_lines_and_markup():
    assert without_controls("a\x1b[2Jb\r\nc\rd\te \u202ex [b]y[/b]\x00") == "ab\nc\nd\te x [b]y[/b]"
    assert without_controls("\x1b]52;c;ZXZpbA==\x07x\x1b]8;;https://e\x1b\\y\x1b]8;;\x1b\\") == "xy"
