"""The token inspector (Enter or a click on a reply's token, a call's token): a token chosen there branches the
reply from it."""

from __future__ import annotations

from functools import partial

from ...replies import BranchAt
from ..widgets.conversation import ConversationView
from .room import Room


class InspectorRoom(Room):
    def on_conversation_view_inspector_wanted(self, event: ConversationView.InspectorWanted) -> None:
        self.chat.work(partial(self._inspect, event), group="inspector")

    async def _inspect(self, event: ConversationView.InspectorWanted) -> None:
        from ..screens.inspector import BranchChoice, InspectorScreen  # with numpy: not at every start

        choice: BranchChoice | None = await self.chat.app.push_screen_wait(InspectorScreen(
            event.tokens, event.text, event.index, event.params, event.cannot_branch, event.probe))
        if choice is not None:
            await self.chat.start(BranchAt(event.turn, choice.index, choice.candidate))
