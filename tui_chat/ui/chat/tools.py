"""Tools (F9): the MCP servers and their tools switched on for this chat; a call's consent asked here, where the
call is shown, over whatever screen is up; a reopened chat's tools back on."""

from __future__ import annotations

from textual import on

from ..screens.consent import ConsentScreen, ConsentWanted
from .room import Room


class ToolsRoom(Room):
    # A question that came before the batch holding its call: the dialog waits for it, so that the call is saved
    # (and survives a kill -9) before anyone can be asked about it.
    _consent_due: ConsentWanted | None = None

    def action_tools(self) -> None:
        from ..screens.tools import ToolsScreen

        if problem := self.workspace.reload_tool_servers():
            self.notify(problem, severity="warning", timeout=8, markup=False)
        self.app.push_screen(ToolsScreen(self.workspace))

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
