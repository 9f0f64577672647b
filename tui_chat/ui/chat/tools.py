"""Tools (F9): the MCP servers and their tools switched on for this chat; a call's consent asked here, where the
call is shown, over whatever screen is up; a reopened chat's tools back on."""

from __future__ import annotations

from textual import on

from ..screens.consent import ConsentScreen, ConsentWanted
from .room import Room


class ToolsRoom(Room):
    def action_tools(self) -> None:
        from ..screens.tools import ToolsScreen

        if problem := self.workspace.reload_tool_servers():
            self.notify(problem, severity="warning", timeout=8, markup=False)
        self.app.push_screen(ToolsScreen(self.workspace))

    @on(ConsentWanted)
    def _consent(self, event: ConsentWanted) -> None:
        self.app.push_screen(ConsentScreen(event.call, event.answer))
