"""What every room of the chat screen reads and does: the workspace, the conversation on screen and its views,
the reply being written, starting one, and the panel's figures. The screen sets these up and routes a reply's
events; each room (a module of `ui/chat/`) adds the keys and dialogs of one feature."""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from textual import on
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen

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


class Room(Screen[None]):
    # The reply being written, until its widget has settled: the one "reply in progress" the footer's keys,
    # the sampling panel and the garbage collector's schedule follow.
    reply: reactive[Writing | None] = reactive(None, bindings=True, init=False)
    workspace: Workspace
    live: LiveParams
    loader: ModelLoader
    options: dict[str, Any]

    @property
    def view(self) -> ConversationView:
        return self.query_one(ConversationView)

    @property
    def session(self) -> ChatSession:
        session = self.workspace.session
        assert session is not None, "the screen starts a chat as it is made"
        return session

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
        """The session started a reply: its widget, the panel, and its events on their way here."""
        writing = self.reply = self.session.writing
        assert writing is not None, "called as the session starts a reply"
        await self.view.started(turn)
        self.query_one(MetricsPanel).start_reply()
        self.run_worker(partial(forward_events, writing.stream, self, writing), thread=True, group="reply")

    def show_title(self) -> None:
        """Where the side panel is hidden, the title line carries its key figures."""
        model = model_label(self.session.model) if self.session.model else "no model yet"
        hidden = self.has_class("-panel-hidden") or (self.has_class("-narrow") and not self.has_class("-panel-shown"))
        panel = self.query_one(MetricsPanel)
        panel.show_thinking(self.session.thinking)
        self.view.show_title(model, panel.key_figures() if hidden else "")

    @on(PaletteChoice)
    def _palette_choice(self, choice: PaletteChoice) -> None:
        if choice.what == "preset":
            self.query_one(SamplingPanel).apply_preset(choice.name)
        else:
            self.query_one(MetricsPanel).choose_price(choice.name)

    @on(MetricsPanel.PriceChosen)
    def _price_chosen(self, event: MetricsPanel.PriceChosen) -> None:
        try:
            self.workspace.set_price(event.name)
        except OSError as error:
            self.notify(f"cannot save the price preset: {error.strerror}", severity="warning", markup=False)
        self.show_figures(edited=True)

    def action_toggle_panel(self) -> None:
        shown = self.query_one("#side").display
        self.set_class(shown, "-panel-hidden").set_class(not shown, "-panel-shown")
        self.show_title()

    def show_figures(self, shown: Turn | None = None, *, edited: bool = False) -> None:
        """The panel's figures: its reply's are those of the reply on screen (the branch of `shown`, else the
        chat's last: another chat, a kept lab column); the session's cost and the draft's estimate follow too
        (`edited`: only they, after a price chosen)."""
        panel = self.query_one(MetricsPanel)
        if not edited:
            turns = [shown] if shown is not None else self.session.turns
            reply = next((turn.reply for turn in reversed(turns) if turn.reply is not None), None)
            panel.show_reply(reply.metrics if reply is not None else None)
            self.show_title()
        panel.refresh_view()
        self.view.recount_draft()
