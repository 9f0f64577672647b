"""Issue 44, item 12: Ctrl+L listed a chat as `19 messages` with 10 on screen: the count took every message kept
in the history, the edited, regenerated and forked ones off the chat's path too. It counts the path now."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import OptionList

from test_ui import SIZE, loaded, make_app, reply_done, send, wait_for
from tui_chat.config import history_path
from tui_chat.history import History
from tui_chat.ui.screens.conversations import ConversationsScreen
from tui_chat.ui.widgets.messages import ChatMessage


def test_a_chats_count_is_the_messages_on_its_path(tmp_path: Path):
    with History(tmp_path / "history.sqlite3") as history:
        chat = history.create(model="tiny")
        first = history.add_user_message(chat, "First try", None)
        history.start_reply(chat, first).finish("Hello.", "eos")
        edited = history.add_user_message(chat, "Second try", None)  # the first message edited
        answer = history.start_reply(chat, edited)
        answer.finish("Hi.", "eos")
        history.start_reply(chat, edited).finish("Hey.", "eos")  # regenerated
        follow_up = history.add_user_message(chat, "And then?", answer.id)
        history.start_reply(chat, follow_up).finish("Then this.", "eos")
        empty = history.create(model="tiny")

        counts = {summary.id: summary.messages for summary in history.conversations()}
        assert counts == {chat: 2, empty: 0}, "on the path: the edit and its newest reply"
        history.set_active(answer.id)
        assert {s.id: s.messages for s in history.conversations()}[chat] == len(history.load(chat).path) == 4
        history.set_active(first)
        assert {s.id: s.messages for s in history.conversations("then")}[chat] == len(history.load(chat).path) == 2


async def test_ctrl_l_counts_the_messages_the_chat_shows(tiny_model):
    """A reply regenerated, then the last message edited and sent again: two turns on screen, and in the list."""
    async with make_app(str(tiny_model)).run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        for question in ("Hello there", "And then?"):
            await send(pilot, question)
            await reply_done(pilot)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(screen.session.turns[-1].branches) == 2 and screen.reply is None)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: len(screen.session.turns) == 1)
        await send(pilot, "And after that?")
        await reply_done(pilot)
        shown = len(screen.query(ChatMessage))
        assert shown == 4
        with History(history_path()) as history:
            [summary] = history.conversations()
            assert len(history.load(summary.id).messages) == 7, "the branches off the path are kept"

        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConversationsScreen))
        await pilot.pause()
        listed = str(pilot.app.screen.query_one(OptionList).get_option_at_index(0).prompt)
        assert f" · {shown} messages · " in listed
