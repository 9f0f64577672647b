"""The conversation on screen: the log of turns, the reply being written, the status line, the
heatmap's legend and the message box. It renders a `ChatSession` and follows what the session says
changed; it holds no conversation of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Static

from ...engine.base import Backend, Token
from ...engine.params import SamplingParams
from ...probe import TokenProbe
from ...safetext import screen_safe
from ...session import ChatSession, Ending, Turn, Update
from ...wording import engine_died_in_chat
from .chat_log import ChatLog
from .draft_meter import DraftCosts, DraftMeter
from .figures import show
from .heatmap import REOPENED_NOTE, band_styles, legend
from .messages import ReplyMessage, UserMessage
from .prompt import PromptInput
from .tool_calls import ToolCallBlock


class ConversationView(Vertical):
    DEFAULT_CSS = """
    ConversationView { width: 1fr; }
    ConversationView #chat-title { height: 1; padding: 0 1; color: $text-muted; }
    ConversationView #status { height: auto; padding: 0 1; color: $text-muted; display: none; }
    ConversationView #status.-error { color: $error; }
    ConversationView #legend { height: auto; padding: 0 1; display: none; }
    """

    def __init__(self, session: ChatSession, costs: Callable[[], DraftCosts],
                 backend: Callable[[], Backend | None] = lambda: None, inspector_top: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.session = session
        self.heatmap = False
        self.inspector_top = inspector_top  # 0: replies carry no probabilities to colour
        self._costs = costs
        self._title = ("", "")
        self._backend = backend  # the model loaded now: the inspector asks it about a reply's positions
        self._live: ReplyMessage | None = None  # the widget of the reply being written: no lookup per batch

    def compose(self) -> ComposeResult:
        yield Static(id="chat-title")
        yield ChatLog(id="log")
        yield Static(id="status")
        yield Static(id="legend")
        yield PromptInput(id="prompt", placeholder="Type a message · F1 lists the keys")
        yield DraftMeter(self._costs, id="draft")

    def on_mount(self) -> None:
        self.log_view.anchor()

    @property
    def log_view(self) -> ChatLog:
        return self.get_child_by_id("log", ChatLog)  # a child by id: no walk through the whole chat

    @property
    def prompt(self) -> PromptInput:
        return self.get_child_by_id("prompt", PromptInput)

    @property
    def draft_meter(self) -> DraftMeter:
        return self.get_child_by_id("draft", DraftMeter)

    def show_title(self, model: str, figures: str = "") -> None:
        """The chat's title and model at the top; the side panel's key figures too, where it is hidden.
        The title gives way first when the line is short."""
        self._title = (model, figures)
        tail = " · ".join(part for part in (model, figures) if part)
        room = max(8, self.size.width - 2 - len(tail) - 3)
        title = self.session.title if len(self.session.title) <= room else self.session.title[: room - 1] + "…"
        show(self.get_child_by_id("chat-title", Static), Content(screen_safe(f"{title} · {tail}")))

    def on_resize(self) -> None:
        self.show_title(*self._title)

    def set_status(self, text: str, error: bool = False) -> None:
        status = self.get_child_by_id("status", Static)
        status.update(Content(screen_safe(text)))
        status.display = bool(text)
        status.set_class(error, "-error")

    async def show(self, session: ChatSession) -> None:
        """Put a whole conversation on screen."""
        self.session = session
        await self.log_view.show(session.turns)
        for reply in self.query(ReplyMessage):
            reply.heatmap = self.heatmap
        self.show_legend()

    # --- the reply being written --------------------------------------------------------------

    async def started(self, turn: Turn) -> ReplyMessage:
        """The session started a reply for `turn`: a new turn gets its widgets, an answered one writes
        its new branch in place."""
        writing = self.session.writing
        assert writing is not None, "called as the session starts the reply"
        widget = self.log_view.reply_of(turn)
        if widget is None:
            if not any(m.turn is turn for m in self.query(UserMessage)):
                await self.log_view.mount(UserMessage(turn, classes="user"))
            widget = ReplyMessage(turn, writing, classes="assistant")
            widget.heatmap = self.heatmap
            await self.log_view.mount(widget)
            self.log_view.anchor()
        else:
            await widget.start(writing)
        widget.show_status("Reading prompt…")
        self._live = widget
        return widget

    async def apply(self, turn: Turn, update: Update) -> None:
        """Draw what a batch of events changed in `turn`'s reply."""
        widget = self._live if self._live is not None and self._live.turn is turn else self.log_view.reply_of(turn)
        if widget is None or not widget.is_attached:
            return
        if update.status is not None:
            widget.show_status(update.status)
        writing = self.session.writing
        thinking = writing is not None and writing.tokens and writing.tokens[-1].thinking
        if self.session.streaming and (update.reasoning or thinking):
            await widget.think()
        if update.tools:
            await widget.show_calls()
        ending = update.ending
        if update.text and self.session.streaming:
            await widget.append(update.text)
        elif update.text and writing is not None:  # held back: the reply is not over
            widget.show_status(writing.held_line())
        if ending is None:
            return
        self._live = None
        self._say_ending(ending)
        if ending.kind in ("finished", "failed"):
            await widget.finish()
            await self.log_view.trim()
        elif ending.kind == "restored":
            await widget.give_way()
        else:
            widget.stop()
            await self.log_view.remove_turn(turn)
            self.prompt.put_back(turn.question)

    def _say_ending(self, ending: Ending) -> None:
        message = engine_died_in_chat(ending.died) if ending.died is not None else ending.message
        if ending.kind == "failed":
            self.notify(message, title="Reply cut short", severity="error", timeout=8, markup=False)
        elif ending.kind != "finished" and message:
            self.notify(message, title="No reply", severity="error", timeout=8, markup=False)
        elif message:
            self.notify(message, severity="warning", timeout=6, markup=False)

    # --- the keys the screen passes on (they work wherever the focus is) ------------------------

    def copy_last(self) -> None:
        replies = self.query(ReplyMessage)
        if replies:
            replies[-1].action_copy()

    def focus_message(self, step: int) -> None:
        """Alt+↑/↓ walk the messages (and a reply's thinking), which Tab skips; from elsewhere Alt+↑ goes to the
        latest, and past the latest both keys come back to the message box."""
        stops = list(self.log_view.query("ChatMessage, ThinkingBlock, ToolCallBlock"))
        focused = self.screen.focused
        if focused in stops:
            index = stops.index(focused) + step
        else:
            index = len(stops) - 1 if step < 0 else len(stops)
        if index >= len(stops):
            self.prompt.focus()
        elif index >= 0:
            stops[index].focus()

    def edit_last(self) -> None:
        if not self.session.turns:
            self.notify("There is no message to edit yet.", timeout=3)
        else:
            self.post_message(UserMessage.Edit(self.session.turns[-1]))

    async def toggle_heatmap(self) -> None:
        await self.set_heatmap(not self.heatmap)
        if self.heatmap and not self.inspector_top:
            self.notify("The inspector is off (inspector_top = 0 in the config): replies carry no probabilities.",
                        severity="warning", timeout=6)

    # --- the token inspector and branches ------------------------------------------------------

    class InspectorWanted(Message):
        """The user asked to inspect a token of a reply: the screen opens the inspector on what this carries
        (a widget opens no screen), and starts a branch from the token chosen there."""

        def __init__(self, turn: Turn, tokens: Sequence[Token], text: str, index: int, params: SamplingParams,
                     cannot_branch: str | None, probe: TokenProbe | None) -> None:
            super().__init__()
            self.turn = turn
            self.tokens = tokens
            self.text = text
            self.index = index
            self.params = params
            self.cannot_branch = cannot_branch
            self.probe = probe

    @on(ReplyMessage.Inspect)
    def _inspect(self, event: ReplyMessage.Inspect) -> None:
        widget = event.reply
        reply = widget.reply
        if not reply.tokens:
            self.notify(f"Nothing to inspect. {REOPENED_NOTE}", timeout=6, markup=False)
            return
        if not any(token.prob is not None for token in reply.tokens):
            self.notify("This reply has no token probabilities: they are recorded as replies are written "
                        "(inspector_top in the config).", timeout=5)
            return
        probe = TokenProbe(self._backend(), self.session.live, widget.turn.reply, self.session.model)
        index = min(event.index, len(reply.tokens) - 1)
        self.post_message(self.InspectorWanted(widget.turn, reply.tokens, reply.text, index,
                                               self.session.live.snapshot()[1],
                                               self.session.why_not_branch(widget.turn), probe))

    @on(ToolCallBlock.Inspect)
    def _inspect_call(self, event: ToolCallBlock.Inspect) -> None:
        """The inspector on a token of a call's step: no branch from it, and no X-ray (the probe follows the
        reply's own tokens)."""
        turn = next((node.turn for node in event.block.ancestors if isinstance(node, ReplyMessage)), None)
        tokens = event.block.call.tokens
        if turn is None or not any(token.prob is not None for token in tokens):
            self.notify("This call has no token probabilities: they are recorded as replies are written "
                        "(inspector_top in the config).", timeout=5)
            return
        self.post_message(self.InspectorWanted(turn, tokens, "".join(token.piece for token in tokens),
                                               min(event.index, len(tokens) - 1), self.session.live.snapshot()[1],
                                               "A tool call's tokens cannot be branched from: branch the reply.",
                                               None))

    # --- the draft -----------------------------------------------------------------------------

    @on(PromptInput.Changed)
    def _draft_changed(self) -> None:
        self.draft_meter.draft_changed(self.prompt.text)

    def recount_draft(self) -> None:
        meter = self.draft_meter
        meter.backend = self._backend()
        meter.text = self.prompt.text
        meter.recount()

    # --- the heatmap --------------------------------------------------------------------------

    async def set_heatmap(self, on: bool) -> None:
        self.heatmap = on
        self.show_legend()
        for reply in self.query(ReplyMessage):
            await reply.set_heatmap(on)

    def show_legend(self) -> None:
        """The heatmap's legend while it is on; it names the underline only where the model in use drafts."""
        shown = self.get_child_by_id("legend", Static)
        shown.display = self.heatmap
        if self.heatmap:
            reopened = any(turn.reply is not None and not turn.reply.tokens for turn in self.session.turns)
            info = backend.info if (backend := self._backend()) is not None else None
            drafting = info is not None and bool(info.draft) and self.session.live.snapshot()[1].draft_max > 0
            shown.update(legend(band_styles(self.app.theme_variables), reopened, drafting))
