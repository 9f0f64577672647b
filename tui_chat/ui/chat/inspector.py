"""The token inspector (Enter or a click on a reply's token, a call's token): a token chosen there branches the
reply from it."""

from __future__ import annotations

from textual import on, work

from ...replies import BranchAt
from ..widgets.conversation import ConversationView
from .room import Room


class InspectorRoom(Room):
    @on(ConversationView.InspectorWanted)
    @work(group="inspector")
    async def _inspect(self, event: ConversationView.InspectorWanted) -> None:
        from ..screens.inspector import BranchChoice, InspectorScreen  # with numpy: not at every start

        choice: BranchChoice | None = await self.app.push_screen_wait(InspectorScreen(
            event.tokens, event.text, event.index, event.params, event.cannot_branch, event.probe))
        if choice is not None:
            await self.start(BranchAt(event.turn, choice.index, choice.candidate))
