"""Ctrl+L: the saved chats. Search titles and text, open one to go on with it, rename, delete, export."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ...export import to_json, to_markdown
from ...history import ConversationSummary, HistoryError, model_label
from ...safetext import screen_safe
from ...units import local_time
from ...workspace import Workspace
from ..keys import CONFIRM_WITHIN_S
from .ask import AskText
from .dialog import Dialog


def summary_line(summary: ConversationSummary) -> Text:
    when = local_time(summary.updated_at)
    line = Text(screen_safe(summary.title or "(untitled)"), style="bold")
    plural = "" if summary.messages == 1 else "s"
    line.append(f"\n  {when} · {summary.messages} message{plural} · {screen_safe(model_label(summary.model))}",
                style="dim")
    return line


class ConversationsScreen(Dialog[int | None]):
    """Returns the id of the chat to open, or None."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("down", "move(1)", "Next", show=False),
        Binding("up", "move(-1)", "Previous", show=False),
        Binding("ctrl+r", "rename", "Rename", priority=True),  # priority: the search box has its own ctrl+d, ctrl+e
        Binding("ctrl+d", "delete", "Delete", priority=True),
        Binding("ctrl+e", "export('md')", "Export Markdown", priority=True),
        Binding("ctrl+s", "export('json')", "Export JSON", priority=True),
    ]
    DEFAULT_CSS = """
    ConversationsScreen > Vertical { width: 90; height: 90%; }
    ConversationsScreen OptionList { height: 1fr; margin: 1 0 0 0; }
    """

    def __init__(self, workspace: Workspace, exports: Path) -> None:
        super().__init__()
        self.workspace = workspace
        self.history = workspace.chats  # the chat screen offers saved chats only where the history opened
        self.exports = exports
        self.shown: list[ConversationSummary] = []
        self._delete_asked: tuple[int, float] | None = None

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Chats"
            yield Input(placeholder="Search titles and messages", id="search")
            yield OptionList(id="chats")
            yield Static(Content("Enter opens · Ctrl+R rename · Ctrl+D delete · Ctrl+E Markdown · "
                                 "Ctrl+S JSON export · Esc closes"), classes="hint")

    def on_mount(self) -> None:
        self._refresh()
        self.query_one("#search").focus()

    @on(Input.Changed, "#search")
    def _refresh(self) -> None:
        try:
            self.shown = self.history.conversations(self.query_one("#search", Input).value.strip() or None)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        chats = self.query_one(OptionList)
        chats.clear_options()
        chats.add_options([Option(summary_line(summary), id=str(summary.id)) for summary in self.shown])
        if self.shown:
            chats.highlighted = 0
        self.query_one(Vertical).border_subtitle = f"{len(self.shown)} saved"

    def _chosen(self) -> ConversationSummary | None:
        index = self.query_one(OptionList).highlighted
        return self.shown[index] if index is not None and index < len(self.shown) else None

    def action_move(self, step: int) -> None:
        chats = self.query_one(OptionList)
        if self.shown:
            chats.highlighted = max(0, min((chats.highlighted or 0) + step, len(self.shown) - 1))

    @on(Input.Submitted, "#search")
    def _open_highlighted(self) -> None:
        chosen = self._chosen()
        if chosen is not None:
            self.dismiss(chosen.id)

    @on(OptionList.OptionSelected)
    def _open(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.shown[event.option_index].id)

    def action_rename(self) -> None:
        chosen = self._chosen()
        if chosen is not None:
            self.app.push_screen(AskText("Rename", chosen.title, "A new title for this chat."),
                                 lambda title: self._renamed(chosen.id, title))

    def _renamed(self, conversation_id: int, title: str | None) -> None:
        if title is None:
            return
        try:
            self.history.update(conversation_id, title=title)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
        self._refresh()

    def action_delete(self) -> None:
        """Deleting asks once: the same key again within a few seconds confirms it."""
        chosen = self._chosen()
        if chosen is None:
            return
        asked = self._delete_asked
        if asked is None or asked[0] != chosen.id or time.monotonic() - asked[1] > CONFIRM_WITHIN_S:
            self._delete_asked = (chosen.id, time.monotonic())
            self.notify(f"Delete “{chosen.title}” and all its messages? Ctrl+D again to confirm.",
                        severity="warning", timeout=CONFIRM_WITHIN_S, markup=False)
            return
        self._delete_asked = None
        try:
            self.workspace.delete_chat(chosen.id)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
        self._refresh()

    def action_export(self, kind: str) -> None:
        chosen = self._chosen()
        if chosen is None:
            return
        target = self.exports / f"chat-{chosen.id}.{kind}"
        try:
            conversation = self.history.load(chosen.id)
            text = to_markdown(conversation) if kind == "md" else json.dumps(to_json(conversation), indent=2)
            self.exports.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.write_text(text, encoding="utf-8")
            partial.replace(target)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        except OSError as error:
            self.notify(f"cannot write {target}: {error.strerror}", severity="error", markup=False)
            return
        self.notify(f"Exported to {target}", timeout=6, markup=False)
