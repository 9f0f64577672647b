"""Small controls: widgets whose own keys run in turn with the characters typed before them, and a
checkbox whose state reads without colour.

Textual inserts a typed character in the focused widget's own key handler, but runs the widget's bound
keys (Backspace, End, Enter, ←) only once the key has bubbled up to the app, behind every key the
terminal delivered with it. In a fast burst the characters overtake the edits: 11 quick Backspaces then
`Paris` gave `PPari` in the Stop field, and `42`, End, 4 Backspaces, `777` left the Seed field empty.
As priority bindings they would run when the app first sees the key, which is just as early for the
characters still queued; so the widget runs them itself, when the key reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import events
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Checkbox, Input

if TYPE_CHECKING:
    _Mixin = Widget  # what the mixin is mixed into, for the checker
else:
    _Mixin = object


class KeysInTurn(_Mixin):
    """Mix in before a Textual widget class: a key bound on the widget itself runs when the widget gets
    it, so it keeps its place among the characters typed around it."""

    async def _on_key(self, event: events.Key) -> None:
        bound = self.app.active_bindings.get(event.key)
        if bound is not None and bound.node is self:
            event.stop()
            event.prevent_default()  # the widget's own handler (an insert, a new line) does not run too
            await self.run_action(bound.binding.action)


class TextField(KeysInTurn, Input):
    """A one-line text field that keeps a fast burst of keys in order."""


class TickBox(Checkbox):
    """A checkbox whose state reads without colour: ✓ on, blank off (Textual's draws an X in both)."""

    @property
    def BUTTON_INNER(self) -> str:  # type: ignore[override]  # Textual's class attribute, read at each render
        return "✓" if self.value else " "


class ControlMessage(Message):
    """A message a control posts about itself: `@on(Kind, "#id")` selectors match the control."""

    def __init__(self, control: Widget) -> None:
        super().__init__()
        self._control = control

    @property
    def control(self) -> Widget:
        return self._control
