"""The conversation pane. Only the most recent messages are mounted: layout and every width change
cost time in proportion to the widgets on screen, and a long chat should stream as fast as a new one (the
screen's reflow, each time the reply being written grows, took 8 ms of CPU with 100 mounted, 5 with 40).
Earlier messages come back on request, a batch at a time. What they say lives in the session's turns:
the log only decides which of them have widgets."""

from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Button

from ...session import Turn
from .messages import ChatMessage, ReplyMessage, UserMessage

MAX_MOUNTED = 40
SHOW_MORE = 50

# a message as the log shows it: its turn, question or reply
Shown = tuple[Turn, type[UserMessage] | type[ReplyMessage]]


def widget_for(shown: Shown) -> ChatMessage:
    turn, kind = shown
    return kind(turn, classes="assistant" if kind is ReplyMessage else "user")


def messages_of(turns: list[Turn]) -> list[Shown]:
    shown: list[Shown] = []
    for turn in turns:
        shown.append((turn, UserMessage))
        if turn.reply is not None:
            shown.append((turn, ReplyMessage))
    return shown


class ChatLog(VerticalScroll):
    DEFAULT_CSS = """
    ChatLog { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    ChatLog #earlier { width: 1fr; margin: 1 0 0 0; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden: list[Shown] = []

    def compose(self) -> ComposeResult:
        yield Button("", id="earlier", compact=True)

    def on_mount(self) -> None:
        self._update_earlier()

    def messages(self) -> list[ChatMessage]:
        return [child for child in self.children if isinstance(child, ChatMessage)]

    def reply_of(self, turn: Turn) -> ReplyMessage | None:
        return next((m for m in self.messages() if m.turn is turn and isinstance(m, ReplyMessage)), None)

    async def show(self, turns: list[Turn]) -> None:
        """Replace the whole conversation on screen (a new chat, or one reopened), at its latest turn
        however far up the chat before it was scrolled. The old messages leave the screen at once:
        unmounting a hundred can take seconds on a busy machine."""
        old = self.messages()
        for message in old:
            message.display = False
        shown = messages_of(turns)
        split = max(0, len(shown) - MAX_MOUNTED)
        self.hidden = shown[:split]
        self._update_earlier()
        await self.remove_children(old)
        await self.mount_all([widget_for(message) for message in shown[split:]])
        self.anchor()

    async def remove_turn(self, turn: Turn) -> None:
        await self.remove_children([m for m in self.messages() if m.turn is turn])

    async def trim(self) -> None:
        """Unmount the oldest finished messages beyond MAX_MOUNTED; their turns keep what they said."""
        shown = [m for m in self.messages() if not isinstance(m, ReplyMessage) or m.finished]
        excess = len(self.messages()) - MAX_MOUNTED
        if excess > 0:
            oldest = shown[:excess]
            self.hidden += [(widget.turn, ReplyMessage if isinstance(widget, ReplyMessage) else UserMessage)
                            for widget in oldest]
            await self.remove_children(oldest)
            self._update_earlier()

    async def show_earlier(self) -> None:
        if not self.hidden:
            return
        batch, self.hidden = self.hidden[-SHOW_MORE:], self.hidden[:-SHOW_MORE]
        await self.mount_all([widget_for(message) for message in batch], after=self.query_one("#earlier"))
        self._update_earlier()

    def _update_earlier(self) -> None:
        button = self.query_one("#earlier", Button)
        button.display = bool(self.hidden)
        button.label = f"↑ {len(self.hidden):,} earlier messages · F4 shows {min(SHOW_MORE, len(self.hidden))} more"

    @on(Button.Pressed, "#earlier")
    async def _earlier_pressed(self) -> None:
        await self.show_earlier()
