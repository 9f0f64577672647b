"""The conversation's own keys and the changes to it the user makes on screen: a message sent, a reply stopped,
written again or gone on with, copy the last reply, earlier messages, the message box, walking the messages,
editing or deleting a message, a reply's branches, the heatmap, the thinking switch."""

from __future__ import annotations

import time

from ...replies import Again, Ask, Refused
from ...session import Turn
from ...wording import no_thinking_note
from ..keys import CONFIRM_WITHIN_S
from ..widgets.messages import ReplyMessage, UserMessage
from ..widgets.prompt import PromptInput
from .room import Room


class ConversationRoom(Room):
    _delete_asked: tuple[Turn, float] | None = None

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        """A message waits for a model on its way, even with another one loaded: the reply is written, and
        saved, by the model the chat is on."""
        if not isinstance(await self.chat.start(Ask(event.text)), Refused):
            self.chat.view.prompt.clear()

    async def action_reply(self, how: str) -> None:
        """Esc stops the reply being written; Ctrl+R writes another version of the last one, F8 goes on with it."""
        if how == "stop":
            self.chat.session.stop()
            self.action_to_box()  # Esc leaves where it was pressed, whatever else it did
        elif self.chat.reply is None:
            await self.chat.start(Again("regenerate" if how == "regenerate" else "continue"))

    def action_copy_last(self) -> None:
        self.chat.view.copy_last()

    async def action_show_earlier(self) -> None:
        await self.chat.view.log_view.show_earlier()

    def action_to_box(self) -> None:
        self.chat.view.prompt.focus()

    def action_focus_message(self, step: int) -> None:
        self.chat.view.focus_message(step)

    def action_edit_last(self) -> None:
        self.chat.view.edit_last()

    async def action_toggle_heatmap(self) -> None:
        await self.chat.view.toggle_heatmap()

    def action_toggle_thinking(self) -> None:
        session = self.chat.session
        session.set_thinking(not session.thinking)
        self.chat.panels.show_title()
        switch = "on" if session.thinking else "off"
        backend = self.chat.workspace.backend
        note = no_thinking_note(backend.info) if backend is not None and backend.info is not None else None
        if note:
            self.chat.notify(f"{note}. Kept with the chat: thinking {switch}.", severity="warning", timeout=6,
                             markup=False)
        else:
            self.chat.notify(f"Thinking {switch} in this chat, from the next reply", timeout=3, markup=False)

    async def on_user_message_edit(self, event: UserMessage.Edit) -> None:
        """Editing a message takes it and what follows off the chat (they stay in the history, off the
        active path); deleting removes them from the history too, after a second press."""
        session, view = self.chat.session, self.chat.view
        position = session.position(event.turn)
        if position is None:
            return  # already taken off: the same key twice in one read of the terminal
        if session.writing is not None:
            self.chat.notify("A reply is being written: Esc stops it first.", severity="warning", timeout=4)
            return
        if event.delete and not self._confirmed(event.turn):
            later = len(session.turns) - position - 1
            after = {0: "", 1: " and the turn after it"}.get(later, f" and the {later} turns after it")
            self.chat.notify(f"Delete this message{after}? Press Delete again.", timeout=CONFIRM_WITHIN_S,
                             markup=False)
            return
        gone = session.delete_from(event.turn) if event.delete else session.rewind(event.turn)
        for turn in gone:
            await view.log_view.remove_turn(turn)
        if not event.delete:
            view.prompt.set_draft(event.turn.question)
        view.prompt.focus()
        self.chat.panels.show_figures()  # the reply now last on screen: a deleted one's figures go with it

    def _confirmed(self, turn: Turn) -> bool:
        asked, self._delete_asked = self._delete_asked, (turn, time.monotonic())
        return asked is not None and asked[0] is turn and time.monotonic() - asked[1] < CONFIRM_WITHIN_S

    async def on_reply_message_switch_branch(self, event: ReplyMessage.SwitchBranch) -> None:
        reason = self.chat.session.why_not_branch(event.reply.turn)
        if reason:
            self.chat.notify(reason.replace("branched", "switched"), severity="warning", timeout=4, markup=False)
            return
        self.chat.session.switch(event.index)
        await event.reply.show_branch()
        self.chat.panels.show_figures(event.reply.turn)
