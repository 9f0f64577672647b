"""A reply's thinking: a dimmed block above the answer, folded to one line with its time and token count
("thought for 4.2 s · 312 tokens"); Enter or a click unfolds it. With the heatmap on, the unfolded
thinking is drawn token by token like the answer (its markers included: they are tokens the model chose,
or the engine wrote when the budget was spent), and a token can be picked for the inspector.

The thinking is model output: untrusted, shown literally."""

from __future__ import annotations

import time
from collections import OrderedDict

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.visual import VisualType
from textual.widgets import Static

from ...safetext import screen_safe

THINKING_TAIL_CHARS = 3000  # of a thinking unfolded while it streams: drawn again at every batch
BLOCK_CHARS = 1000  # a thought is drawn in blocks of lines of about this size
KEPT_BLOCKS = 512  # blocks kept drawn (each width apart), the least used forgotten first
AHEAD_S = 0.004  # drawing a streaming thought's blocks ahead, per batch
_drawn: OrderedDict[tuple[str, int], list[list[Segment]]] = OrderedDict()


def thinking_view(label: str, reasoning: str, unfolded: bool, heat: RenderableType | None = None) -> RenderableType:
    """The header line (▸ folded, ▾ unfolded) and, unfolded, the thinking itself or its heatmap."""
    head = Text(f"{'▾' if unfolded else '▸'} {label}", style="dim")
    if not unfolded:
        return head
    return Group(head, heat if heat is not None else Thought(reasoning.strip()))


def thought_blocks(text: str) -> list[str]:
    """The text cut at line breaks (left out) into blocks of about BLOCK_CHARS; as it grows, only its last
    block changes. Drawn one after the other, their lines are the whole text's."""
    blocks, start = [], 0
    while (cut := text.find("\n", start + BLOCK_CHARS)) >= 0:
        blocks.append(text[start:cut])
        start = cut + 1
    return [*blocks, text[start:]]


class Thought:
    """A thinking's text, dim italic, drawn a block at a time, each block's lines kept: the whole of a long
    thought, shown once the reply ends, is not wrapped at once (~50 ms for 8,000 tokens), only its blocks
    not drawn ahead while it streamed (`draw_ahead`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for block in thought_blocks(self.text):
            for line in _block_lines(block, console, options.max_width):
                yield from line
                yield Segment.line()


def draw_ahead(text: str, console: Console, width: int) -> None:
    """Draw the finished blocks of a thought still being written, for about AHEAD_S."""
    deadline = time.perf_counter() + AHEAD_S
    for block in thought_blocks(text)[:-1]:
        if (block, width) not in _drawn:
            _block_lines(block, console, width)
            if time.perf_counter() > deadline:
                return


def _block_lines(block: str, console: Console, width: int) -> list[list[Segment]]:
    key = (block, width)
    lines = _drawn.get(key)
    if lines is None:
        rendered = console.render(Text(screen_safe(block), style="dim italic"), console.options.update_width(width))
        lines = _drawn[key] = list(Segment.split_and_crop_lines(rendered, width, include_new_lines=False, pad=False))
        if len(_drawn) > KEPT_BLOCKS:
            _drawn.popitem(last=False)
    _drawn.move_to_end(key)
    return lines


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

    BINDINGS = [Binding("enter", "fold", "Unfold/fold", tooltip="Show or hide the model's thinking")]
    DEFAULT_CSS = """
    ThinkingBlock { height: auto; margin: 0 0 1 0; }
    ThinkingBlock:focus { background: $boost; }
    """

    class Toggled(Message):
        """The user asked to fold or unfold the thinking."""

    def update(self, content: VisualType = "", *, layout: bool = True, ahead: str = "") -> None:
        """`ahead`: the whole of a thought being written while its view shows only its end (thinking_tail):
        its blocks are drawn ahead a few ms at a time, so the whole of it shows at the reply's end at once."""
        super().update(content, layout=layout)
        if ahead and self.content_size.width:
            draw_ahead(ahead.strip(), self.app.console, self.content_size.width)

    def action_fold(self) -> None:  # not `toggle`: Textual's DOMNode.action_toggle(attribute) is another action
        self.post_message(self.Toggled())

    def on_click(self, event: events.Click) -> None:
        if event.style.meta.get("token") is None:  # a heatmap token is picked, not the block toggled
            self.post_message(self.Toggled())
