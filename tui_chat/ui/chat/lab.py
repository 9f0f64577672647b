"""The sampling lab (F10): the chat's last prompt, or the draft in the box, written with 2-4 settings side by
side; Keep puts a column into the chat as the reply, with its settings (the panel follows them)."""

from __future__ import annotations

from textual import work

from ..panel.sampling import SamplingPanel
from .room import Room


class LabRoom(Room):
    @work(group="lab", exclusive=True)
    async def action_lab(self) -> None:
        from ..screens.lab import LabScreen

        session = self.session
        draft = self.view.prompt.text.strip()
        question = draft or (session.turns[-1].question if session.turns else "")
        why_not = ("A reply is still being written: Esc stops it." if self.reply is not None else
                   self.workspace.why_not_side_by_side() or (
                       None if question else "Write a message first: the lab answers it, or the last one."))
        if why_not:
            self.notify(why_not, timeout=4, markup=False)
            return
        spent = session.spent()
        lab = LabScreen(self.workspace.start_reply, session.lab_messages(question), question,
                        session.live.snapshot()[1], session.top_logprobs, spent[-1].decode_tok_s if spent else None)
        index = await self.app.push_screen_wait(lab)
        if index is None or lab.lab is None:
            return
        session.keep_lab(question, lab.lab.columns, index)
        self.query_one(SamplingPanel).set_values(session.live.snapshot()[1].as_dict())
        if draft:
            self.view.prompt.clear()
        await self.view.show(session)
        self.show_figures()
