"""Tools (F9): the MCP servers and their tools switched on for this chat; a call's consent asked here, where the
call is shown, over whatever screen is up; a reopened chat's tools back on; a reply that starts with a tool choice
no tool is on to meet, said."""

from __future__ import annotations

from functools import partial

from ...session import ChatSession
from ...tools.calls import AUTO, CHOICES
from ...tools.mcp import Tool
from ..screens.consent import ConsentScreen, ConsentWanted
from ..screens.tools import ToolsScreen, unused_choice_note
from .room import ChatReopened, ReplyStarted, Room, ToolCallsShown


class ToolsRoom(Room):
    # A question that came before the batch holding its call: the dialog waits for it, so that the call is saved
    # (and survives a kill -9) before anyone can be asked about it.
    _consent_due: ConsentWanted | None = None

    def action_tools(self) -> None:
        if problem := self.chat.workspace.reload_tool_servers():
            self.chat.notify(problem, severity="warning", timeout=8, markup=False)
        self.chat.app.push_screen(ToolsScreen(self.chat.workspace))

    def on_reply_started(self, _: ReplyStarted) -> None:
        """A reply that starts without the call its tool choice asks for says so (F9 set `required` and no tool)."""
        if note := unused_choice_note(self.chat.session):
            self.chat.notify(f"{note} F9 switches tools on.", severity="warning", timeout=8, markup=False)

    def on_consent_wanted(self, event: ConsentWanted) -> None:
        self._consent_due = event
        self._ask_due_consent()

    def on_tool_calls_shown(self, _: ToolCallsShown) -> None:
        self._ask_due_consent()

    def _ask_due_consent(self) -> None:
        """Open the consent dialog once its call is in the reply being written; a question the reply stopped
        before (its Future cancelled) is dropped."""
        due, writing = self._consent_due, self.chat.session.writing
        if due is None or (not due.answer.done() and (writing is None or due.call not in writing.tool_calls)):
            return
        self._consent_due = None
        if not due.answer.done():
            self.chat.app.push_screen(ConsentScreen(due.call, due.answer))

    def on_chat_reopened(self, event: ChatReopened) -> None:
        """A reopened chat's tools back on as it had them, their servers started on a worker thread; what is not
        there any more is said."""
        if event.session.tool_switches.on:
            self.chat.work(partial(self._restore, event.session), group="chat-tools", thread=True)

    def _restore(self, session: ChatSession) -> None:
        tools, notes = self.chat.workspace.start_chat_tools(session.tool_switches)
        self.chat.app.call_from_thread(self._restored, session, tools, notes)

    def _restored(self, session: ChatSession, tools: list[Tool], notes: list[str]) -> None:
        workspace = self.chat.workspace
        if workspace.session is not session:
            return  # another chat by now
        choice = session.tool_switches.choice
        choice = choice if choice in CHOICES or any(tool.name == choice for tool in tools) else AUTO
        workspace.use_tools(tools, choice, remember=False)
        names = ", ".join(tool.name for tool in tools) or "none"
        self.chat.notify(" · ".join([f"This chat's tools are on again: {names} (F9)", *notes]), timeout=6,
                         severity="warning" if notes else "information", markup=False)
