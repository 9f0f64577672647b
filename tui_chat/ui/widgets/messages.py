"""Chat messages.

A reply streams into a live tail (live_tail.py: its Markdown as it will look finished, cheap to update); every few
thousand characters its finished leading blocks move, with the lines drawn of them, into one widget, so the tail
stays short however long the reply grows. A finished message is one Static: hundreds keep layout cheap.

The tail is updated directly, once a batch: the bridge already coalesces tokens into batches while the
UI is busy. (Not Textual's Markdown widget with its `MarkdownStream`: the stream's `stop()` on a stream
whose task has not run yet re-raises the task's cancellation in the caller, which ended the screen's
message loop for good; and each update laid the whole screen out again.)

Model text is untrusted: it is shown literally, never parsed as Rich markup, and control characters become
visible escapes before anything reaches the terminal (emoji sequences are drawn as their parts, so the terminal
and Textual agree on the row's cells: safetext.screen_safe). Its Markdown is honest formatting, but a link's
text may lie about where it goes: a finished reply shows each link's target after its text, and no link is a
terminal hyperlink (OSC 8) or opens anything when clicked.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.renderables.blank import Blank
from textual.visual import Visual, visualize
from textual.widget import Widget
from textual.widgets import Static

from ...config import data_dir
from ...safetext import screen_safe
from ...session import Branch, Reply, Turn, Writing
from ..clipboard import copy
from .heatmap import HeatBlocks, HeatLines, HeatmapView, band_styles, grammar_line, has_probabilities
from .live_tail import LiveTail, freeze_point
from .markdown import rendered_markdown, writing_markdown
from .thinking import ThinkingBlock, thinking_tail, thinking_view
from .tool_calls import ToolCallBlock, show_calls

FREEZE_AFTER_CHARS = 3000


def live_tail() -> LiveTail:
    """Where a reply streams in."""
    return LiveTail(rendered_markdown, writing_markdown, classes="tail")


class ChatMessage(Widget):
    """A message the user can focus (Tab or click) and copy. It shows a turn of the session: the
    conversation itself lives there, not here."""

    can_focus = True
    BINDINGS = [Binding("c", "copy", "Copy", id="copy_message")]
    DEFAULT_CSS = """
    ChatMessage { height: auto; margin: 1 0 0 0; padding: 0 1; }
    /* marked by shape as well as colour: the edge's bar becomes a double line */
    ChatMessage:focus { background: $boost; border-left: double $accent; }
    """
    turn: Turn

    @property
    def text(self) -> str:
        """What it says: the question (a reply shows its own)."""
        return self.turn.question

    def action_copy(self) -> None:
        """The message as it reads: without the blank lines and spaces a model often leaves around it."""
        said = copy(self.app, self.text.strip(), data_dir() / "exports" / "copied.txt")
        self.notify(said, timeout=2 if said.startswith("Copied") else 8, markup=False)


class UserMessage(ChatMessage, Static):
    DEFAULT_CSS = "UserMessage { border-left: thick $primary; background: $surface; }"
    BINDINGS = [
        Binding("e", "edit", "Edit", id="edit_message", tooltip="Edit this message (the chat goes on from it)"),
        Binding("delete", "delete", "Delete", id="delete_message",
                tooltip="Delete this message and what follows it (press twice)"),
    ]

    class Edit(Message):
        """Edit from this turn: it and the ones after it leave the chat, its text goes to the box."""

        def __init__(self, turn: Turn, delete: bool = False) -> None:
            super().__init__()
            self.turn = turn
            self.delete = delete  # from the history too

    def __init__(self, turn: Turn, **kwargs: Any) -> None:
        super().__init__(Content(screen_safe(turn.question)), **kwargs)
        self.turn = turn

    def action_edit(self) -> None:
        self.post_message(self.Edit(self.turn))

    def action_delete(self) -> None:
        self.post_message(self.Edit(self.turn, delete=True))


class ReplyMessage(ChatMessage, Widget):
    """A turn's reply. While it is written: frozen chunks, a live Markdown tail and a status line. Once
    finished: only the chunks, the last one carrying the quiet footer (stop reason, tokens, speed),
    so finishing renders just the tail, not the whole reply again.

    The turn may have sibling branches (regenerated, or branched from a token); one is shown.
    With the heatmap on, the shown branch is drawn token by token, and a token can be picked.
    A reasoning model's thinking is a folded block above the answer (thinking.py); its tokens come first
    in `tokens`, and can be picked once it is unfolded. The tools it called are folded blocks between the
    two (tool_calls.py). A finished reply that shows only its text draws it itself, with no child widget:
    every layout of the screen (at each growth of the reply being written) walks every widget in the log.
    """

    BINDINGS = [
        Binding("enter", "inspect", "Inspect", tooltip="Inspect a token: alternatives, branch"),
        Binding("left", "select(-1)", "Previous token", show=False, tooltip="Pick the previous token (heatmap)"),
        Binding("right", "select(1)", "Next token", show=False, tooltip="Pick the next token (heatmap)"),
        Binding("left_square_bracket", "switch_branch(-1)", "Previous branch", show=False,
                tooltip="Show the reply's previous branch"),
        Binding("right_square_bracket", "switch_branch(1)", "Next branch", show=False,
                tooltip="Show the reply's next branch"),
    ]
    DEFAULT_CSS = """
    ReplyMessage { border-left: thick $accent; width: 1fr; }
    ReplyMessage .chunk { height: auto; margin: 0 0 1 0; }
    ReplyMessage .chunk.last { margin: 0; }
    ReplyMessage .chunk.ends { margin: 0; }
    ReplyMessage .status { color: $text-muted; height: auto; }
    """

    class Inspect(Message):
        """The user asked to inspect a token of this reply."""

        def __init__(self, reply: ReplyMessage, index: int) -> None:
            super().__init__()
            self.reply = reply
            self.index = index

    class SwitchBranch(Message):
        def __init__(self, reply: ReplyMessage, index: int) -> None:
            super().__init__()
            self.reply = reply
            self.index = index

    def __init__(self, turn: Turn, writing: Writing | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        shown = writing if writing is not None else turn.reply
        if shown is None:
            raise ValueError("a reply's widget shows the reply being written or the turn's own")
        self.turn = turn
        self.reply: Reply = shown  # the branch being written, else the one shown; read the same way
        self.heatmap = False
        self.unfolded = False  # the thinking shown in full
        self.selected = 0
        self._tail = ""
        self._frozen_chars = 0
        self._live: LiveTail | None = None  # the tail being written into, while the reply is written
        self._heat: HeatBlocks | None = None  # the answer's heatmap: drawn ahead while it streams, kept after
        self._thought_heat: HeatBlocks | None = None
        self._drawn: Visual | None = None  # the finished text and footer, when drawn by the reply itself

    @property
    def text(self) -> str:
        return self.reply.text

    @property
    def finished(self) -> bool:
        """Its footer is known: no longer written."""
        return self.reply.footer is not None

    @property
    def branches(self) -> list[Branch]:
        return self.turn.branches

    @property
    def active(self) -> int:
        return self.turn.active

    # --- drawing ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        if self.reply.reasoning:
            yield ThinkingBlock(self._thinking_view())
        yield from (ToolCallBlock(call) for call in self.reply.tool_calls)
        if self.finished:
            yield from self._finished_body(alone=not (self.reply.reasoning or self.reply.tool_calls))
        else:
            yield live_tail()
            yield Static(classes="status")

    def on_mount(self) -> None:
        tail = self.query(LiveTail)
        if not self.finished and tail:  # none: the app closed before the reply's parts were mounted
            self._live = tail.first()

    def _finished_body(self, alone: bool, text: str | None = None) -> list[Widget]:
        """The last chunk of a finished reply with its footer, or the whole reply as a heatmap: none when the
        chunk is `alone` in the reply (no thinking, calls or earlier chunks), which then draws it itself."""
        footer = self._footer()
        self._drawn = None
        self.refresh(layout=True)
        if self._heat_shown():
            mask = grammar_line(self.reply.tokens, self.selected) if self.has_focus else None
            return [HeatmapView(self._heat_blocks(), self._heat_styles(), self._picked(),
                                Group(*filter(None, [mask]), footer), classes="chunk last heatmap")]
        said = rendered_markdown((self.text if text is None else text).strip()) if self.text.strip() else None
        body = Group(Text("(no text)", style="dim italic") if said is None else said, footer)  # an empty reply said so
        if alone:
            self._drawn = visualize(self, body)
            return []
        return [Static(body, classes="chunk last")]

    def _footer(self) -> Text:
        return Text((self.reply.footer or "") + self._branch_label(), style="dim")

    def render(self) -> RenderableType | Visual:
        return self._drawn if self._drawn is not None and not self.children else Blank(self.background_colors[1])

    def _heat_shown(self) -> bool:
        return self.heatmap and self.finished and has_probabilities(self.reply.tokens)

    def _heat_blocks(self) -> HeatBlocks:
        self._heat = HeatBlocks.kept(self._heat, self.reply.tokens, self.reply.answer_from, self.text)
        return self._heat

    def _heat_styles(self) -> list[Style]:
        return band_styles(self.app.theme_variables)  # as Textual last made them: generating them costs ~0.5 ms

    def _picked(self) -> int | None:
        return self.selected if self.has_focus else None

    def _thinking_view(self) -> RenderableType:
        heat = None
        if self.unfolded and self._heat_shown():
            self._thought_heat = HeatBlocks.kept(self._thought_heat, self.reply.tokens, 0, None,
                                                 self.reply.answer_from)
            heat = HeatLines(self._thought_heat, self._heat_styles(), self._picked())
        reasoning = self.reply.reasoning if self.finished else thinking_tail(self.reply.reasoning)
        return thinking_view(self.reply.thought or "thought", reasoning, self.unfolded, heat)

    async def think(self, toggled: bool = False) -> None:
        """The thinking grew (or its figures did), or was folded or unfolded (`toggled`): its block, mounted
        above the answer when it first shows."""
        if not self.reply.reasoning:
            return
        blocks = self.query(ThinkingBlock)
        if blocks:
            # folded, it stays one line: no layout of the screen for its figures
            blocks.first().update(self._thinking_view(), layout=self.unfolded or toggled,
                                  ahead=self.reply.reasoning if self.unfolded and not self.finished else "")
        elif self.is_attached:
            await self.mount(ThinkingBlock(self._thinking_view()), before=self.children[0] if self.children else None)

    async def show_calls(self) -> None:
        """The reply's tool calls as they go: asked, running, done; their tokens in the heatmap once it is done."""
        await show_calls(self, self.reply.tool_calls, self._heat_styles() if self.heatmap and self.finished else ())

    async def on_thinking_block_toggled(self, event: ThinkingBlock.Toggled) -> None:
        event.stop()
        self.unfolded = not self.unfolded
        if not self.unfolded:
            self.selected = max(self.selected, self.reply.answer_from)
        await self.think(toggled=True)

    def _branch_label(self) -> str:
        if len(self.branches) < 2:
            return ""
        return f" · branch {self.active + 1}/{len(self.branches)} ([/])"  # no space: never wrapped inside

    def show_status(self, status: str) -> None:
        """Prompt-reading progress before the first token; nothing once text flows (or once the widget is
        being taken down: a batch can still arrive while the app closes)."""
        for line in self.query(".status").results(Static):
            line.update(Content(status))

    async def append(self, text: str) -> None:
        """Text the session added to the writing branch: appended to the live tail."""
        if self._live is None:  # the reply's parts are gone (the app is closing)
            return
        self._tail += text
        if len(self._tail) > FREEZE_AFTER_CHARS:
            cut = freeze_point(self._tail)
            if cut is not None:
                await self._freeze(self._live, cut)
        self._live.set_text(self._tail.lstrip("\n"))
        if self.heatmap and self.reply.tokens[-1:] and self.reply.tokens[-1].prob is not None:
            self._heat_blocks().warm(self.app.console, self._live.size.width, self._heat_styles())

    async def _freeze(self, tail: LiveTail, cut: int) -> None:
        frozen, self._tail = self._tail[:cut], self._tail[cut + 2 :]
        self._frozen_chars += cut + 2
        await tail.freeze(frozen, classes="chunk")

    def stop(self) -> None:
        """Nothing more is written into the tail."""
        self._live = None

    async def start(self, writing: Writing) -> None:
        """Write a new branch in place; the ones before it stay in the turn."""
        self.stop()
        await self.remove_children()
        self.reply, self._tail, self._frozen_chars = writing, "", 0
        self._live = live_tail()
        await self.mount_all([self._live, Static(classes="status")])

    async def finish(self) -> None:
        """The turn's newest branch is final (the engine's last word on the text, which may differ from
        what streamed when a held-back stop prefix was released at the end): freeze what is left."""
        self.stop()
        self._show_active()
        self.selected = min(max(self.selected, self.reply.answer_from), max(len(self.reply.tokens) - 1, 0))
        if self._heat_shown():  # the heatmap's blocks still to draw first, a few at a time: the loop runs between
            await self._heat_blocks().catch_up(self.app.console, self.content_size.width, self._heat_styles())
            await self.redraw()
            return
        await self.think()
        await self.query_one(".status").remove()
        tail = self.query_one(LiveTail)
        rest = self.text[self._frozen_chars :]
        long = len(rest) > FREEZE_AFTER_CHARS  # a shorter rest is drawn again in a few ms
        part = await tail.freeze_whole(rest.lstrip("\n"), classes="chunk") if long else None
        await tail.remove()
        if part is not None:  # the part frozen before, or a new one: the text's last, the footer under it
            part.add_class("ends")
            await self.mount(Static(self._footer(), classes="chunk last"))
            return
        await self.mount_all(self._finished_body(not self.children, rest))

    async def give_way(self) -> None:
        """The branch being written came to nothing: the one shown before it is back."""
        self.stop()
        await self.show_branch()

    async def show_branch(self) -> None:
        """Draw the turn's active branch (the session switched it)."""
        branch = self.turn.reply
        self._show_active()
        self.selected = branch.cut if branch and branch.cut is not None else self.reply.answer_from
        await self.redraw()

    def _show_active(self) -> None:
        """The turn's active branch is the one shown: its newest once written, another once switched to."""
        self.reply = self.turn.reply or self.reply

    async def redraw(self) -> None:
        """Draw the finished reply again (the heatmap toggled, a branch or a token picked)."""
        if not self.finished:
            return
        self._frozen_chars = 0
        with self.app.batch_update():  # the thinking's and the calls' blocks stay: they may have the focus
            keep = (ThinkingBlock, ToolCallBlock) if self.reply.reasoning else ToolCallBlock
            await self.remove_children([child for child in self.children if not isinstance(child, keep)])
            await self.think()
            await self.show_calls()
            await self.mount_all(self._finished_body(not self.children))

    async def set_heatmap(self, on: bool) -> None:
        if on != self.heatmap:
            self.heatmap = on
            await self.redraw()

    async def action_select(self, step: int) -> None:
        if self.heatmap and self.reply.tokens:
            first = 0 if self.unfolded else min(self.reply.answer_from, len(self.reply.tokens) - 1)
            self.selected = max(first, min(self.selected + step, len(self.reply.tokens) - 1))
            await self.redraw()

    def action_inspect(self) -> None:
        if self.finished:
            self.post_message(self.Inspect(self, self.selected))
        else:  # the footer offers Enter here too: say why nothing opens (a click on a token still does)
            self.notify("Enter inspects once the reply is finished; click a token to inspect it now.", timeout=4)

    def action_switch_branch(self, step: int) -> None:
        target = self.active + step
        if self.finished and 0 <= target < len(self.branches):
            self.post_message(self.SwitchBranch(self, target))

    async def on_click(self, event: events.Click) -> None:
        index = event.style.meta.get("token")
        if index is not None:
            self.selected = index
            self.post_message(self.Inspect(self, index))

    async def on_focus(self) -> None:
        if self.heatmap:
            await self.redraw()

    async def on_blur(self) -> None:
        if self.heatmap:
            await self.redraw()
