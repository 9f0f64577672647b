"""The message box: Enter sends, Ctrl+J (or Shift+Enter where the terminal reports it) breaks the line. Its
cursor blinks for a while after each key, click or focus, then holds still, lit, as GTK's does: each blink is a
frame of the screen, which was all an idle chat drew (0.8 % of a core)."""

from __future__ import annotations

from typing import Any

from textual import events, on
from textual.binding import Binding
from textual.message import Message
from textual.timer import Timer
from textual.widgets import TextArea

from ...safetext import without_controls
from .fields import KeysInTurn

BLINK_FOR_S = 10.0  # GTK's cursor-blink-timeout


class PromptInput(KeysInTurn, TextArea):
    """Enter and Ctrl+J are the box's own keys (fields.py): they run in turn with the characters typed
    before them, and Enter never becomes the text area's new line."""

    DEFAULT_CSS = """
    PromptInput {
        height: auto; min-height: 3; max-height: 10; margin: 0 1;
        /* as specific as TextArea's compact `border: none !important`, and later, so it wins */
        &.-textual-compact { border: round $primary 50% !important; }
        &.-textual-compact:focus { border: heavy $primary !important; }  /* by shape too, not only colour */
    }
    """
    BINDINGS = [
        Binding("enter", "submit", "Send", id="send"),
        Binding("ctrl+j,shift+enter", "newline", "Newline", id="newline"),
    ]

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, compact=True, **kwargs)
        self._held = False  # the cursor stopped blinking here (not by its owner's choice)
        self._blink_for: Timer | None = None

    def on_mount(self) -> None:
        self._blink_for = self.set_interval(BLINK_FOR_S, self._hold_still)

    def on_focus(self) -> None:
        self._blink_a_while()

    @on(TextArea.SelectionChanged)
    def _blink_a_while(self) -> None:
        """A key, a click or the focus: the cursor blinks again, BLINK_FOR_S from now."""
        if self._held:
            self._held = False
            self.cursor_blink = True
        if self._blink_for is not None:
            self._blink_for.reset()

    def _hold_still(self) -> None:
        if self._blink_for is not None:
            self._blink_for.pause()
        if self.cursor_blink:
            self._held = True
            self.cursor_blink = False

    async def _on_paste(self, event: events.Paste) -> None:
        """Copied model text can carry terminal escapes; the box would draw them raw."""
        event.prevent_default()
        event.stop()
        if result := self._replace_via_keyboard(without_controls(event.text), *self.selection):
            self.move_cursor(result.end_location)

    def set_draft(self, text: str) -> None:
        """Put text in the box to edit, in place of what is there (an edited message), as the box can show it."""
        self.text = without_controls(text)
        self.move_cursor(self.document.end)
        self.focus()

    def put_back(self, unsent: str) -> None:
        """A message that got no reply (stopped before its first token, its model's load failed) back in the box,
        in front of what was typed since: the two read in the order they were written, and the cursor stays
        where the typing was, so a draft being typed as Esc lands goes on under the fingers undisturbed."""
        if not self.text.strip():
            self.set_draft(unsent)
            return
        self.insert(f"{without_controls(unsent)}\n\n", (0, 0))
        self.focus()

    def action_submit(self) -> None:
        if self.text.strip():
            self.post_message(self.Submitted(self.text))

    def action_newline(self) -> None:
        self.insert("\n")
