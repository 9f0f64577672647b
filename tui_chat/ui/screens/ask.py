"""A small dialog that asks for one piece of text: a chat's new title, its system prompt."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Input, Static, TextArea

from ...safetext import terminal_safe
from .dialog import Dialog


class AskText(Dialog[str | None]):
    """One line (Enter saves) or, with `multiline`, a text area (Ctrl+S saves, Enter is a new line).

    The value may be untrusted (a title made from a chat, an imported system prompt) and the
    text widgets draw control characters raw, so it is edited with them as visible escapes;
    saved unchanged, the value comes back as it was.
    """

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save")]
    DEFAULT_CSS = """
    AskText > Vertical { width: 76; }
    AskText TextArea { height: 10; }
    """

    def __init__(self, title: str, value: str, hint: str, multiline: bool = False) -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.shown_value = terminal_safe(value)
        self.hint = hint
        self.multiline = multiline

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self.title_text
            yield Static(Content(self.hint), classes="hint")
            if self.multiline:
                yield TextArea(self.shown_value, id="answer", soft_wrap=True, show_line_numbers=False)
            else:
                yield Input(self.shown_value, id="answer")
            keys = "Ctrl+S saves · Esc cancels" if self.multiline else "Enter saves · Esc cancels"
            yield Static(Content(keys), classes="hint")

    def action_save(self) -> None:
        text = self.query_one("#answer", TextArea).text if self.multiline else self.query_one("#answer", Input).value
        self.dismiss(self.value if text == self.shown_value else text)

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_save()
