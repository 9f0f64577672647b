"""The token inspector (Enter or a click on a reply's token, a call's token): a token chosen there branches the
reply from it."""

from __future__ import annotations

from textual import on, work

from ..widgets.conversation import ConversationView
from .room import Room


class InspectorRoom(Room):
    @on(ConversationView.InspectorWanted)
    @work(group="inspector")
    async def _inspect(self, event: ConversationView.InspectorWanted) -> None:
        from ..screens.inspector import BranchChoice, InspectorScreen  # with numpy: not at every start

        choice: BranchChoice | None = await self.app.push_screen_wait(InspectorScreen(
            event.tokens, event.text, event.index, event.params, event.cannot_branch, event.probe))
        reason = None if choice is None else self.session.why_not_branch(event.turn) or self.loader.in_flight() or (
            None if self.workspace.backend is not None else "No model is loaded.")
        if reason:
            self.notify(reason, severity="warning", timeout=4, markup=False)
        elif choice is not None and self.workspace.backend is not None:
            await self.started(self.session.branch(choice.index, choice.candidate, self.workspace.backend.generate))
