"""The chat screen: conversation on the left, what the model is doing on the right.

Flow: the prompt box makes a `Request` → the backend's worker thread → batched `EngineBatch`
messages → the reply widget and the metrics panel. Nothing else crosses the thread boundary.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Input, Select, Static

from ...engine.base import (
    Backend,
    Done,
    EngineError,
    Error,
    Event,
    LoadProgress,
    Loaded,
    Message,
    Metrics,
    PromptProgress,
    Request,
    Stream,
    Token,
)
from ...config import Config, save_setting
from ...engine.params import LiveParams
from ...pricing import format_usd
from ...safetext import terminal_safe
from ..bridge import EngineBatch, forward_events
from ..widgets.chat_log import ChatLog, Entry
from ..widgets.messages import ReplyMessage, UserMessage, reply_footer
from ..widgets.metrics import MetricsPanel
from ..widgets.prompt import PromptInput
from ..widgets.sampling import SamplingPanel

PANEL_REFRESH_S = 0.15
NARROW_BELOW = 72  # columns; a narrower screen hides the side panel until F2 asks for it
DRAFT_COUNT_DELAY_S = 0.15

BackendOpener = Callable[[str | None], Backend]


@dataclass(eq=False)
class _Reply:
    """The reply being generated: its stream, its widgets and what the user typed for it."""

    stream: Stream
    widget: ReplyMessage
    question: UserMessage
    tokens: int = 0
    visible: bool = False


@dataclass(eq=False)
class _Load:
    name: str | None
    backend: Backend | None = None


def _progress_line(event: PromptProgress) -> str:
    line = f"Reading prompt {event.done:,} / {event.total:,} tokens"
    eta = event.eta_s
    return line if eta is None else f"{line} · {eta:.0f} s left"


class ChatScreen(Screen):
    CSS_PATH = "chat.tcss"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    BINDINGS = [
        Binding("escape", "stop", "Stop", id="stop", tooltip="Stop the reply (keeps what was written)"),
        Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate", tooltip="Regenerate the last reply"),
        Binding("ctrl+g", "edit_last", "Edit last", id="edit_last", tooltip="Edit and resend the last message"),
        Binding("f3", "copy_last", "Copy reply", id="copy_last", tooltip="Copy the last reply"),
        Binding("f4", "show_earlier", "Earlier", id="show_earlier", show=False, tooltip="Show earlier messages"),
        Binding("f2", "toggle_panel", "Panel", id="toggle_panel", tooltip="Show or hide the side panel"),
        Binding("ctrl+n", "new_chat", "New chat", id="new_chat", tooltip="Start a new chat"),
        Binding("ctrl+o", "open_model", "Model", id="open_model", tooltip="Open another model"),
        Binding("f5", "models", "Models", id="models", show=False,
                tooltip="Models: local ones, and GGUF models to download from the hub"),
        Binding("f1", "help", "Help", id="help", tooltip="Show all keys"),
    ]

    def __init__(self, open_backend: BackendOpener, model: str | None, live: LiveParams, config: Config) -> None:
        super().__init__()
        self.config = config
        self.open_backend = open_backend
        self.initial_model = model
        self.live = live
        self.backend: Backend | None = None
        self.conversation: list[Message] = []
        self.reply: _Reply | None = None
        self._panel_refreshed = 0.0
        self._draft_timer = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield ChatLog(id="log")
                yield Static(id="status")
                yield PromptInput(id="prompt", placeholder="Type a message · F1 lists the keys")
                yield Static(id="draft")
            with VerticalScroll(id="side"):
                yield MetricsPanel(self.config.prices, self.config.price, id="metrics")
                yield SamplingPanel(self.live, id="sampling")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log").anchor()
        self.query_one(PromptInput).focus()
        self.load_model(self.initial_model)

    # --- model loading -------------------------------------------------------------------------

    def load_model(self, name: str | None) -> None:
        """Open and load `name` in the background; the current model stays until the new one is ready."""
        self._set_status(f"Loading {name or 'the default model'}…")
        self._open_and_load(_Load(name))

    @work(thread=True, group="load", exclusive=True)
    def _open_and_load(self, job: _Load) -> None:
        try:
            job.backend = self.open_backend(job.name)
        except EngineError as error:
            self.post_message(EngineBatch(job, [Error(str(error))], threading.Event()))
            return
        forward_events(job.backend.load(), self, job)

    def _on_load_events(self, job: _Load, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, LoadProgress):
                self._set_status(f"Loading {job.name or 'the default model'}… {event.fraction:.0%}")
            elif isinstance(event, Loaded):
                if self.backend is not None:
                    self.action_stop()
                    self._close_in_background(self.backend)
                self.backend = job.backend
                self.query_one(MetricsPanel).show_model(event.info)
                self._set_status("")
                self._count_draft()
            elif isinstance(event, Error):
                if job.backend is not None:
                    self._close_in_background(job.backend)
                self._set_status(f"Model not loaded: {event.message}  (Ctrl+O opens another)", error=True)
                self.notify(event.message, title="Model not loaded", severity="error", timeout=8)
                if self.backend is None:
                    self.query_one(MetricsPanel).show_model(None, "No model loaded")

    @work(thread=True, group="close")
    def _close_in_background(self, backend: Backend) -> None:
        backend.close()

    def _set_status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#status", Static)
        status.update(Content(terminal_safe(text)))
        status.display = bool(text)
        status.set_class(error, "-error")

    # --- sending and streaming -----------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        if self.reply is not None:
            self.notify("A reply is still being written: Esc stops it.", timeout=3)
            return
        if self.backend is None:
            self.notify("No model is loaded yet: Ctrl+O opens one.", severity="warning", timeout=4)
            return
        self.query_one(PromptInput).clear()
        question = UserMessage(event.text, classes="user")
        await self.query_one("#log").mount(question)
        self.conversation.append(Message("user", event.text))
        await self._start_reply(question)

    async def _start_reply(self, question: UserMessage) -> None:
        widget = ReplyMessage(classes="assistant")
        log = self.query_one(ChatLog)
        await log.mount(widget)
        log.anchor()
        widget.show_status("Reading prompt…")
        stream = self.backend.generate(Request(list(self.conversation), self.live))
        self.reply = _Reply(stream, widget, question)
        self.query_one(MetricsPanel).start_reply()
        gc.freeze()  # collections during the reply skip the whole chat so far: no 100s-of-ms pauses
        self._forward(stream, self.reply)

    @work(thread=True, group="reply")
    def _forward(self, stream: Stream, reply: _Reply) -> None:
        forward_events(stream, self, reply)

    @on(EngineBatch)
    async def _on_engine_batch(self, message: EngineBatch) -> None:
        try:
            if isinstance(message.job, _Load):
                self._on_load_events(message.job, message.events)
            elif message.job is self.reply:
                await self._on_reply_events(message.job, message.events)
        finally:
            message.done()

    async def _on_reply_events(self, reply: _Reply, events: list[Event]) -> None:
        pending: list[str] = []
        metrics = None
        sampling = self.query_one(SamplingPanel)
        for event in events:
            if isinstance(event, Token):
                reply.tokens += 1
                if event.text:
                    pending.append(event.text)
                if sampling.pending_version is not None and event.params_version >= sampling.pending_version:
                    sampling.show_applied(reply.tokens)
            elif isinstance(event, PromptProgress):
                reply.widget.show_status(_progress_line(event))
            elif isinstance(event, Metrics):
                metrics = event.metrics
            elif isinstance(event, Done):
                await self._flush(reply, pending)
                await self._finish(reply, event)
                return
            elif isinstance(event, Error):
                await self._flush(reply, pending)
                await self._fail(reply, event.message)
                return
        await self._flush(reply, pending)
        now = time.monotonic()
        if metrics is not None and now - self._panel_refreshed >= PANEL_REFRESH_S:
            self._panel_refreshed = now
            self.query_one(MetricsPanel).update_metrics(metrics)

    async def _flush(self, reply: _Reply, pending: list[str]) -> None:
        if pending:
            if not reply.visible:
                reply.visible = True
                reply.widget.show_status("")
            await reply.widget.append("".join(pending))

    async def _finish(self, reply: _Reply, done: Done) -> None:
        self._end_reply()
        await reply.widget.stop()
        if done.stop_reason == "cancelled" and not done.text.strip():
            await self._take_back(reply)
            return
        await reply.widget.finish(done.text, reply_footer(done.stop_reason, done.metrics))
        await self.query_one(ChatLog).trim()
        self.conversation.append(Message("assistant", done.text))
        self.query_one(MetricsPanel).finish_reply(done.metrics)
        self._count_draft()

    async def _fail(self, reply: _Reply, message: str) -> None:
        self._end_reply()
        await reply.widget.stop()
        await self._take_back(reply)
        self.notify(message, title="No reply", severity="error", timeout=8)

    def _end_reply(self) -> None:
        self.reply = None
        gc.unfreeze()

    async def _take_back(self, reply: _Reply) -> None:
        """Nothing was written: remove the turn and give the user their text back to edit."""
        await reply.widget.remove()
        await reply.question.remove()
        self.conversation.pop()
        prompt = self.query_one(PromptInput)
        prompt.text = reply.question.text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    # --- actions -------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.reply is not None:
            self.reply.stream.cancel()

    async def action_regenerate(self) -> None:
        if self.reply is not None or self.backend is None:
            return
        replies = self.query(ReplyMessage)
        if not replies or self.conversation[-1].role != "assistant":
            self.notify("There is no reply to regenerate yet.", timeout=3)
            return
        await replies.last().remove()
        self.conversation.pop()
        await self._start_reply(self.query(UserMessage).last())

    async def action_edit_last(self) -> None:
        if self.reply is not None:
            return
        questions = self.query(UserMessage)
        if not questions:
            self.notify("There is no message to edit yet.", timeout=3)
            return
        question = questions.last()
        while self.conversation and self.conversation[-1].role == "assistant":
            self.conversation.pop()
            await self.query(ReplyMessage).last().remove()
        self.conversation.pop()
        await question.remove()
        prompt = self.query_one(PromptInput)
        prompt.text = question.text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    def action_copy_last(self) -> None:
        replies = self.query(ReplyMessage)
        if replies:
            replies[-1].action_copy()

    def action_toggle_panel(self) -> None:
        shown = self.query_one("#side").display
        self.set_class(shown, "-panel-hidden")
        self.set_class(not shown, "-panel-shown")

    def on_key(self, event: events.Key) -> None:
        """Typing anywhere goes to the message box, as in any chat app (keys bound where focus is excepted)."""
        if (
            event.is_printable
            and event.character
            and not isinstance(self.focused, (Input, PromptInput))
            and event.key not in self.app.active_bindings
        ):
            prompt = self.query_one(PromptInput)
            prompt.focus()
            prompt.insert(event.character)
            event.stop()

    async def action_new_chat(self) -> None:
        self.action_stop()
        if self.reply is not None:
            self._end_reply()
        self.query_one(MetricsPanel).forget_turns()
        await self.show_conversation([])
        self.query_one(PromptInput).focus()

    async def show_conversation(self, entries: list[Entry]) -> None:
        """Put a whole conversation on screen: messages with, for finished replies, their footers."""
        self.conversation = [message for message, _ in entries]
        await self.query_one(ChatLog).show(entries)

    async def action_show_earlier(self) -> None:
        await self.query_one(ChatLog).show_earlier()

    def action_open_model(self) -> None:
        from .open_model import OpenModelScreen

        self.app.push_screen(OpenModelScreen(), self._model_chosen)

    def action_models(self) -> None:
        """One models screen for the whole session, so a download keeps going while the user chats."""
        from .models import NAME, ModelsScreen

        if not self.app.is_screen_installed(NAME):
            self.app.install_screen(ModelsScreen(self.config), NAME)
        self.app.push_screen(NAME, self._model_chosen)

    def _model_chosen(self, name: str | None) -> None:
        if name:
            self.load_model(name)

    def action_help(self) -> None:
        from .help import HelpScreen

        self.app.push_screen(HelpScreen())

    def apply_preset(self, name: str) -> None:
        self.query_one(SamplingPanel).apply_preset(name)

    def choose_price(self, name: str) -> None:
        self.query_one("#price", Select).value = name

    # --- the draft's token count ---------------------------------------------------------------

    @on(PromptInput.Changed)
    def _draft_changed(self) -> None:
        if self._draft_timer is not None:
            self._draft_timer.stop()
        self._draft_timer = self.set_timer(DRAFT_COUNT_DELAY_S, self._count_draft)

    def _count_draft(self) -> None:
        draft = self.query_one("#draft", Static)
        text = self.query_one(PromptInput).text
        if self.backend is None or not text:
            draft.update(Content("Enter sends · Ctrl+J new line"))
            return
        try:
            count = self.backend.count_tokens(text)
        except EngineError:
            return
        panel = self.query_one(MetricsPanel)
        price = panel.price
        max_tokens = self.live.snapshot()[1].max_tokens
        sending = price.cost(count, panel.metrics.context_tokens if self.conversation else 0)
        draft.update(Content(
            f"{count:,} token{'s' if count != 1 else ''} · sending ≈ {format_usd(sending)}"
            f" + up to {format_usd(price.cost(0, 0, max_tokens))} out on {price.name}"
        ))

    @on(Select.Changed, "#price")
    def _price_chosen(self, event: Select.Changed) -> None:
        if event.value != self.config.price:
            try:
                save_setting("price", str(event.value))
            except OSError as error:
                self.notify(f"cannot save the price preset: {error.strerror}", severity="warning")
        self._count_draft()
