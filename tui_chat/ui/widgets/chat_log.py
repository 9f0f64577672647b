"""The conversation pane. Only the most recent messages are mounted: layout and every width change
cost time in proportion to the widgets on screen, and a long chat should stream as fast as a new one.
Earlier messages come back on request, a batch at a time."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Button

from ...engine.base import Message
from .messages import Branch, ChatMessage, ReplyMessage, UserMessage

MAX_MOUNTED = 100
SHOW_MORE = 50

@dataclass(frozen=True, slots=True)
class Entry:
    """A message as the log shows it; a finished reply has a footer and may have sibling branches."""

    message: Message
    footer: str | None = None
    message_id: int | None = None
    branches: tuple[Branch, ...] = ()
    active: int = 0


def widget_for(entry: Entry) -> ChatMessage:
    message = entry.message
    if message.role == "assistant":
        branches = list(entry.branches) or [Branch(message.content, entry.footer or "", message_id=entry.message_id)]
        return ReplyMessage(message.content, entry.footer or "", branches, entry.active, classes="assistant")
    return UserMessage(message.content, entry.message_id, classes="user")


def entry_of(widget: ChatMessage) -> Entry:
    if isinstance(widget, ReplyMessage):
        return Entry(Message("assistant", widget.text), widget.footer, widget.message_id, tuple(widget.branches),
                     widget.active)
    return Entry(Message("user", widget.text), None, widget.message_id)


class ChatLog(VerticalScroll):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hidden: list[Entry] = []

    def compose(self) -> ComposeResult:
        yield Button("", id="earlier", compact=True)

    def on_mount(self) -> None:
        self._update_earlier()

    def messages(self) -> list[ChatMessage]:
        return [child for child in self.children if isinstance(child, ChatMessage)]

    async def show(self, entries: list[Entry]) -> None:
        """Replace the whole conversation on screen (a new chat, or one reopened)."""
        await self.remove_children(self.messages())
        split = max(0, len(entries) - MAX_MOUNTED)
        self.hidden = list(entries[:split])
        await self.mount_all([widget_for(entry) for entry in entries[split:]])
        self._update_earlier()

    async def trim(self) -> None:
        """Unmount the oldest finished messages beyond MAX_MOUNTED, keeping what they said."""
        shown = [m for m in self.messages() if not isinstance(m, ReplyMessage) or m.footer is not None]
        excess = len(self.messages()) - MAX_MOUNTED
        if excess > 0:
            oldest = shown[:excess]
            self.hidden += [entry_of(widget) for widget in oldest]
            await self.remove_children(oldest)
            self._update_earlier()

    async def show_earlier(self) -> None:
        if not self.hidden:
            return
        batch, self.hidden = self.hidden[-SHOW_MORE:], self.hidden[:-SHOW_MORE]
        await self.mount_all([widget_for(entry) for entry in batch], after=self.query_one("#earlier"))
        self._update_earlier()

    def _update_earlier(self) -> None:
        button = self.query_one("#earlier", Button)
        button.display = bool(self.hidden)
        button.label = f"↑ {len(self.hidden):,} earlier messages · F4 shows {min(SHOW_MORE, len(self.hidden))} more"

    @on(Button.Pressed, "#earlier")
    async def _earlier_pressed(self) -> None:
        await self.show_earlier()
