"""The chat screen: the conversation on the left, what the model is doing on the right.

What outlives one chat (the model in use, its loads, the history, the price) is the `Workspace`'s, and the
conversation itself a `ChatSession` (neither imports Textual); this screen holds the panels and routes a reply's
events, and each chat feature's keys and dialogs are a room of its own (`ui/chat/*.py`): a small class the screen
makes and gives a `ChatContext`, reached by one key action and one table of messages. The one-way flow: prompt box
→ session → request → the backend's worker thread → events, batched → session → the views.
"""

from __future__ import annotations

import inspect
import threading
import time
from functools import partial

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input

from ...config import history_path
from ...engine.base import Event
from ...engine.models import STARTER_NAME, starter_installed
from ...engine.params import LiveParams
from ...history import HistoryError
from ...session import Turn, Writing
from ...workspace import LoadJob, Workspace
from ..bridge import EngineBatch
from ..keys import CHAT_KEYS
from ..memory import ReplyMemory
from ..panel.metrics import MetricsPanel
from ..panel.sampling import SamplingPanel
from ..screens.consent import ConsentWanted, ask_consent
from ..screens.model_loader import ModelLoader
from ..textual_fixes import Footer
from ..widgets.chat_log import ChatLog
from ..widgets.conversation import ConversationView
from ..widgets.draft_meter import DraftCosts
from ..widgets.messages import ChatMessage, ReplyMessage, UserMessage
from ..widgets.prompt import PromptInput
from .chats import ChatsRoom
from .conversation import ConversationRoom
from .inspector import InspectorRoom
from .lab import LabRoom
from .models import ModelsRoom
from .output_format import OutputFormatRoom
from .panel import PanelRoom
from .room import ChatContext, ChatReopened, ChatStage, PaletteChoice, ReplyStarted, Room, ToolCallsShown
from .tools import ToolsRoom

PANEL_REFRESH_S = 0.5  # while a reply streams: each refresh lays the screen out again
NARROW_BELOW = 100  # columns; a narrower screen gives the chat the width and shows the panel on F2
SAVED_POLL_S = 0.01  # quitting: how often to look whether the chat is saved
IDLE_ONLY = frozenset({"regenerate", "continue", "edit_last"})  # what cannot start while a reply is written
ROOMS: dict[str, type[Room]] = {"conversation": ConversationRoom, "chats": ChatsRoom, "models": ModelsRoom,
                                "inspector": InspectorRoom, "lab": LabRoom, "tools": ToolsRoom,
                                "output_format": OutputFormatRoom, "panel": PanelRoom}
ROUTES: dict[type[Message], str] = {  # each message for a room, handled by its `on_…` method (Textual's name)
    PromptInput.Submitted: "conversation", UserMessage.Edit: "conversation", ReplyMessage.SwitchBranch: "conversation",
    ConversationView.InspectorWanted: "inspector",
    SamplingPanel.FormatChosen: "output_format", SamplingPanel.StreamingChosen: "output_format",
    SamplingPanel.Rested: "output_format",
    ConsentWanted: "tools", ToolCallsShown: "tools", ReplyStarted: "tools", ChatReopened: "tools",
    PaletteChoice: "panel", MetricsPanel.PriceChosen: "panel",
}


class ChatScreen(ChatStage):
    """The conversation on the left, the panels on the right; the reply's route from the engine to the views.
    Each chat feature's keys and messages are its room's (keys.py is the one table of the keys, `ROUTES` of the
    messages)."""

    CSS_PATH = "screen.tcss"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    BINDINGS = [*CHAT_KEYS]

    def __init__(self, workspace: Workspace, model: str | None, live: LiveParams) -> None:
        super().__init__()
        self.workspace = workspace
        self.initial_model = model
        self.live = live
        options = {"warn": lambda message: self.notify(message, severity="error", timeout=10, markup=False)}
        workspace.new_chat(live, **options)
        workspace.consent = partial(ask_consent, self)  # a call is asked about here, where it is shown
        self.chat = ChatContext(self, workspace, live, options)
        self.rooms = {name: room(self.chat) for name, room in ROOMS.items()}
        models = self.rooms["models"]
        assert isinstance(models, ModelsRoom)
        self.memory = ReplyMemory(self)
        self.loader = ModelLoader(self, workspace, status=lambda line: self.view.set_status(line),
                                  loaded=models.loaded, failed=models.failed)
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
                yield SamplingPanel(self.live, id="sampling").data_bind(writing=ChatStage.reply)
        yield Footer()

    def on_mount(self) -> None:
        self.view.prompt.focus()
        lost_default = self.initial_model is None and self.workspace.config.default_model and starter_installed()
        self.loader.load(self.initial_model, fallback=STARTER_NAME if lost_default else None)
        try:
            self.workspace.open_history(history_path())
        except HistoryError as error:
            self.notify(f"{error}: this session is not saved", severity="warning", timeout=8, markup=False)
        self.view.session = self.workspace.new_chat(self.live, **self.chat.options)
        if (unsent := self.workspace.unsent()) is not None:
            self.view.prompt.put_back(unsent)
            self.notify("A message sent while the model loaded last time was never answered: it is back in the box.",
                        title="Not sent", timeout=8, markup=False)

    def on_unmount(self) -> None:
        model = self.workspace.backend
        self._close_workspace()
        self.memory.close()
        if model is not None:  # its engine process ends with the chat, and the exit does not wait for it
            threading.Thread(target=model.close, name="close-model", daemon=True).start()

    def _close_workspace(self) -> None:
        """Quitting waits for the chat to be saved (the history closed), never for the MCP servers to end: they
        are stopped on a thread the exit does not wait for, and a stdio server whose input closes with the app
        ends by itself (waited for, they held the app and its watcher up to 5 s after Ctrl+Q)."""
        closing = threading.Thread(target=self.workspace.close, name="close-workspace", daemon=True)
        closing.start()
        while closing.is_alive() and self.workspace.history is not None:
            closing.join(SAVED_POLL_S)

    # --- the rooms: a key's action, a message -------------------------------------------------------

    async def action_room(self, name: str, action: str, *argument: object) -> None:
        """Every chat key (keys.py): the named room's `action_<action>`, with the key's argument where it has one
        (Textual passes as many as there are parameters: one at most here)."""
        done = getattr(self.rooms[name], f"action_{action}")(*argument)
        if inspect.isawaitable(done):
            await done

    @on(Message)
    async def _to_room(self, message: Message) -> None:
        """A message for a room (a widget's, another room's): its `on_…` method, by `ROUTES`."""
        name = ROUTES.get(type(message))
        if name is not None:
            done = getattr(self.rooms[name], message.handler_name)(message)
            if inspect.isawaitable(done):
                await done

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a reply is written, regenerating or editing waits (shown dimmed in the footer); Esc
        has something to stop only then."""
        wanted = parameters[1:] if action == "room" else ()  # a room's action, and its argument
        if IDLE_ONLY.intersection(wanted) and self.reply is not None:
            return None
        if wanted == ("reply", "stop") and self.reply is None:
            return False  # out of the footer while there is nothing to stop: room for what there is
        return True

    def watch_reply(self, writing: Writing | None) -> None:
        if writing is not None:
            self.memory.reply_started()
        else:
            self.memory.reply_ended()

    def on_resize(self) -> None:
        """Across the breakpoint the title takes the panel's figures or gives them back, once the width class is set."""
        self.call_after_refresh(self.chat.panels.show_title)

    # --- streaming -----------------------------------------------------------------------------

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
        if update.tools:
            self.post_message(ToolCallsShown())
        sampling, panels = self.sampling, self.chat.panels
        if sampling.pending_version is not None and (applied := update.applied_from(sampling.pending_version)):
            sampling.show_applied(applied)
        try:
            await self.view.apply(turn, update)
        finally:
            if (ending := update.ending) is not None:
                self.reply = None  # its widget has settled: actions that waited for it can run
                if ending.kind in ("finished", "failed") and ending.done is not None:
                    self.metrics.update_metrics(ending.done.metrics)
                panels.show_title()
                self.view.recount_draft()
        now = time.monotonic()
        if update.metrics is not None and update.ending is None and now - self._panel_refreshed >= PANEL_REFRESH_S:
            self._panel_refreshed = now
            self.metrics.update_metrics(update.metrics)
            panels.show_title()

    # --- focus and typing ----------------------------------------------------------------------

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
