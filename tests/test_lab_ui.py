"""The sampling lab's screen through Pilot, on the real tiny model: F10 from the chat, columns run side by
side, where a column parted from the first, Keep into the chat as a branch with its settings."""

from __future__ import annotations

import re

from textual.widgets import Button, Input, Static

from test_ui import SIZE, assert_help_lists, chat, loaded, make_app, screen_open, wait_for
from tui_chat.config import history_path
from tui_chat.history import History
from tui_chat.ui.chat.screen import ChatScreen
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.panel.sampling import SamplingPanel
from tui_chat.ui.screens.lab import LabColumn, LabScreen

WIDE = (140, 36)


async def lab_ended(pilot, lab: LabScreen) -> None:
    await wait_for(pilot, lambda: lab.lab is not None and lab.lab.ended is not None, 60)
    await pilot.pause()


async def test_the_lab_key_is_in_f1s_help(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await assert_help_lists(pilot, [("Chat", "f10                    Sampling lab")])


async def test_the_lab_runs_the_last_prompt_side_by_side_and_keeps_a_column_as_a_branch(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=WIDE) as pilot:
        chat_screen = await loaded(pilot)
        await chat(pilot, "Hello there")
        assert len(chat_screen.session.turns[-1].branches) == 1
        await pilot.press("f10")
        lab = await screen_open(pilot, LabScreen)
        assert lab.question == "Hello there"
        columns = list(lab.query(LabColumn))
        assert len(columns) == 2
        columns[1].query_one(Input).value = "temperature=0"
        await pilot.press("f2")  # a third column, a copy of the second
        await pilot.pause()
        assert len(lab.query(LabColumn)) == 3
        columns[1].query_one(Input).value = "temperature=1.5,top_k=0,top_p=1.0,min_p=0,seed=3,max_tokens=12"
        await pilot.press("ctrl+r")
        await lab_ended(pilot, lab)
        assert lab.lab is not None and [len(c.tokens) for c in lab.lab.columns] == [32, 12, 32]
        figures = [str(c.query_one(".lab-figures", Static).render()) for c in lab.query(LabColumn)]
        assert figures[1].startswith("12 tokens") and "max tokens" in figures[1]
        assert lab.lab.divergence(1) is not None and "parted from column 1 at token" in figures[1]
        assert "same tokens as column 1" in figures[2]
        status = str(lab.query_one("#lab-status", Static).render())
        assert "read once for 3 columns" in status and "× a token of the chat's last reply" in status
        kept_text = lab.lab.columns[1].text
        await pilot.click(list(lab.query(LabColumn))[1].query_one(Button))
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ChatScreen))
        await pilot.pause()
        turn = chat_screen.session.turns[-1]
        assert len(chat_screen.session.turns) == 1 and len(turn.branches) == 4
        assert turn.reply is not None and turn.reply.text == kept_text and turn.active == 2
        assert turn.reply.footer.startswith("lab: temperature=1.5")
        panel = chat_screen.query_one(MetricsPanel)
        assert panel.metrics is turn.reply.metrics, "the panel shows the kept column's figures (issue 38)"
        assert re.search(r"out 12\b", str(panel.query_one("#tokens").render()))
        assert chat_screen.live.snapshot()[1].temperature == 1.5
        assert chat_screen.query_one(SamplingPanel).query_one("#temperature").value == 1.5
        stored = History(history_path()).load(chat_screen.session.conversation_id)
        assert stored.path[-1].content == kept_text and len(stored.siblings(stored.path[-1])) == 4


async def test_the_lab_answers_the_draft_as_a_new_turn(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=WIDE) as pilot:
        chat_screen = await loaded(pilot)
        chat_screen.view.prompt.text = "Tell me about Paris"
        await pilot.press("f10")
        lab = await screen_open(pilot, LabScreen)
        await pilot.press("ctrl+r")
        await lab_ended(pilot, lab)
        await pilot.click(list(lab.query(LabColumn))[1].query_one(Button))
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ChatScreen))
        await pilot.pause()
        assert [turn.question for turn in chat_screen.session.turns] == ["Tell me about Paris"]
        assert len(chat_screen.session.turns[0].branches) == 2 and chat_screen.session.turns[0].active == 1
        assert chat_screen.view.prompt.text == ""


async def test_escape_leaves_the_lab_and_nothing_is_kept(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=WIDE) as pilot:
        chat_screen = await loaded(pilot)
        await chat(pilot, "Hello there")
        await pilot.press("f10")
        await screen_open(pilot, LabScreen)
        await pilot.press("ctrl+r", "escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ChatScreen))
        assert len(chat_screen.session.turns[-1].branches) == 1


async def test_the_lab_opens_on_a_contrast_and_tab_goes_from_settings_to_settings(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=WIDE) as pilot:
        chat_screen = await loaded(pilot)
        chat_screen.live.update(temperature=0.0)
        await chat(pilot, "Hello there")
        await pilot.press("f10")
        lab = await screen_open(pilot, LabScreen)
        first, second = (column.query_one(Input) for column in lab.query(LabColumn))
        assert first.value.startswith("temperature=0,")
        assert second.value.startswith("temperature=1,") and second.value.endswith(",seed=7")
        assert pilot.app.focused is first
        await pilot.press("tab")
        assert pilot.app.focused is second  # not the first column's empty reply


async def test_a_column_that_ended_on_a_stop_sequence_does_not_show_it():
    """As the chat and `run --compare` show it: the reply's text, not the tokens that made up the stop (issue 38)."""
    from textual.app import App

    from tui_chat.engine.base import Done, Token, TurnMetrics
    from tui_chat.engine.params import LiveParams
    from tui_chat.lab import Column

    class Holder(App):
        def compose(self):
            yield LabColumn(0, "temperature=0")

    pieces = [" Red", ",", " blue", " and", " green", ".", "\n", "User", ":"]
    column = Column("temperature=0", LiveParams(), [Token(i, piece, 0.0, 0, piece)
                                                    for i, piece in enumerate(pieces)])
    column.done = Done("stop", "Red, blue and green.", TurnMetrics(), stop_sequence="\nUser:")
    async with Holder().run_test() as pilot:
        lab_column = pilot.app.query_one(LabColumn)
        lab_column.show(column, [], None, "")
        await pilot.pause()
        assert str(lab_column.query_one(".lab-text", Static).render()) == "Red, blue and green."
