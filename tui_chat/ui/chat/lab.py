"""The sampling lab (F10): the chat's last prompt, or the draft in the box, written with 2-4 settings side by
side; Keep puts a column into the chat as the reply, with its settings (the panel follows them)."""

from __future__ import annotations

from .room import Room


class LabRoom(Room):
    def action_lab(self) -> None:
        self.chat.work(self._run, group="lab", exclusive=True)

    async def _run(self) -> None:
        from ..screens.lab import LabScreen

        chat = self.chat
        session = chat.session
        draft = chat.view.prompt.text.strip()
        question = draft or (session.turns[-1].question if session.turns else "")
        why_not = ("A reply is still being written: Esc stops it." if chat.reply is not None else
                   chat.workspace.why_not_side_by_side() or (
                       None if question else "Write a message first: the lab answers it, or the last one."))
        if why_not:
            chat.notify(why_not, timeout=4, markup=False)
            return
        spent = session.spent()
        lab = LabScreen(chat.workspace.start_reply, session.lab_messages(question), question,
                        session.live.snapshot()[1], session.top_logprobs, spent[-1].decode_tok_s if spent else None)
        index = await chat.app.push_screen_wait(lab)
        if index is None or lab.lab is None:
            return
        session.keep_lab(question, lab.lab.columns, index)
        chat.panels.sampling.set_values(session.live.snapshot()[1].as_dict())
        if draft:
            chat.view.prompt.clear()
        await chat.view.show(session)
        chat.panels.show_figures()
