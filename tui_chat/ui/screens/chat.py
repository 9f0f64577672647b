"""The chat screen: the conversation on the left, what the model is doing on the right.

What outlives one chat (the model in use, its loads, the history, the price) is the `Workspace`'s, and the
conversation itself a `ChatSession` (neither imports Textual); this screen holds the panels and turns keys and
events into their commands. The one-way flow: prompt box → session → request → the backend's worker thread →
events, batched → session → the views.
"""

from __future__ import annotations

import threading
import time
from functools import partial

from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input

from ...config import data_dir, history_path
from ...engine.base import Backend, Event, ModelInfo
from ...engine.models import STARTER_NAME, starter_installed
from ...engine.params import LiveParams, SamplingParams
from ...history import HistoryError, model_label
from ...session import ChatSession, Turn, Writing
from ...workspace import LoadJob, Workspace
from ..bridge import EngineBatch, forward_events
from ..keys import CHAT_KEYS
from ..memory import ReplyMemory
from ..textual_fixes import Footer
from ..widgets.chat_log import ChatLog
from ..widgets.conversation import ConversationView
from ..widgets.draft_meter import DraftCosts
from ..widgets.messages import ChatMessage, UserMessage
from ..widgets.metrics import MetricsPanel
from ..widgets.prompt import PromptInput
from ..widgets.sampling import SamplingPanel
from .model_loader import ModelLoader
from .tools import restore_chat_tools

PANEL_REFRESH_S = 0.5  # while a reply streams: each refresh lays the screen out again
NARROW_BELOW = 100  # columns; a narrower screen gives the chat the width and shows the panel on F2
IDLE_ONLY = frozenset({"regenerate", "continue", "edit_last"})  # what cannot start while a reply is written


class ChatScreen(Screen[None]):
    CSS_PATH = "chat.tcss"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    BINDINGS = [*CHAT_KEYS]
    # The reply being written, until its widget has settled: the one "reply in progress" the footer's keys,
    # the sampling panel and the garbage collector's schedule follow.
    reply: reactive[Writing | None] = reactive(None, bindings=True, init=False)

    def __init__(self, workspace: Workspace, model: str | None, live: LiveParams) -> None:
        super().__init__()
        self.workspace = workspace
        self.initial_model = model
        self.live = live
        self.options = {"warn": lambda message: self.notify(message, severity="error", timeout=10, markup=False)}
        workspace.new_chat(live, **self.options)
        self.memory = ReplyMemory(self)
        self.loader = ModelLoader(self, workspace, status=lambda line: self.view.set_status(line),
                                  loaded=self._model_loaded, failed=self._model_failed)
        self._panel_refreshed = 0.0
        # The width's class from the start, as Textual picks it: added at the first resize instead, it would
        # style every widget of the screen a second time before the first frame.
        width = self.app.size.width
        self.add_class(next(name for at, name in sorted(self.HORIZONTAL_BREAKPOINTS, reverse=True) if width >= at))

    def compose(self) -> ComposeResult:
        costs = lambda: DraftCosts(self.workspace.price, self.session.context_tokens,  # noqa: E731
                                   self.live.snapshot()[1].max_tokens)
        with Horizontal(id="main"):
            yield ConversationView(self.session, costs, lambda: self.workspace.backend,
                                   inspector_top=self.workspace.config.inspector_top, id="chat")
            with VerticalScroll(id="side"):
                yield MetricsPanel(self.workspace.config.prices, self.workspace.price.name,
                                   lambda: self.session.spent(), id="metrics")
                yield SamplingPanel(self.live, self.workspace, lambda: self.reply is not None, id="sampling")
        yield Footer()

    def on_mount(self) -> None:
        self.view.prompt.focus()
        lost_default = self.initial_model is None and self.workspace.config.default_model and starter_installed()
        self.loader.load(self.initial_model, fallback=STARTER_NAME if lost_default else None)
        try:
            self.workspace.open_history(history_path())
        except HistoryError as error:
            self.notify(f"{error}: this session is not saved", severity="warning", timeout=8, markup=False)
        self.view.session = self.workspace.new_chat(self.live, **self.options)

    def on_unmount(self) -> None:
        model = self.workspace.backend
        self.workspace.close()
        self.memory.close()
        if model is not None:  # its engine process ends with the chat, and the exit does not wait for it
            threading.Thread(target=model.close, name="close-model", daemon=True).start()

    @property
    def view(self) -> ConversationView:
        return self.query_one(ConversationView)

    @property
    def session(self) -> ChatSession:
        session = self.workspace.session
        assert session is not None, "the screen starts a chat as it is made"
        return session

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a reply is written, regenerating or editing waits (shown dimmed in the footer); Esc
        has something to stop only then."""
        if parameters and parameters[0] in IDLE_ONLY and self.reply is not None:
            return None
        if parameters == ("stop",) and self.reply is None:
            return False  # out of the footer while there is nothing to stop: room for what there is
        return True

    def watch_reply(self, writing: Writing | None) -> None:
        sampling = self.query_one(SamplingPanel)
        if writing is not None:
            sampling.reply_started()
            self.memory.reply_started()
        else:
            sampling.reply_ended()
            self.memory.reply_ended()

    # --- models -------------------------------------------------------------------------------

    @on(ConversationView.TitleChanged)
    def _show_title(self) -> None:
        """Where the side panel is hidden, the title line carries its key figures."""
        model = model_label(self.session.model) if self.session.model else "no model yet"
        hidden = self.has_class("-panel-hidden") or (self.has_class("-narrow") and not self.has_class("-panel-shown"))
        panel = self.query_one(MetricsPanel)
        panel.show_thinking(self.session.thinking)
        self.view.show_title(model, panel.key_figures() if hidden else "")

    def on_resize(self) -> None:
        """Across the breakpoint the title takes the panel's figures or gives them back, once the width class is set."""
        self.call_after_refresh(self._show_title)

    async def _model_loaded(self, job: LoadJob, info: ModelInfo, replaced: Backend | None) -> None:
        if replaced is not None:
            self.session.stop()  # the reply ends as stopped when the old backend closes
        self.query_one(MetricsPanel).show_model(info)
        self.query_one(SamplingPanel).show_backend(info)
        self.view.set_status("")
        self._show_title()
        self.view.recount_draft()
        self.view.show_legend()
        if job.note:
            self.notify(job.note, title="Default model", severity="warning", timeout=10, markup=False)
        backend = self.workspace.backend  # the job's, now in use; a held message goes once no load is to come
        if self.workspace.loading is None and backend is not None and (held := self.workspace.release()) is not None:
            await self._started(self.session.ask(held, backend.generate))

    def _model_failed(self, job: LoadJob, message: str) -> None:
        """A failed load leaves the model in use answering, and a message that waited for it back in the box:
        only with no model at all is the failure the status."""
        self.notify(message, title="Model not loaded", severity="error", timeout=8, markup=False)
        if self.workspace.loading is None and (held := self.workspace.release()) is not None:
            self.view.prompt.set_draft(held)
        if self.workspace.backend is not None:
            self.view.set_status("")
            return
        self.view.set_status(f"Model not loaded: {message}  (Ctrl+O opens another)", error=True)
        self.query_one(MetricsPanel).show_model(None, "No model loaded")

    # --- sending and streaming -----------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _send(self, event: PromptInput.Submitted) -> None:
        """A message waits for a model on its way, even with another one loaded: the reply is written, and
        saved, by the model the chat is on."""
        if self.reply is not None:
            self.notify("A reply is still being written: Esc stops it.", timeout=3)
        elif self.workspace.loading is None and self.workspace.backend is not None:
            self.view.prompt.clear()
            await self._started(self.session.ask(event.text, self.workspace.backend.generate))
        elif self.loader.hold(event.text):
            self.view.prompt.clear()
        elif self.workspace.loading is not None:
            self.notify("A message is already waiting for the model.", timeout=3)
        else:
            self.notify("No model is loaded: Ctrl+O opens one.", severity="warning", timeout=4)

    async def _started(self, turn: Turn) -> None:
        writing = self.reply = self.session.writing
        assert writing is not None, "called as the session starts a reply"
        await self.view.started(turn)
        self.query_one(MetricsPanel).start_reply()
        self.run_worker(partial(forward_events, writing.stream, self, writing), thread=True, group="reply")

    @on(EngineBatch)
    async def _on_engine_batch(self, message: EngineBatch) -> None:
        try:
            if isinstance(message.job, LoadJob):
                await self.loader.take(message.job, message.events)
            elif isinstance(message.job, Writing) and message.job is self.session.writing:
                await self._on_reply_events(message.job.turn, message.events)
        finally:
            message.done()

    async def _on_reply_events(self, turn: Turn, batch: list[Event]) -> None:
        update = self.session.take(batch)
        sampling = self.query_one(SamplingPanel)
        if sampling.pending_version is not None and (applied := update.applied_from(sampling.pending_version)):
            sampling.show_applied(applied)
        try:
            await self.view.apply(turn, update)
        finally:
            if (ending := update.ending) is not None:
                self.reply = None  # its widget has settled: actions that waited for it can run
                if ending.kind in ("finished", "failed") and ending.done is not None:
                    self.query_one(MetricsPanel).update_metrics(ending.done.metrics)
                self._show_title()
                self.view.recount_draft()
        now = time.monotonic()
        if update.metrics is not None and update.ending is None and now - self._panel_refreshed >= PANEL_REFRESH_S:
            self._panel_refreshed = now
            self.query_one(MetricsPanel).update_metrics(update.metrics)
            self._show_title()

    # --- actions -------------------------------------------------------------------------------

    async def action_reply(self, how: str) -> None:
        """Esc stops the reply being written; Ctrl+R writes another version of the last one, F8 goes on with it."""
        backend = self.workspace.backend
        if how == "stop":
            self.session.stop()
            self.view.action_to_box()  # Esc leaves where it was pressed, whatever else it did
        elif self.reply is not None:
            return
        elif reason := self.loader.in_flight() or self.session.why_not_reply(how) or (
                None if backend else "No model is loaded."):
            self.notify(reason, severity="warning", timeout=5, markup=False)
        elif backend is not None:
            await self._started(self.session.regenerate(backend.generate) if how == "regenerate" else
                                self.session.continue_reply(backend.generate))

    async def action_view(self, name: str, *args: object) -> None:
        """The conversation's own actions (copy, heatmap, earlier messages, focus, edit): the view's."""
        await self.view.run_action(f"{name}({', '.join(map(repr, args))})")

    def action_toggle_panel(self) -> None:
        shown = self.query_one("#side").display
        self.set_class(shown, "-panel-hidden").set_class(not shown, "-panel-shown")
        self._show_title()

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

    @on(ConversationView.InspectorWanted)
    @work(group="inspector")
    async def _inspect(self, event: ConversationView.InspectorWanted) -> None:
        """The inspector on a reply's token; a token chosen there starts a new branch from it."""
        from .inspector import BranchChoice, InspectorScreen  # with numpy, which it counts with: not at every start

        choice: BranchChoice | None = await self.app.push_screen_wait(InspectorScreen(
            event.tokens, event.text, event.index, event.params, event.cannot_branch, event.probe))
        reason = None if choice is None else self.session.why_not_branch(event.turn) or self.loader.in_flight() or (
            None if self.workspace.backend is not None else "No model is loaded.")
        if reason:
            self.notify(reason, severity="warning", timeout=4, markup=False)
        elif choice is not None and self.workspace.backend is not None:
            await self._started(self.session.branch(choice.index, choice.candidate, self.workspace.backend.generate))

    # --- chats, the system prompt and navigation -----------------------------------------------

    async def action_new_chat(self) -> None:
        """A new chat starts from the config's settings, not from those of the chat before it."""
        await self._switch_to(self.workspace.new_chat(self.live, **self.options), self.workspace.config.sampling)
        self.view.prompt.focus()

    async def _switch_to(self, session: ChatSession, settings: SamplingParams) -> None:
        """Another conversation on screen, already the workspace's (the one before kept with its settings, a
        reply still being written ended as stopped)."""
        self.reply = None
        self.query_one(SamplingPanel).set_values(settings.as_dict())
        self.view.session = session
        self.show_figures()  # at once: its messages may take a while to come down and go up
        self.query_one(SamplingPanel).show_format(session.output_format)
        await self.view.show(session)

    @work(group="open-chat", exclusive=True)
    async def action_conversations(self) -> None:
        if self.workspace.history is None:
            self.notify("The history could not be opened: chats are not saved this session.", severity="warning")
            return
        from .conversations import ConversationsScreen

        chosen = await self.app.push_screen_wait(ConversationsScreen(self.workspace, data_dir() / "exports"))
        if chosen is not None:
            await self.open_conversation(chosen)

    async def open_conversation(self, conversation_id: int) -> None:
        """Go on with a saved chat: its messages and branches, system prompt, settings and model (loaded for
        it: until then the chat stays on the model in use, and a message waits for the load)."""
        try:
            session, conversation, wanted = self.workspace.reopen(conversation_id, self.live, **self.options)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        await self._switch_to(session, conversation.sampling)
        if wanted is not None:
            self.loader.load(wanted)
        self.notify(f"Opened “{conversation.title}”", timeout=3, markup=False)
        restore_chat_tools(self, self.workspace, session)

    @work(group="system-prompt")
    async def action_system_prompt(self) -> None:
        from .ask import AskText

        hint = "Sent before the chat with every reply. Applies from the next reply; saved with this chat."
        text = await self.app.push_screen_wait(AskText("System prompt", self.session.system_prompt, hint,
                                                       multiline=True))
        if text is not None and text != self.session.system_prompt:
            self.session.set_system_prompt(text)
            self.notify("System prompt set: it applies from the next reply.", timeout=3)
            self.view.recount_draft()

    def action_pick_model(self, where: str) -> None:
        """Ctrl+O: a name, path or server, with the context size and GPU layers (saved as the defaults); F5:
        the models screen, one for the whole session, so a download keeps going while the user chats."""
        if where == "open":
            from .open_model import OpenModelScreen, server_names

            remotes = server_names(self.workspace.config.remotes)
            self.app.push_screen(OpenModelScreen(self.workspace, remotes, self.session.model), self.loader.chosen)
            return
        from .models import NAME, ModelsScreen

        if not self.app.is_screen_installed(NAME):
            self.app.install_screen(ModelsScreen(self.workspace), NAME)
        self.app.push_screen(NAME, self.loader.chosen)

    def action_help(self) -> None:
        from .help import HelpScreen, chat_sections

        self.app.push_screen(HelpScreen(chat_sections(self.BINDINGS), self.workspace.config.keys))

    @on(MetricsPanel.PriceChosen)
    @on(UserMessage.Edit)
    @on(ConversationView.BranchShown)
    def show_figures(self, event: MetricsPanel.PriceChosen | UserMessage.Edit | ConversationView.BranchShown | None
                     = None) -> None:
        """The panel's figures: its reply's are those of the reply on screen (a branch just shown, else the chat's
        last: another chat, a kept lab column); the session's cost and the draft's estimate follow a price chosen,
        or turns edited or deleted off the chat."""
        if isinstance(event, MetricsPanel.PriceChosen):
            try:
                self.workspace.set_price(event.name)
            except OSError as error:
                self.notify(f"cannot save the price preset: {error.strerror}", severity="warning", markup=False)
        panel = self.query_one(MetricsPanel)
        if not isinstance(event, (MetricsPanel.PriceChosen, UserMessage.Edit)):
            turns = [event.turn] if event is not None else self.session.turns
            reply = next((turn.reply for turn in reversed(turns) if turn.reply is not None), None)
            panel.show_reply(reply.metrics if reply is not None else None)
            self._show_title()
        panel.refresh_view()
        self.view.recount_draft()
