"""A reply's tool calls: each a folded block above the answer, like its thinking (thinking.py): the tool, its
arguments, how long it took and the size of its result on one line, under the text the model wrote before the
call; Enter or a click unfolds the thinking before it, the arguments and the whole result. With the heatmap on,
the unfolded block draws the step's tokens as the model drew them (the call's markers and JSON too, a token its
grammar forced in italics): ←/→ pick one, `i` or a click opens the inspector on it.

The arguments are the model's and the result the server's: untrusted, shown literally (never markup), with
control characters as visible escapes."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from ...engine.base import ToolCall
from ...safetext import screen_safe
from .heatmap import HeatBlocks, HeatLines, grammar_line, has_probabilities
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


def call_view(call: ToolCall, unfolded: bool, heat: RenderableType | None = None) -> RenderableType:
    """The text written before the call, the header line (▸ folded, ▾ unfolded) and, unfolded, the thinking
    before it, the step's tokens as a heatmap (`heat`), the arguments as pretty JSON and the result."""
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    if len(arguments) > FOLDED_ARGUMENTS:
        arguments = arguments[: FOLDED_ARGUMENTS - 1] + "…"
    head = f"{'▾' if unfolded else '▸'} tool {call.server}/{call.name} · {call_summary(call)} · {arguments}"
    line = Text(screen_safe(head), style="dim")
    if call.before:  # one Text: the folded block's lines are cut at the width, not wrapped
        line = Text.assemble(screen_safe(call.before), "\n", line)
    if not unfolded:
        return line
    thought = [Text(screen_safe(f"thinking:\n{call.reasoning}"), style="dim")] if call.reasoning else []
    drawn = [Text("as the model wrote it:", style="dim"), heat] if heat is not None else []
    body = ["arguments:", json.dumps(call.arguments, ensure_ascii=False, indent=2)]
    if call.result is not None:
        shown = call.result[:DRAWN_RESULT]
        more = len(call.result) - len(shown)
        body += ["result:", shown + (f"\n… {more:,} more characters not drawn" if more else "")]
    elif call.error is not None:
        body += ["error:", call.error]
    return Group(line, *thought, *drawn, Text(screen_safe("\n".join(body))))


class ToolCallBlock(Static, can_focus=True):
    """One call of a reply; it keeps whether it is unfolded and the token picked (the reply's redraws keep the
    block). `bands`: the heatmap's bands while it is on."""

    BINDINGS = [
        Binding("enter", "fold", "Unfold/fold", tooltip="Show or hide the call's arguments and result"),
        Binding("left", "select(-1)", "Previous token", show=False, tooltip="Pick the call's previous token (heatmap)"),
        Binding("right", "select(1)", "Next token", show=False, tooltip="Pick the call's next token (heatmap)"),
        Binding("i", "inspect", "Inspect", tooltip="The inspector on the picked token of the call (heatmap)"),
    ]
    DEFAULT_CSS = """
    ToolCallBlock { height: auto; margin: 0 0 1 0; }
    ToolCallBlock:focus { background: $boost; }
    ToolCallBlock.-folded { text-wrap: nowrap; text-overflow: ellipsis; }
    """

    class Inspect(Message):
        """The user asked to inspect token `index` of the call's step."""

        def __init__(self, block: ToolCallBlock, index: int) -> None:
            super().__init__()
            self.block = block
            self.index = index

    def __init__(self, call: ToolCall, styles: Sequence[Style] = ()) -> None:
        super().__init__(call_view(call, False), classes="-folded")  # one line, cut at the width
        self.call = call
        self.bands = list(styles)
        self.unfolded = False
        self.selected = 0
        self._heat: HeatBlocks | None = None

    @property
    def heat_shown(self) -> bool:
        return self.unfolded and bool(self.bands) and has_probabilities(self.call.tokens)

    def show(self, call: ToolCall, styles: Sequence[Style] | None = None) -> None:
        self.call = call
        self.bands = self.bands if styles is None else list(styles)
        heat = None
        if self.heat_shown:
            self._heat = HeatBlocks.kept(self._heat, call.tokens, 0, None)
            picked = self.selected if self.has_focus else None
            heat = Group(HeatLines(self._heat, self.bands, picked),
                         *filter(None, [grammar_line(call.tokens, self.selected) if picked is not None else None]))
        self.update(call_view(call, self.unfolded, heat))
        self.set_class(not self.unfolded, "-folded")

    def action_fold(self) -> None:
        self.unfolded = not self.unfolded
        self.show(self.call)

    def action_select(self, step: int) -> None:
        if self.heat_shown:
            self.selected = max(0, min(self.selected + step, len(self.call.tokens) - 1))
            self.show(self.call)

    def action_inspect(self) -> None:
        if self.call.tokens:
            self.post_message(self.Inspect(self, self.selected))

    def on_click(self, event: events.Click) -> None:
        event.stop()
        index = event.style.meta.get("token")
        if index is None or not self.heat_shown:
            self.action_fold()
            return
        self.selected = index
        self.show(self.call)
        self.post_message(self.Inspect(self, index))

    def on_focus(self) -> None:
        if self.heat_shown:
            self.show(self.call)

    def on_blur(self) -> None:
        if self.heat_shown:
            self.show(self.call)


async def show_calls(reply: Widget, calls: Sequence[ToolCall], styles: Sequence[Style] = ()) -> None:
    """`reply`'s call blocks follow `calls`: a call's new state drawn (or the heatmap's `styles`, on or off),
    new calls mounted after the blocks above the answer (its thinking, the calls before), blocks of another
    branch's calls removed."""
    blocks = list(reply.query_children(ToolCallBlock))
    for block, call in zip(blocks, calls, strict=False):
        if block.call is not call or block.bands != list(styles):
            block.show(call, styles)
    if len(blocks) > len(calls):
        await reply.remove_children(blocks[len(calls):])
    elif len(calls) > len(blocks):
        above = [child for child in reply.children if isinstance(child, (ThinkingBlock, ToolCallBlock))]
        new = [ToolCallBlock(call, styles) for call in calls[len(blocks):]]
        if above:
            await reply.mount_all(new, after=above[-1])
        else:
            await reply.mount_all(new, before=reply.children[0] if reply.children else None)
