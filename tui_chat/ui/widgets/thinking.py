"""A reply's thinking: a dimmed block above the answer, folded to one line with its time and token count
("thought for 4.2 s · 312 tokens"); Enter or a click unfolds it. With the heatmap on, the unfolded
thinking is drawn token by token like the answer (its markers included: they are tokens the model chose,
or the engine wrote when the budget was spent), and a token can be picked for the inspector.

The thinking is model output: untrusted, shown literally."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from ...safetext import screen_safe

THINKING_TAIL_CHARS = 3000  # of a thinking unfolded while it streams: drawn again at every batch


def thinking_view(label: str, reasoning: str, unfolded: bool, heat: Text | None = None) -> RenderableType:
    """The header line (▸ folded, ▾ unfolded) and, unfolded, the thinking itself or its heatmap."""
    head = Text(f"{'▾' if unfolded else '▸'} {label}", style="dim")
    if not unfolded:
        return head
    body = heat if heat is not None else Text(screen_safe(reasoning.strip()), style="dim italic")
    return Group(head, body)


def thinking_tail(reasoning: str) -> str:
    """The end of a thinking still being written, from a line's start: what is drawn at each batch stays
    short however long the thought (the whole of it is drawn once the reply ends)."""
    if len(reasoning) <= THINKING_TAIL_CHARS:
        return reasoning
    cut = reasoning.find("\n", len(reasoning) - THINKING_TAIL_CHARS)
    start = cut + 1 if 0 <= cut < len(reasoning) - 1 else len(reasoning) - THINKING_TAIL_CHARS
    return f"… {start:,} characters above, shown when the reply ends\n{reasoning[start:]}"


class ThinkingBlock(Static, can_focus=True):
    """Shown by a `ReplyMessage`, which keeps whether it is unfolded (it outlives redraws of the block)."""

    BINDINGS = [Binding("enter", "toggle", "Unfold/fold", tooltip="Show or hide the model's thinking")]
    DEFAULT_CSS = """
    ThinkingBlock { height: auto; margin: 0 0 1 0; }
    ThinkingBlock:focus { background: $boost; }
    """

    class Toggled(Message):
        """The user asked to fold or unfold the thinking."""

    def action_toggle(self) -> None:
        self.post_message(self.Toggled())

    def on_click(self, event: events.Click) -> None:
        if event.style.meta.get("token") is None:  # a heatmap token is picked, not the block toggled
            self.post_message(self.Toggled())
