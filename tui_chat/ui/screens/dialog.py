"""One look for every dialog: a box in the middle of the screen over the chat, bordered in the accent (a warning's
colour where it asks for care, an error's where it deletes), a muted hint. Each dialog says its box's width and
the look of its own parts; the rest is here, once."""

from __future__ import annotations

from typing import TypeVar

from textual.screen import ModalScreen

Answer = TypeVar("Answer")


class Dialog(ModalScreen[Answer]):
    DEFAULT_CSS = """
    Dialog { align: center middle; }
    Dialog > Vertical, Dialog > VerticalScroll {
        width: 80; max-width: 100%; height: auto; max-height: 90%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    Dialog.-care > Vertical { border: round $warning; }
    Dialog.-delete > Vertical { border: round $error; }
    Dialog .hint { color: $text-muted; }
    """
