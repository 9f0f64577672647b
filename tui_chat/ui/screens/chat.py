"""The chat screen: conversation on the left, what the model is doing on the right.

Flow: the prompt box makes a `Request` → the backend's worker thread → batched `EngineBatch`
messages → the reply widget and the metrics panel. Nothing else crosses the thread boundary.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Input, Select, Static

from ...engine.base import (
    Backend,
    Candidate,
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
from ...config import Config, data_dir, history_path, save_setting
from ...engine.context import left_out
from ...history import History, HistoryError, ReplyWriter
from ...recording import SavedChat, Saving
from ...engine.params import LiveParams
from ...pricing import format_usd
from ...safetext import terminal_safe
from ..bridge import EngineBatch, forward_events
from ..textual_fixes import release_styles_caches
from ..widgets.chat_log import ChatLog, Entry
from ..widgets.heatmap import band_styles, legend
from ..widgets.messages import ReplyMessage, UserMessage, reply_footer
from ..widgets.metrics import MetricsPanel
from ..widgets.prompt import PromptInput
from ..widgets.sampling import SamplingPanel
from .inspector import BranchChoice, InspectorScreen

PANEL_REFRESH_S = 0.15
NARROW_BELOW = 72  # columns; a narrower screen hides the side panel until F2 asks for it
DRAFT_COUNT_DELAY_S = 0.15
IDLE_COLLECT_S = 1.0  # the full garbage collection after a reply waits for a quiet moment

BackendOpener = Callable[[str | None], Backend]
T = TypeVar("T")


@dataclass(eq=False)
class _Reply:
    """The reply being generated: its stream, its widgets and what the user typed for it."""

    stream: Stream
    widget: ReplyMessage
    question: UserMessage
    forced: list[Token] = field(default_factory=list)  # a branch's given tokens, with what was known of them
    writer: ReplyWriter | None = None  # saves it as it streams
    visible: bool = False

    @property
    def tokens(self) -> int:
        """Tokens received so far (forced ones included): the reply widget keeps each one."""
        return len(self.widget.tokens)


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
        Binding("ctrl+t", "toggle_heatmap", "Heatmap", id="toggle_heatmap",
                tooltip="Colour each token by its probability"),
        Binding("ctrl+n", "new_chat", "New chat", id="new_chat", tooltip="Start a new chat"),
        Binding("ctrl+l", "conversations", "Chats", id="conversations",
                tooltip="Saved chats: open, search, rename, delete, export"),
        Binding("f6", "system_prompt", "System", id="system_prompt", show=False, priority=True,
                tooltip="Edit this chat's system prompt"),
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
        self.model_spec = ""
        self.conversation: list[Message] = []
        self.system_prompt = config.system_prompt
        self.reply: _Reply | None = None
        self.heatmap = False
        self.history: History | None = None
        self.saved: SavedChat | None = None  # None: not saving (no history, or it failed)
        self._panel_refreshed = 0.0
        self._draft_timer = None
        self._garbage_owed = False

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield ChatLog(id="log")
                yield Static(id="status")
                yield Static(id="legend")
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
        try:
            self.history = History(history_path())
        except HistoryError as error:
            self.notify(f"{error}: this session is not saved", severity="warning", timeout=8, markup=False)
        self._start_saving()

    def _start_saving(self, conversation_id: int | None = None, last_id: int | None = None) -> None:
        if self.history is not None:
            saving = Saving(self.history, self.query_one(MetricsPanel).price)
            self.saved = SavedChat(saving, conversation_id, last_id)

    def on_unmount(self) -> None:
        if self.history is not None:
            self.history.close()

    def _save(self, write: Callable[[], T]) -> T | None:
        """Write to the history; if it fails, say so once and go on unsaved (the chat itself is unharmed)."""
        if self.saved is None:
            return None
        try:
            return write()
        except HistoryError as error:
            self.saved = None
            self.notify(f"{error}: the rest of this chat is not saved", severity="error", timeout=10, markup=False)
            return None

    def _request_messages(self) -> list[Message]:
        system = [Message("system", self.system_prompt)] if self.system_prompt else []
        return system + self.conversation

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
                doing = event.stage or f"{event.fraction:.0%}"
                self._set_status(f"Loading {job.name or 'the default model'}… {doing}")
            elif isinstance(event, Loaded):
                if self.backend is not None:
                    self.action_stop()
                    self._close_in_background(self.backend)
                self.backend = job.backend
                # what opens this model again when a saved chat is reopened
                self.model_spec = job.name or self.config.default_model or event.info.path
                self.query_one(MetricsPanel).show_model(event.info)
                self.query_one(SamplingPanel).show_backend(event.info)
                self._set_status("")
                self._count_draft()
            elif isinstance(event, Error):
                if job.backend is not None:
                    self._close_in_background(job.backend)
                self._set_status(f"Model not loaded: {event.message}  (Ctrl+O opens another)", error=True)
                self.notify(event.message, title="Model not loaded", severity="error", timeout=8, markup=False)
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
        if self.saved is not None:
            question.parent_id = self.saved.last_id
            question.message_id = self._save(lambda: self.saved.add_user(
                event.text, self.model_spec, self.system_prompt, self.live.snapshot()[1]))
        await self.query_one("#log").mount(question)
        self.conversation.append(Message("user", event.text))
        await self._start_reply(question)

    async def _start_reply(self, question: UserMessage, widget: ReplyMessage | None = None,
                           forced: list[Token] | None = None) -> None:
        """A new reply, or (given its widget) a new branch of one: regenerated, or forced to start
        with `forced` tokens."""
        log = self.query_one(ChatLog)
        fork_of = None
        if widget is None:
            widget = ReplyMessage(classes="assistant")
            widget.heatmap = self.heatmap
            await log.mount(widget)
            log.anchor()
        else:
            fork_of = widget.message_id if forced else None
            await widget.restart()
        widget.show_status("Reading prompt…")
        forced = forced or []
        request = Request(self._request_messages(), self.live, top_logprobs=self.config.inspector_top,
                          forced=tuple(token.token_id for token in forced))
        stream = self.backend.generate(request)
        writer = None
        if self.saved is not None and question.message_id is not None:
            writer = self._save(lambda: self.saved.start_reply(
                question.message_id, fork_of if widget.branches else None, len(forced) - 1 if forced else None))
        self.reply = _Reply(stream, widget, question, forced, writer)
        self.query_one(MetricsPanel).start_reply()
        self._collect_garbage()
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
            elif message.job is self.reply and message.job.widget.is_attached:
                await self._on_reply_events(message.job, message.events)
        finally:
            message.done()

    async def _on_reply_events(self, reply: _Reply, events: list[Event]) -> None:
        pending: list[str] = []
        metrics = None
        sampling = self.query_one(SamplingPanel)
        for event in events:
            if isinstance(event, Token):
                reply.widget.tokens.append(reply.forced[reply.tokens] if event.forced else event)
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
                await self._fail(reply, event)
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
            text = "".join(pending)
            if reply.writer is not None:
                self._save(lambda: reply.writer.append(text))
            await reply.widget.append(text)

    async def _finish(self, reply: _Reply, done: Done) -> None:
        """The reply counts as being written until its widget has settled: actions wait for that."""
        try:
            await self._settle(reply, done)
        finally:
            self._end_reply()

    async def _settle(self, reply: _Reply, done: Done) -> None:
        await reply.widget.stop()
        if done.stop_reason == "cancelled" and not done.text.strip():
            await self._take_back(reply)
            return
        footer = reply_footer(done.stop_reason, done.metrics.as_dict())
        if reply.forced:
            read = done.metrics.prompt_tokens - done.metrics.cached_tokens
            footer += f" · branched at token {len(reply.forced)}, {read} token{'s' if read != 1 else ''} read"
        if done.metrics.dropped_turns:
            footer += f" · {left_out(done.metrics.dropped_turns)}"
            self.notify(f"{left_out(done.metrics.dropped_turns)} of the prompt to fit the "
                        f"{done.metrics.n_ctx:,}-token context (they stay in the chat).", severity="warning", timeout=6,
                        markup=False)
        if reply.writer is not None and self.saved is not None:  # saving may have stopped mid-reply (a full disk)
            self.saved.price = self.query_one(MetricsPanel).price
            self._save(lambda: self.saved.end_reply(reply.writer, done))
        await reply.widget.finish(done.text, footer, len(reply.forced) - 1 if reply.forced else None,
                                  reply.writer.id if reply.writer else None)
        await self.query_one(ChatLog).trim()
        self.conversation.append(Message("assistant", done.text))
        self.query_one(MetricsPanel).finish_reply(done.metrics)
        self._count_draft()

    async def _fail(self, reply: _Reply, error: Error) -> None:
        """The engine gave up. What it wrote stays (a server's stream cut mid-reply), marked as such."""
        try:
            await self._settle_failed(reply, error)
        finally:
            self._end_reply()

    async def _settle_failed(self, reply: _Reply, error: Error) -> None:
        await reply.widget.stop()
        if not error.text.strip():
            await self._take_back(reply)
            self.notify(error.message, title="No reply", severity="error", timeout=8, markup=False)
            return
        if reply.writer is not None:
            self._save(lambda: self.saved.end_reply(reply.writer, error))
        await reply.widget.finish(error.text, f"cut short: {error.message}", None,
                                  reply.writer.id if reply.writer else None)
        self.conversation.append(Message("assistant", error.text))
        self.notify(error.message, title="Reply cut short", severity="error", timeout=8, markup=False)

    def _end_reply(self) -> None:
        self.reply = None
        gc.unfreeze()
        self._garbage_owed = True
        self.set_timer(IDLE_COLLECT_S, self._collect_when_idle)

    def _collect_when_idle(self) -> None:
        if self.reply is None:
            self._collect_garbage()

    def _collect_garbage(self) -> None:
        """gc.freeze also shields the garbage made before a reply (a new chat's old widgets, a finished
        reply's live Markdown): only a full collection frees it, so one runs after each reply once the chat
        is quiet, or before the next reply freezes again. Without it memory grew about 1 MB a turn."""
        if self._garbage_owed:
            self._garbage_owed = False
            release_styles_caches()
            gc.collect()

    async def _take_back(self, reply: _Reply) -> None:
        """Nothing was written: a new branch gives way to the one before it; a new turn is removed
        and the user gets their text back to edit."""
        if reply.widget.branches:
            if reply.writer is not None:
                self._save(lambda: self.saved.take_back(reply.writer.id, reply.widget.message_id))
            await reply.widget.show_branch(reply.widget.active)
            self.conversation.append(Message("assistant", reply.widget.text))
            return
        if reply.question.message_id is not None:
            self._save(lambda: self.saved.take_back(reply.question.message_id, reply.question.parent_id))
        await reply.widget.remove()
        await reply.question.remove()
        self.conversation.pop()
        self.query_one(PromptInput).set_draft(reply.question.text)

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
        self.conversation.pop()
        await self._start_reply(self.query(UserMessage).last(), replies.last())

    async def action_edit_last(self) -> None:
        if self.reply is not None:
            return
        questions = self.query(UserMessage)
        if not questions:
            self.notify("There is no message to edit yet.", timeout=3)
            return
        question = questions.last()
        if self.saved is not None:
            shown = self.query_one(ChatLog).messages()
            self.saved.last_id = shown[shown.index(question) - 1].message_id if shown.index(question) else None
        while self.conversation and self.conversation[-1].role == "assistant":
            self.conversation.pop()
            await self.query(ReplyMessage).last().remove()
        self.conversation.pop()
        await question.remove()
        self.query_one(PromptInput).set_draft(question.text)

    def action_copy_last(self) -> None:
        replies = self.query(ReplyMessage)
        if replies:
            replies[-1].action_copy()

    def action_toggle_panel(self) -> None:
        shown = self.query_one("#side").display
        self.set_class(shown, "-panel-hidden")
        self.set_class(not shown, "-panel-shown")

    async def on_key(self, event: events.Key) -> None:
        """Typing anywhere goes to the message box, as in any chat app (keys bound where focus is excepted).

        Fast typing arrives as a burst already queued for the widget that had focus; a key that reaches
        the screen although the box has focus is one of those, so it goes to the box too (Enter sends).
        """
        prompt = self.query_one(PromptInput)
        active = self.app.active_bindings.get(event.key)
        if self.focused is prompt and active is not None and active.node is prompt:
            event.stop()
            await self.app.run_action(active.binding.action, prompt)
            return
        if (
            event.is_printable
            and event.character
            and not isinstance(self.focused, Input)
            and event.key not in self.app.active_bindings
        ):
            self.set_focus(prompt)  # at once: the keys typed next are already queued behind this one
            prompt.insert(event.character)
            event.stop()

    async def action_toggle_heatmap(self) -> None:
        self.heatmap = not self.heatmap
        shown = self.query_one("#legend", Static)
        shown.display = self.heatmap
        shown.update(legend(band_styles(self.app.get_css_variables())))
        for reply in self.query(ReplyMessage):
            await reply.set_heatmap(self.heatmap)
        if self.heatmap and not self.config.inspector_top:
            self.notify("The inspector is off (inspector_top = 0 in the config): replies carry no probabilities.",
                        severity="warning", timeout=6)

    # --- the token inspector and branches ------------------------------------------------------

    def _why_not_branch(self, widget: ReplyMessage) -> str | None:
        if self.reply is not None:
            return "A reply is being written: Esc stops it first."
        if widget is not self.query(ReplyMessage).last() or self.conversation[-1].role != "assistant":
            return "Only the latest reply can be branched."
        return None

    @on(ReplyMessage.Inspect)
    def _inspect(self, event: ReplyMessage.Inspect) -> None:
        widget = event.reply
        if not any(token.prob is not None for token in widget.tokens):
            self.notify("This reply has no token probabilities: they are recorded as replies are written "
                        "(inspector_top in the config).", timeout=5)
            return
        screen = InspectorScreen(widget.tokens, widget.text, min(event.index, len(widget.tokens) - 1),
                                 self.live.snapshot()[1], self._why_not_branch(widget))
        self.app.push_screen(screen, lambda choice: self._branch_chosen(widget, choice))

    def _branch_chosen(self, widget: ReplyMessage, choice: BranchChoice | None) -> None:
        if choice is not None:
            self.run_worker(self.branch(widget, choice.index, choice.candidate), group="branch")

    async def branch(self, widget: ReplyMessage, index: int, candidate: Candidate) -> None:
        """Cut the reply at token `index`, put `candidate` there and let the model go on from it.
        The engine rewinds its cache to the cut, so only the new token is read."""
        reason = self._why_not_branch(widget)
        if reason:
            self.notify(reason, severity="warning", timeout=4, markup=False)
            return
        original = widget.tokens[index]
        given = replace(original, token_id=candidate.token_id, text=candidate.text, piece=candidate.text,
                        prob=candidate.prob, forced=True)
        self.conversation.pop()
        await self._start_reply(self.query(UserMessage).last(), widget, [*widget.tokens[:index], given])

    @on(ReplyMessage.SwitchBranch)
    async def _switch_branch(self, event: ReplyMessage.SwitchBranch) -> None:
        reason = self._why_not_branch(event.reply)
        if reason:
            self.notify(reason.replace("branched", "switched"), severity="warning", timeout=4, markup=False)
            return
        await event.reply.show_branch(event.index)
        self.conversation[-1] = Message("assistant", event.reply.text)
        if event.reply.message_id is not None:
            self._save(lambda: self.saved.choose(event.reply.message_id))
        self._count_draft()

    async def action_new_chat(self) -> None:
        self.action_stop()
        if self.reply is not None:
            self._end_reply()
        self.query_one(MetricsPanel).forget_turns()
        self.system_prompt = self.config.system_prompt
        self._start_saving()
        await self.show_conversation([])
        self.query_one(PromptInput).focus()

    async def show_conversation(self, entries: list[Entry]) -> None:
        """Put a whole conversation on screen: messages with, for finished replies, their footers."""
        self.conversation = [entry.message for entry in entries]
        await self.query_one(ChatLog).show(entries)

    # --- saved chats and the system prompt -----------------------------------------------------

    def action_conversations(self) -> None:
        if self.history is None:
            self.notify("The history could not be opened: chats are not saved this session.", severity="warning")
            return
        from .conversations import ConversationsScreen

        self.app.push_screen(ConversationsScreen(self.history, data_dir() / "exports"), self._conversation_chosen)

    def _conversation_chosen(self, conversation_id: int | None) -> None:
        if conversation_id is not None:
            self.run_worker(self.open_conversation(conversation_id), group="open-chat", exclusive=True)

    async def open_conversation(self, conversation_id: int) -> None:
        """Go on with a saved chat: its messages and branches, system prompt, settings and model."""
        from .conversations import entries_of

        try:
            conversation = self.history.load(conversation_id)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        self.action_stop()
        if self.reply is not None:
            self._end_reply()
        self.system_prompt = conversation.system_prompt
        self.query_one(SamplingPanel).set_values(conversation.sampling.as_dict())
        self.query_one(MetricsPanel).forget_turns()
        self._start_saving(conversation.id, conversation.last_id)
        entries = entries_of(conversation)
        await self.show_conversation(entries)
        for reply in self.query(ReplyMessage):
            reply.heatmap = self.heatmap
        if conversation.model and conversation.model != self.model_spec:
            self.load_model(conversation.model)
        self.notify(f"Opened “{conversation.title}”", timeout=3, markup=False)

    def action_system_prompt(self) -> None:
        from .ask import AskText

        hint = "Sent before the chat with every reply. Applies from the next reply; saved with this chat."
        self.app.push_screen(AskText("System prompt", self.system_prompt, hint, multiline=True),
                             self._system_prompt_set)

    def _system_prompt_set(self, text: str | None) -> None:
        if text is None or text == self.system_prompt:
            return
        self.system_prompt = text
        if self.saved is not None and self.saved.id is not None:
            self._save(lambda: self.history.update(self.saved.id, system_prompt=text))
        self.notify("System prompt set: it applies from the next reply.", timeout=3)
        self._count_draft()

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
        self._count_in_background(self.backend, text)

    @work(thread=True, group="draft", exclusive=True)
    def _count_in_background(self, backend: Backend, text: str) -> None:
        """Off the UI thread: a server counts over HTTP, and typing must never wait for it."""
        try:
            count = backend.count_tokens(text)
        except EngineError:
            return
        self.app.call_from_thread(self._show_draft_count, text, count)

    def _show_draft_count(self, text: str, count: int) -> None:
        if not self.is_attached:
            return  # the app closed while the count was made
        if text != self.query_one(PromptInput).text:
            return  # typed on meanwhile: a newer count is on its way
        draft = self.query_one("#draft", Static)
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
                self.notify(f"cannot save the price preset: {error.strerror}", severity="warning", markup=False)
        self._count_draft()
