"""The chat screen: the conversation on the left, what the model is doing on the right.

The conversation itself is a `ChatSession` (no Textual); this screen holds it, the backend and the
panels, and turns keys and events into session commands. The one-way flow: prompt box → session →
request → the backend's worker thread → events, batched → session → the views.
"""

from __future__ import annotations

import time
from pathlib import Path

from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Select

from ...config import Config, data_dir, history_path, save_setting
from ...engine.base import Backend, Candidate, Event, ModelInfo
from ...engine.factory import BackendOpener
from ...engine.models import STARTER_NAME, starter_installed
from ...engine.params import LiveParams, SamplingParams
from ...history import History, HistoryError, model_label
from ...recording import Saving
from ...session import ChatSession, Ending, Turn, Writing, no_thinking_note, opened
from ..bridge import EngineBatch, forward_events
from ..keys import CHAT_KEYS
from ..memory import ReplyMemory
from ..widgets.chat_log import ChatLog
from ..textual_fixes import Footer
from ..widgets.conversation import ConversationView
from ..widgets.draft_meter import DraftCosts
from ..widgets.messages import ChatMessage, ReplyMessage, UserMessage
from ..widgets.metrics import MetricsPanel
from ..widgets.output_format import FormatPicker
from ..widgets.prompt import PromptInput
from ..widgets.sampling import SamplingPanel
from .model_loader import LoadJob, ModelLoader, OpenBackend
from .open_model import ModelChoice

PANEL_REFRESH_S = 0.5  # while a reply streams: each refresh lays the screen out again
SETTINGS_SAVED_AFTER_S = 0.5  # the chat's settings reach the history this long after the last change
NARROW_BELOW = 100  # columns; a narrower screen gives the chat the width and shows the panel on F2
IDLE_ONLY = frozenset({"regenerate", "edit_last", "continue_reply"})  # actions that cannot run while a reply is written


class ChatScreen(Screen):
    CSS_PATH = "chat.tcss"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    BINDINGS = CHAT_KEYS
    writing = reactive(False, bindings=True)  # a reply is being written: some actions wait for it

    def __init__(self, open_backend: OpenBackend, model: str | None, live: LiveParams, config: Config) -> None:
        super().__init__()
        self.config = config
        self.initial_model = model
        self.live = live
        self.backend: Backend | None = None
        self.history: History | None = None
        self.streaming = True  # the panel's toggle, for every chat of this screen
        self.session = self._new_session()
        self.memory = ReplyMemory(self)
        self.loader = ModelLoader(self, open_backend, status=lambda line: self.view.set_status(line),
                                  loaded=self._model_loaded, failed=self._model_failed)
        self._writing: Writing | None = None
        self._panel_refreshed = 0.0
        self._settings_timer: Timer | None = None  # a change of the settings waiting to be saved with the chat
        # The width's class from the start, as Textual picks it: added at the first resize instead, it would
        # style every widget of the screen a second time before the first frame.
        width = self.app.size.width
        self.add_class(next(name for at, name in sorted(self.HORIZONTAL_BREAKPOINTS, reverse=True) if width >= at))

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield ConversationView(self.session, self._draft_costs, lambda: self.backend, id="chat")
            with VerticalScroll(id="side"):
                yield MetricsPanel(self.config.prices, self.config.price, lambda: self.session.spent(), id="metrics")
                yield SamplingPanel(self.live, id="sampling")
        yield Footer()

    def on_mount(self) -> None:
        self.view.prompt.focus()
        self._load_first_model()
        try:
            self.history = History(history_path())
        except HistoryError as error:
            self.notify(f"{error}: this session is not saved", severity="warning", timeout=8, markup=False)
        self.session = self._new_session(self.session.model)
        self.view.session = self.session

    def on_unmount(self) -> None:
        self.session.abandon()  # quitting mid-reply: the reply is kept as stopped, not left "streaming"
        self._keep_settings()
        self.memory.close()
        if self.history is not None:
            self.history.close()

    @property
    def view(self) -> ConversationView:
        return self.query_one(ConversationView)

    @property
    def reply(self) -> Writing | None:
        """The reply being written, until its widget has settled."""
        return self._writing

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a reply is written, regenerating or editing waits (shown dimmed in the footer); Esc
        has something to stop only then."""
        if action in IDLE_ONLY and self.writing:
            return None
        if action == "stop" and not self.writing:
            return False  # out of the footer while there is nothing to stop: room for what there is
        return True

    def _new_session(self, model: str = "") -> ChatSession:
        saving = Saving(self.history, self._price()) if self.history is not None else None
        return ChatSession(self.live, saving=saving, system_prompt=self.config.system_prompt, model=model,
                           top_logprobs=self.config.inspector_top, warn=self._warn_saving, streaming=self.streaming,
                           thinking=self.config.thinking)

    def _price(self):
        return self.query_one(MetricsPanel).price if self.is_mounted else self.config.prices[self.config.price]

    def _warn_saving(self, message: str) -> None:
        self.notify(message, severity="error", timeout=10, markup=False)

    def _draft_costs(self) -> DraftCosts:
        price = self.query_one(MetricsPanel).price
        return DraftCosts(price, self.session.context_tokens, self.live.snapshot()[1].max_tokens)

    # --- models -------------------------------------------------------------------------------

    def load_model(self, name: str | None) -> None:
        """Open and load `name` in the background; the current model stays until the new one is ready."""
        self.loader.load(name)

    def _load_first_model(self) -> None:
        """At start: a configured default that is gone (deleted in F5, moved) gives way to the starter."""
        lost_default = self.initial_model is None and self.config.default_model and starter_installed()
        self.loader.load(self.initial_model, fallback=STARTER_NAME if lost_default else None)

    def _show_title(self) -> None:
        """Where the side panel is hidden, the title line carries its key figures."""
        model = model_label(self.session.model) if self.session.model else "no model yet"
        hidden = self.has_class("-panel-hidden") or (self.has_class("-narrow") and not self.has_class("-panel-shown"))
        panel = self.query_one(MetricsPanel)
        panel.show_thinking(self.session.thinking)
        self.view.show_title(model, panel.metrics if hidden and panel.metrics.n_ctx else None)

    def on_resize(self) -> None:
        """Across the panel's breakpoint the title line takes its figures, or gives them back: once the
        screen has its new width class (set after this handler)."""
        self.call_after_refresh(self._show_title)

    async def _model_loaded(self, job: LoadJob, info: ModelInfo) -> None:
        if self.backend is not None:
            self.action_stop()  # the reply ends as stopped when the old backend closes
            self.loader.close(self.backend)
        self.backend = job.backend
        self.session.model = job.name or self.config.default_model or info.path
        self.query_one(MetricsPanel).show_model(info)
        self.query_one(SamplingPanel).show_backend(info)
        self.view.set_status("")
        self._show_title()
        self._recount_draft()
        if job.note:
            self.notify(job.note, title="Default model", severity="warning", timeout=10, markup=False)
        if (held := self.loader.release()) is not None:
            await self._ask(held)

    def _model_failed(self, job: LoadJob, message: str) -> None:
        """A failed load leaves the model in use answering: only with none at all is the failure the status."""
        self.notify(message, title="Model not loaded", severity="error", timeout=8, markup=False)
        if self.backend is not None:
            self.view.set_status("")
            return
        self.view.set_status(f"Model not loaded: {message}  (Ctrl+O opens another)", error=True)
        self.query_one(MetricsPanel).show_model(None, "No model loaded")
        if (held := self.loader.release()) is not None:
            self.view.prompt.set_draft(held)

    # --- sending and streaming -----------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        if self.writing:
            self.notify("A reply is still being written: Esc stops it.", timeout=3)
        elif self.backend is not None:
            self.view.prompt.clear()
            await self._ask(event.text)
        elif self.loader.hold(event.text):
            self.view.prompt.clear()
        elif self.loader.loading:
            self.notify("A message is already waiting for the model.", timeout=3)
        else:
            self.notify("No model is loaded: Ctrl+O opens one.", severity="warning", timeout=4)

    async def _ask(self, text: str) -> None:
        await self._started(self.session.ask(text, self.backend.generate))

    async def _started(self, turn: Turn) -> None:
        self._writing = self.session.writing
        self.writing = True
        await self.view.started(turn)
        self.query_one(MetricsPanel).start_reply()
        self.memory.reply_started()
        self._forward(self.session.writing)

    @work(thread=True, group="reply")
    def _forward(self, writing) -> None:
        forward_events(writing.stream, self, writing)

    @on(EngineBatch)
    async def _on_engine_batch(self, message: EngineBatch) -> None:
        try:
            if isinstance(message.job, LoadJob):
                await self.loader.take(message.job, message.events)
            elif message.job is self.session.writing:
                await self._on_reply_events(message.job.turn, message.events)
        finally:
            message.done()

    async def _on_reply_events(self, turn: Turn, batch: list[Event]) -> None:
        update = self.session.take(batch)
        sampling = self.query_one(SamplingPanel)
        if sampling.pending_version is not None:
            applied = update.applied_from(sampling.pending_version)
            if applied is not None:
                sampling.show_applied(applied)
        try:
            await self.view.apply(turn, update)
        finally:
            if update.ending is not None:
                self._ended(update.ending)
        now = time.monotonic()
        if update.metrics is not None and update.ending is None and now - self._panel_refreshed >= PANEL_REFRESH_S:
            self._panel_refreshed = now
            self.query_one(MetricsPanel).update_metrics(update.metrics)
            self._show_title()

    def _ended(self, ending: Ending) -> None:
        """The reply counts as being written until its widget has settled: actions wait for that."""
        self._settled()
        if ending.kind in ("finished", "failed") and ending.done is not None:
            self.query_one(MetricsPanel).update_metrics(ending.done.metrics)
        self._show_title()
        if ending.kind == "failed":
            self.notify(ending.message, title="Reply cut short", severity="error", timeout=8, markup=False)
        elif ending.kind != "finished" and ending.message:
            self.notify(ending.message, title="No reply", severity="error", timeout=8, markup=False)
        elif ending.message:
            self.notify(ending.message, severity="warning", timeout=6, markup=False)
        self._recount_draft()

    def _settled(self) -> None:
        self._writing = None
        self.writing = False
        self.memory.reply_ended()

    # --- actions -------------------------------------------------------------------------------

    def action_stop(self) -> None:
        self.session.stop()

    async def action_regenerate(self) -> None:
        if self.backend is None or self.writing:
            return
        if not self.session.turns or self.session.turns[-1].reply is None:
            self.notify("There is no reply to regenerate yet.", timeout=3)
            return
        await self._started(self.session.regenerate(self.backend.generate))

    async def action_edit_last(self) -> None:
        if self.writing:
            return
        if not self.session.turns:
            self.notify("There is no message to edit yet.", timeout=3)
            return
        self.view.post_message(UserMessage.Edit(self.session.turns[-1]))

    async def action_continue_reply(self) -> None:
        reason = self.session.why_not_continue() or (None if self.backend else "No model is loaded.")
        if reason:
            self.notify(reason, severity="warning", timeout=5, markup=False)
            return
        await self._started(self.session.continue_reply(self.backend.generate))

    def action_copy_last(self) -> None:
        replies = self.query(ReplyMessage)
        if replies:
            replies[-1].action_copy()

    def action_toggle_panel(self) -> None:
        shown = self.query_one("#side").display
        self.set_class(shown, "-panel-hidden")
        self.set_class(not shown, "-panel-shown")
        self._show_title()

    async def action_toggle_heatmap(self) -> None:
        await self.view.set_heatmap(not self.view.heatmap)
        if self.view.heatmap and not self.config.inspector_top:
            self.notify("The inspector is off (inspector_top = 0 in the config): replies carry no probabilities.",
                        severity="warning", timeout=6)

    def action_toggle_thinking(self) -> None:
        self.session.set_thinking(not self.session.thinking)
        self._show_title()
        switch = "on" if self.session.thinking else "off"
        info = self.query_one(MetricsPanel).info
        note = no_thinking_note(info) if info is not None else None
        if note:
            self.notify(f"{note}. Kept with the chat: thinking {switch}.", severity="warning", timeout=6, markup=False)
        else:
            self.notify(f"Thinking {switch} in this chat, from the next reply", timeout=3, markup=False)

    async def action_show_earlier(self) -> None:
        await self.view.log_view.show_earlier()

    def action_to_box(self) -> None:
        self.view.prompt.focus()

    def action_focus_message(self, step: int) -> None:
        """Alt+↑/↓ walk the messages (and a reply's thinking), which Tab skips; from elsewhere Alt+↑ goes to the
        latest, and past the latest both keys come back to the message box."""
        stops = list(self.view.log_view.query("ChatMessage, ThinkingBlock"))
        if self.focused in stops:
            index = stops.index(self.focused) + step
        else:
            index = len(stops) - 1 if step < 0 else len(stops)
        if index >= len(stops):
            self.view.prompt.focus()
        elif index >= 0:
            stops[index].focus()

    @property
    def focus_chain(self) -> list[Widget]:
        """Tab and Shift+Tab skip the messages (Alt+↑/↓ reach them): they go between the message box and
        the panel, not through a long chat first. The message that has the focus keeps its place, with what
        is inside it (a reply's thinking)."""
        chain, log = super().focus_chain, self.query_one_optional(ChatLog)  # none while the screen is built
        if log is None:
            return chain
        around = self.focused.ancestors_with_self if self.focused is not None else []
        message = next((node for node in around if isinstance(node, ChatMessage)), None)
        return [widget for widget in chain if log not in widget.ancestors or widget is self.focused
                or (message is not None and message in widget.ancestors_with_self)]

    async def on_key(self, event: events.Key) -> None:
        """Typing anywhere goes to the message box, as in any chat app (keys bound where focus is excepted).

        Fast typing arrives as a burst already queued for the widget that had focus; a key that reaches
        the screen although the box has focus is one of those, so it goes to the box too (Enter sends).
        """
        prompt = self.view.prompt
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

    # --- branches ------------------------------------------------------------------------------

    @on(ConversationView.InspectorWanted)
    def _inspect(self, event: ConversationView.InspectorWanted) -> None:
        from .inspector import InspectorScreen  # with numpy, which it counts with: not at every start

        screen = InspectorScreen(event.tokens, event.text, event.index, event.params, event.cannot_branch, event.probe)
        self.app.push_screen(screen, lambda choice: choice and self._branch(event.turn, choice.index, choice.candidate))

    async def _branch(self, turn: Turn, index: int, candidate: Candidate) -> None:
        """In the inspector the user chose another token for a reply: a new branch from it."""
        reason = self.session.why_not_branch(turn)
        if reason or self.backend is None:
            self.notify(reason or "No model is loaded.", severity="warning", timeout=4, markup=False)
            return
        await self._started(self.session.branch(index, candidate, self.backend.generate))

    # --- chats, the system prompt and navigation -----------------------------------------------

    async def action_new_chat(self) -> None:
        """A new chat starts from the config's settings, not from those of the chat before it."""
        await self._switch_to(self._new_session(self.session.model), self.config.sampling)
        self.view.prompt.focus()

    async def _switch_to(self, session: ChatSession, settings: SamplingParams) -> None:
        """Another conversation on screen; a reply still being written ends as stopped."""
        if self.writing:
            self.session.abandon()
            self._settled()
        self._keep_settings()  # the chat's own, before the panel shows the next one's
        self.query_one(SamplingPanel).set_values(settings.as_dict())
        self.session = self.view.session = session
        self.query_one(MetricsPanel).show_chat()
        self._show_title()  # at once: its messages may take a while to come down and go up
        self.query_one(SamplingPanel).show_format(session.output_format)
        await self.view.show(session)

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
        try:
            conversation = self.history.load(conversation_id)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        previous_model = self.session.model
        await self._switch_to(opened(conversation, self.live, Saving(self.history, self._price()),
                                     top_logprobs=self.config.inspector_top, warn=self._warn_saving,
                                     streaming=self.streaming),
                              conversation.sampling)
        if conversation.model and conversation.model != previous_model:
            self.load_model(conversation.model)
        else:
            self.session.model = previous_model
        self.notify(f"Opened “{conversation.title}”", timeout=3, markup=False)

    def action_system_prompt(self) -> None:
        from .ask import AskText

        hint = "Sent before the chat with every reply. Applies from the next reply; saved with this chat."
        self.app.push_screen(AskText("System prompt", self.session.system_prompt, hint, multiline=True),
                             self._system_prompt_set)

    def _system_prompt_set(self, text: str | None) -> None:
        if text is None or text == self.session.system_prompt:
            return
        self.session.set_system_prompt(text)
        self.notify("System prompt set: it applies from the next reply.", timeout=3)
        self._recount_draft()

    def action_open_model(self) -> None:
        from .open_model import OpenModelScreen, server_names

        local = getattr(self.loader.open_backend, "local", None)  # a BackendOpener; a test's may have none
        n_ctx, gpu_layers = (local.n_ctx, local.gpu_layers) if local else (self.config.n_ctx, self.config.gpu_layers)
        screen = OpenModelScreen(server_names(self.config.remotes), Path(self.session.model).stem, n_ctx, gpu_layers)
        self.app.push_screen(screen, self._model_opened)

    def _model_opened(self, choice: ModelChoice | None) -> None:
        """Another context size or GPU layer count reopens with them, and they become the defaults."""
        if choice is None:
            return
        opener = self.loader.open_backend
        if isinstance(opener, BackendOpener) and (choice.n_ctx, choice.gpu_layers) != (
                opener.local.n_ctx, opener.local.gpu_layers):
            self.loader.open_backend = opener.reconfigured(n_ctx=choice.n_ctx, gpu_layers=choice.gpu_layers)
            self._save_settings(n_ctx=choice.n_ctx, gpu_layers=choice.gpu_layers)
        self.load_model(choice.name)

    def _save_settings(self, **settings: int | None) -> None:
        try:
            for key, value in settings.items():
                if value is not None:
                    save_setting(key, value)
        except OSError as error:
            self.notify(f"cannot save the settings: {error.strerror}", severity="warning", markup=False)

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
        from .help import HelpScreen, chat_sections

        self.app.push_screen(HelpScreen(chat_sections(self.BINDINGS)))

    @on(FormatPicker.Chosen)
    def _format_chosen(self, event: FormatPicker.Chosen) -> None:
        self.session.output_format = event.output
        self.session.keep_settings()

    @on(SamplingPanel.Changed)
    def _settings_changed(self) -> None:
        """The chat's settings are what was last set in it: saved with it as they change, once they rest
        (a slider dragged is many changes), as a reply's text is saved while it streams."""
        if self._settings_timer is not None:
            self._settings_timer.stop()
        self._settings_timer = self.set_timer(SETTINGS_SAVED_AFTER_S, self._keep_settings)

    def _keep_settings(self) -> None:
        if self._settings_timer is not None:
            self._settings_timer.stop()
            self._settings_timer = None
            self.session.keep_settings()

    @on(Checkbox.Changed, "#stream")
    def _streaming_chosen(self, event: Checkbox.Changed) -> None:
        self.streaming = self.session.streaming = event.value

    def apply_preset(self, name: str) -> None:
        self.query_one(SamplingPanel).apply_preset(name)

    def choose_price(self, name: str) -> None:
        self.query_one("#price", Select).value = name

    # --- the draft's token count and the price -------------------------------------------------

    def _recount_draft(self) -> None:
        self.view.recount_draft(self.backend)

    @on(MetricsPanel.PriceChosen)
    def _price_chosen(self) -> None:
        if self.session.saved is not None:
            self.session.saved.price = self._price()
        self._recount_draft()

    @on(UserMessage.Edit)
    def _turns_left(self) -> None:
        """Turns edited or deleted leave the chat, and the session's cost in the panel their replies'."""
        self.query_one(MetricsPanel).refresh_view()
