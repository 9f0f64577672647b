"""What every room of the chat screen is given, and what the screen and its rooms say to each other.

A room is a small class of one chat feature (a module of `ui/chat/`): its keys (`action_*`, reached through the
screen's one `room(…)` action) and the messages the screen routes to it (`on_*`). It holds its own state and is
given a `ChatContext`: the workspace, the conversation on screen and its view, the panels, the model loader, the
one place a reply starts, and the screen's dialogs, workers and messages. It never sees another room: what one
has to tell another goes as a message (below), which the screen routes like a widget's."""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from textual import getters
from textual.app import App
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.worker import Worker, WorkType

from ...engine.params import LiveParams
from ...history import model_label
from ...replies import Asked, Held, Outcome, Refused, Started
from ...session import ChatSession, Turn, Writing
from ...workspace import Workspace
from ..bridge import forward_events
from ..panel.metrics import MetricsPanel
from ..panel.sampling import SamplingPanel
from ..screens.model_loader import ModelLoader
from ..widgets.conversation import ConversationView


class PaletteChoice(Message):
    """A command of the palette (the App's) for the chat screen: a sampling preset or a price preset, by name. The
    App posts it; the screen's own widgets are the screen's to change."""

    def __init__(self, what: Literal["preset", "price"], name: str) -> None:
        super().__init__()
        self.what, self.name = what, name


class ReplyStarted(Message):
    """A reply of the chat started: its widget is up and its events are on their way."""

    def __init__(self, turn: Turn) -> None:
        super().__init__()
        self.turn = turn


class ToolCallsShown(Message):
    """A batch of the reply being written, with tool calls in it, is applied (and saved)."""


class ChatReopened(Message):
    """A saved chat is back on screen, with the tools it had switched on (to start again)."""

    def __init__(self, session: ChatSession) -> None:
        super().__init__()
        self.session = session


class ChatStage(Screen[None]):
    """The chat screen as `ChatContext` reaches it: the chat on screen, the reply being written and the widgets the
    rooms show things in. (Its rooms are not its bases: they are given a context, never the screen.)"""

    # The reply being written, until its widget has settled: the one "reply in progress" the footer's keys,
    # the sampling panel and the garbage collector's schedule follow.
    reply: reactive[Writing | None] = reactive(None, bindings=True, init=False)
    view = getters.query_one(ConversationView)
    metrics = getters.query_one(MetricsPanel)
    sampling = getters.query_one(SamplingPanel)
    side = getters.query_one("#side", VerticalScroll)
    workspace: Workspace
    loader: ModelLoader

    @property
    def session(self) -> ChatSession:
        session = self.workspace.session
        assert session is not None, "the screen starts a chat as it is made"
        return session


class Panels:
    """The side panel, and the title line that carries its key figures where the panel is hidden."""

    def __init__(self, stage: ChatStage) -> None:
        self._stage = stage

    @property
    def metrics(self) -> MetricsPanel:
        return self._stage.metrics

    @property
    def sampling(self) -> SamplingPanel:
        return self._stage.sampling

    def toggle(self) -> None:
        """F2: shown or hidden from now on, whatever the width (until then the width decides, screen.tcss). Set on
        the panel alone: a class on the screen restyled its every widget, ~190, in 160-200 ms."""
        side = self._stage.side
        side.display = not side.display
        self.show_title()

    def show(self) -> None:
        if not self._stage.side.display:
            self.toggle()

    def show_title(self) -> None:
        """Where the side panel is hidden, the title line carries its key figures."""
        session, stage = self._stage.session, self._stage
        model = model_label(session.model) if session.model else "no model yet"
        self.metrics.show_thinking(session.thinking)
        stage.view.show_title(model, self.metrics.key_figures() if not stage.side.display else "")

    def show_figures(self, shown: Turn | None = None, *, edited: bool = False) -> None:
        """The panel's figures: its reply's are those of the reply on screen (the branch of `shown`, else the
        chat's last: another chat, a kept lab column); the session's cost and the draft's estimate follow too
        (`edited`: only they, after a price chosen)."""
        if not edited:
            turns = [shown] if shown is not None else self._stage.session.turns
            reply = next((turn.reply for turn in reversed(turns) if turn.reply is not None), None)
            self.metrics.show_reply(reply.metrics if reply is not None else None)
            self.show_title()
        self.metrics.refresh_view()
        self._stage.view.recount_draft()


class ChatContext:
    """What a room is given: the workspace (with the chat's options for a new one), the session and its view, the
    panels, the model loader, starting a reply, and the screen's notifications, dialogs (`app`), workers and
    messages."""

    def __init__(self, stage: ChatStage, workspace: Workspace, live: LiveParams, options: dict[str, Any]) -> None:
        self._stage = stage
        self.workspace = workspace
        self.live = live
        self.options = options
        self.panels = Panels(stage)
        self.notify = stage.notify

    @property
    def app(self) -> App[object]:
        return self._stage.app

    @property
    def view(self) -> ConversationView:
        return self._stage.view

    @property
    def loader(self) -> ModelLoader:
        return self._stage.loader

    @property
    def session(self) -> ChatSession:
        return self._stage.session

    @property
    def reply(self) -> Writing | None:
        return self._stage.reply

    @reply.setter
    def reply(self, writing: Writing | None) -> None:
        self._stage.reply = writing

    async def start(self, asked: Asked) -> Outcome:
        """Every reply of the chat starts here, through the workspace's one starter: shown when it started, the
        status when it waits for a load, a line when it cannot."""
        outcome: Outcome = (Refused("A reply is still being written: Esc stops it.") if self.reply is not None
                            else self.workspace.start_reply(asked))  # its widget settles after the session's end
        match outcome:
            case Started(turn) if turn is not None:
                await self._started(turn)
            case Held(shown):
                self.loader.held(shown)
            case Refused(reason):
                self.notify(reason, severity="warning", timeout=4, markup=False)
        return outcome

    async def _started(self, turn: Turn) -> None:
        """The session started a reply: its widget, the panel, its events on their way here, and the rooms told."""
        writing = self.reply = self.session.writing
        assert writing is not None, "called as the session starts a reply"
        await self.view.started(turn)
        self.panels.metrics.start_reply()
        self._stage.run_worker(partial(forward_events, writing.stream, self._stage, writing), thread=True,
                               group="reply")
        self.post(ReplyStarted(turn))

    def work(self, job: WorkType[None], *, group: str, exclusive: bool = False,
             thread: bool = False) -> Worker[None]:
        """A worker of the screen's (a dialog waited for runs in one), ended with it."""
        return self._stage.run_worker(job, group=group, exclusive=exclusive, thread=thread)

    def post(self, message: Message) -> None:
        """To the screen, which routes it to the room it is for."""
        self._stage.post_message(message)


class Room:
    """One chat feature: its keys (`action_*`) and the messages routed to it (`on_*`), with what it is given."""

    def __init__(self, chat: ChatContext) -> None:
        self.chat = chat
