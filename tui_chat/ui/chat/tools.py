"""Tools (F9): the MCP servers and their tools switched on for this chat; a call's consent asked here, where the
call is shown, over whatever screen is up; a reopened chat's tools back on; a reply that starts with a tool choice
no tool is on to meet, said."""

from __future__ import annotations

from textual import on

from ...session import Turn
from ..screens.consent import ConsentScreen, ConsentWanted
from ..screens.tools import ToolsScreen, unused_choice_note
from .room import Room


class ToolsRoom(Room):
    # A question that came before the batch holding its call: the dialog waits for it, so that the call is saved
    # (and survives a kill -9) before anyone can be asked about it.
    _consent_due: ConsentWanted | None = None

    def action_tools(self) -> None:
        if problem := self.workspace.reload_tool_servers():
            self.notify(problem, severity="warning", timeout=8, markup=False)
        self.app.push_screen(ToolsScreen(self.workspace))

    async def _started(self, turn: Turn) -> None:
        """A reply that starts without the call its tool choice asks for says so (F9 set `required` and no tool)."""
        await super()._started(turn)
        if note := unused_choice_note(self.session):
            self.notify(f"{note} F9 switches tools on.", severity="warning", timeout=8, markup=False)

    @on(ConsentWanted)
    def _consent(self, event: ConsentWanted) -> None:
        self._consent_due = event
        self.ask_due_consent()

    def ask_due_consent(self) -> None:
        """Open the consent dialog once its call is in the reply being written; a question the reply stopped
        before (its Future cancelled) is dropped."""
        due, writing = self._consent_due, self.session.writing
        if due is None or (not due.answer.done() and (writing is None or due.call not in writing.tool_calls)):
            return
        self._consent_due = None
        if not due.answer.done():
            self.app.push_screen(ConsentScreen(due.call, due.answer))
