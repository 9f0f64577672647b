"""A reply's tool calls: each a folded block above the answer, like its thinking (thinking.py): the tool, its
arguments, how long it took and the size of its result on one line; Enter or a click unfolds the arguments
and the whole result.

The arguments are the model's and the result the server's: untrusted, shown literally (never markup), with
control characters as visible escapes."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Static

from ...engine.base import ToolCall
from ...safetext import screen_safe
from .thinking import ThinkingBlock

FOLDED_ARGUMENTS = 80  # characters of the arguments on the folded line
DRAWN_RESULT = 100_000  # characters of a result drawn unfolded (a 10 MB result would take the screen seconds)


def call_summary(call: ToolCall) -> str:
    """Where the call is, or what came of it: `12 ms · 153 characters`."""
    if call.result is None and call.error is None:
        return "running…" if call.approved else "waiting for your consent"
    if not call.approved:
        return f"not run: {call.error}"
    took = f"{call.ms:,.0f} ms · " if call.ms is not None else ""
    if call.result is None:
        return f"{took}error: {' '.join((call.error or '').split())}"
    cut = f" ({call.cut:,} cut for the model)" if call.cut else ""
    return f"{took}{len(call.result):,} characters{cut}"


def call_view(call: ToolCall, unfolded: bool) -> RenderableType:
    """The header line (▸ folded, ▾ unfolded) and, unfolded, the arguments as pretty JSON and
    the result."""
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    if len(arguments) > FOLDED_ARGUMENTS:
        arguments = arguments[: FOLDED_ARGUMENTS - 1] + "…"
    head = f"{'▾' if unfolded else '▸'} tool {call.server}/{call.name} · {call_summary(call)} · {arguments}"
    line = Text(screen_safe(head), style="dim")
    if not unfolded:
        return line
    body = ["arguments:", json.dumps(call.arguments, ensure_ascii=False, indent=2)]
    if call.result is not None:
        shown = call.result[:DRAWN_RESULT]
        more = len(call.result) - len(shown)
        body += ["result:", shown + (f"\n… {more:,} more characters not drawn" if more else "")]
    elif call.error is not None:
        body += ["error:", call.error]
    return Group(line, Text(screen_safe("\n".join(body))))


class ToolCallBlock(Static, can_focus=True):
    """One call of a reply; it keeps whether it is unfolded (the reply's redraws keep the block)."""

    BINDINGS = [Binding("enter", "fold", "Unfold/fold", tooltip="Show or hide the call's arguments and result")]
    DEFAULT_CSS = """
    ToolCallBlock { height: auto; margin: 0 0 1 0; }
    ToolCallBlock:focus { background: $boost; }
    ToolCallBlock.-folded { text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, call: ToolCall) -> None:
        super().__init__(call_view(call, False), classes="-folded")  # one line, cut at the width
        self.call = call
        self.unfolded = False

    def show(self, call: ToolCall) -> None:
        self.call = call
        self.update(call_view(call, self.unfolded))
        self.set_class(not self.unfolded, "-folded")

    def action_fold(self) -> None:
        self.unfolded = not self.unfolded
        self.show(self.call)

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.action_fold()


async def show_calls(reply: Widget, calls: Sequence[ToolCall]) -> None:
    """`reply`'s call blocks follow `calls`: a call's new state drawn, new calls mounted after the blocks above
    the answer (its thinking, the calls before), blocks of another branch's calls removed."""
    blocks = list(reply.query_children(ToolCallBlock))
    for block, call in zip(blocks, calls, strict=False):
        if block.call is not call:
            block.show(call)
    if len(blocks) > len(calls):
        await reply.remove_children(blocks[len(calls):])
    elif len(calls) > len(blocks):
        above = [child for child in reply.children if isinstance(child, (ThinkingBlock, ToolCallBlock))]
        new = [ToolCallBlock(call) for call in calls[len(blocks):]]
        if above:
            await reply.mount_all(new, after=above[-1])
        else:
            await reply.mount_all(new, before=reply.children[0] if reply.children else None)
