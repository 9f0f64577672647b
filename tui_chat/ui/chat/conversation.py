"""The conversation's own keys and the changes to it the user makes on screen: copy the last reply, earlier
messages, the message box, walking the messages, editing or deleting a message, a reply's branches, the
heatmap, the thinking switch."""

from __future__ import annotations

import time

from textual import on

from ...session import Turn
from ...wording import no_thinking_note
from ..keys import CONFIRM_WITHIN_S
from ..widgets.messages import ReplyMessage, UserMessage
from .room import Room


class ConversationRoom(Room):
    _delete_asked: tuple[Turn, float] | None = None

    def action_copy_last(self) -> None:
        self.view.copy_last()

    async def action_show_earlier(self) -> None:
        await self.view.log_view.show_earlier()

    def action_to_box(self) -> None:
        self.view.prompt.focus()

    def action_focus_message(self, step: int) -> None:
        self.view.focus_message(step)

    def action_edit_last(self) -> None:
        self.view.edit_last()

    async def action_toggle_heatmap(self) -> None:
        await self.view.toggle_heatmap()

    def action_toggle_thinking(self) -> None:
        session = self.session
        session.set_thinking(not session.thinking)
        self.show_title()
        switch = "on" if session.thinking else "off"
        backend = self.workspace.backend
        note = no_thinking_note(backend.info) if backend is not None and backend.info is not None else None
        if note:
            self.notify(f"{note}. Kept with the chat: thinking {switch}.", severity="warning", timeout=6, markup=False)
        else:
            self.notify(f"Thinking {switch} in this chat, from the next reply", timeout=3, markup=False)

    @on(UserMessage.Edit)
    async def _edit(self, event: UserMessage.Edit) -> None:
        """Editing a message takes it and what follows off the chat (they stay in the history, off the
        active path); deleting removes them from the history too, after a second press."""
        position = self.session.position(event.turn)
        if position is None:
            return  # already taken off: the same key twice in one read of the terminal
        if self.session.writing is not None:
            self.notify("A reply is being written: Esc stops it first.", severity="warning", timeout=4)
            return
        if event.delete and not self._confirmed(event.turn):
            later = len(self.session.turns) - position - 1
            after = {0: "", 1: " and the turn after it"}.get(later, f" and the {later} turns after it")
            self.notify(f"Delete this message{after}? Press Delete again.", timeout=CONFIRM_WITHIN_S, markup=False)
            return
        gone = self.session.delete_from(event.turn) if event.delete else self.session.rewind(event.turn)
        for turn in gone:
            await self.view.log_view.remove_turn(turn)
        if not event.delete:
            self.view.prompt.set_draft(event.turn.question)
        self.view.prompt.focus()
        self.show_figures()  # the reply now last on screen: a deleted one's figures go with it

    def _confirmed(self, turn: Turn) -> bool:
        asked, self._delete_asked = self._delete_asked, (turn, time.monotonic())
        return asked is not None and asked[0] is turn and time.monotonic() - asked[1] < CONFIRM_WITHIN_S

    @on(ReplyMessage.SwitchBranch)
    async def _switch_branch(self, event: ReplyMessage.SwitchBranch) -> None:
        reason = self.session.why_not_branch(event.reply.turn)
        if reason:
            self.notify(reason.replace("branched", "switched"), severity="warning", timeout=4, markup=False)
            return
        self.session.switch(event.index)
        await event.reply.show_branch()
        self.show_figures(event.reply.turn)
