"""Saved chats in the TUI: what the chat screen writes to the real SQLite history, and the chats list,
the system prompt editor and reopening, driven through Pilot on the real tiny model."""

from __future__ import annotations

import json

from textual.widgets import Input, OptionList, TextArea

from test_ui import SIZE, chat, loaded, make_app, reply_done, said, screen_open, send, wait_for
from tui_chat.config import data_dir, history_path
from tui_chat.engine.base import Message
from tui_chat.engine.params import SamplingParams
from tui_chat.history import History
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.panel.sampling import SamplingPanel
from tui_chat.ui.screens.ask import AskText
from tui_chat.ui.screens.conversations import ConversationsScreen
from tui_chat.ui.screens.inspector import InspectorScreen
from tui_chat.ui.widgets.messages import ReplyMessage, UserMessage


def stored() -> list:
    with History(history_path()) as history:
        return [history.load(summary.id) for summary in history.conversations()]


async def chats_open(pilot) -> ConversationsScreen:
    await pilot.press("ctrl+l")
    return await screen_open(pilot, ConversationsScreen)


async def test_each_message_and_reply_is_saved_with_its_metrics(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello there")
        first = await reply_done(pilot)
        await send(pilot, "And then?")
        await reply_done(pilot)
    [conversation] = stored()
    assert conversation.title == "Hello there"
    assert conversation.model == str(tiny_model)
    assert [(m.role, m.state) for m in conversation.path] == [("user", "complete"), ("assistant", "complete")] * 2
    assert conversation.path[1].content == first.text
    metrics = conversation.path[1].metrics
    assert metrics["completion_tokens"] > 0 and metrics["ttft_s"] > 0 and "cost_usd" in metrics


async def test_a_chat_reopens_with_its_settings_system_prompt_and_branches(tiny_model):
    app = make_app(str(tiny_model), system_prompt="Be brief.")
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        screen.query_one(SamplingPanel).set_values({"top_k": 7, "max_tokens": 16})
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        original = reply.text
        await pilot.press("ctrl+t")
        reply.focus()
        await pilot.press("right", "enter")
        await screen_open(pilot, InspectorScreen)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: screen.reply is None and len(reply.branches) == 2)
        branched = reply.text
        panel = screen.query_one(MetricsPanel)
        assert panel.metrics is reply.branches[1].metrics
        kv = panel.kv_used
        reply.focus()
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert panel.metrics is reply.branches[0].metrics, "the panel follows the branch on screen (issue 38)"
        assert panel.kv_used == kv, "the cache holds what the last reply written left there"

        await pilot.press("ctrl+n")
        await pilot.pause()
        screen.query_one(SamplingPanel).set_values({"top_k": 40})
        assert not screen.query(UserMessage) and screen.session.system_prompt == "Be brief."

        chats = await chats_open(pilot)
        assert chats.query_one(OptionList).option_count == 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.is_current and screen.query(ReplyMessage))
        await pilot.pause()
        reopened = screen.query_one(ReplyMessage)
        assert reopened.text == original and [b.text for b in reopened.branches] == [original, branched]
        assert reopened.branches[1].cut == 1
        assert screen.live.snapshot()[1].top_k == 7
        assert said(screen) == [Message("user", "Hello there"), Message("assistant", original)]
        assert screen.session.messages()[0] == Message("system", "Be brief.")

        await send(pilot, "Go on")
        await reply_done(pilot)
    [conversation] = stored()
    assert [m.content for m in conversation.path[:2]] == ["Hello there", original]
    assert conversation.path[2].content == "Go on" and len(conversation.path) == 4
    forks = [m for m in conversation.messages if m.fork_of is not None]
    assert [(m.content, m.fork_token) for m in forks] == [(branched, 1)]


async def test_the_panels_session_cost_comes_back_with_a_reopened_chat(tiny_model):
    """The panel sums the session from the chat's replies, not from a list of its own: reopened, a chat
    costs what it did (issue 26: it showed nothing spent)."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chat(pilot, "Hello there", "And then?")

        def session_lines() -> list[str]:
            cost = str(screen.query_one(MetricsPanel).query_one("#cost").render())
            return [line for line in cost.splitlines() if line.startswith(("Reply", "Session", "Saved"))]

        spent = session_lines()
        assert spent and "$0.000000" not in spent[0]
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert session_lines()[0].endswith("$0.000000")
        await chats_open(pilot)
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.is_current and screen.query(ReplyMessage))
        await pilot.pause()
        assert session_lines() == spent, "the reply's figures are the reopened chat's last reply's (issue 38)"
        tokens = str(screen.query_one(MetricsPanel).query_one("#tokens").render())
        assert f"out {screen.session.turns[-1].reply.metrics.completion_tokens:,}" in tokens


async def test_the_system_prompt_editor_sets_it_for_this_chat(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        await pilot.press("f6")
        await wait_for(pilot, lambda: isinstance(app.screen, AskText))
        app.screen.query_one(TextArea).text = "You are a pirate.\nAnswer in one line."
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert screen.session.system_prompt == "You are a pirate.\nAnswer in one line."
        assert screen.session.messages()[0] == Message("system", "You are a pirate.\nAnswer in one line.")
    [conversation] = stored()
    assert conversation.system_prompt == "You are a pirate.\nAnswer in one line."


async def test_chats_list_searches_renames_deletes_and_exports(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for question in ("Tell me about cats", "Tell me about dogs"):
            await send(pilot, question)
            await reply_done(pilot)
            await pilot.press("ctrl+n")
        chats = await chats_open(pilot)
        assert chats.query_one(OptionList).option_count == 2
        chats.query_one("#search", Input).value = "cats"
        await pilot.pause()
        assert [s.title for s in chats.shown] == ["Tell me about cats"]

        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, AskText))
        app.screen.query_one(Input).value = "Felines"
        await pilot.press("enter")
        await pilot.pause()
        chats.query_one("#search", Input).value = ""
        await pilot.pause()
        assert {s.title for s in chats.shown} == {"Felines", "Tell me about dogs"}

        await pilot.press("ctrl+e", "ctrl+s")
        await pilot.pause()
        exported = data_dir() / "exports"
        newest = chats.shown[0]
        assert f"# {newest.title}" in (exported / f"chat-{newest.id}.md").read_text()
        assert json.loads((exported / f"chat-{newest.id}.json").read_text())["title"] == newest.title

        assert [s.title for s in chats.shown] == ["Felines", "Tell me about dogs"]
        await pilot.press("down", "ctrl+d")
        await pilot.pause()
        assert len(chats.shown) == 2, "the first Ctrl+D only asks"
        await pilot.press("ctrl+d")
        await pilot.pause()
        assert [s.title for s in chats.shown] == ["Felines"]
    assert [c.title for c in stored()] == ["Felines"]


async def test_an_overfull_context_leaves_out_the_oldest_turns_and_says_so(tiny_model):
    app = make_app(str(tiny_model), sampling=SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=24),
                   n_ctx=256)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        for turn in range(5):
            await send(pilot, f"Turn {turn}: " + "tell me more about the weather " * 6)
            reply = await reply_done(pilot)
        assert "earlier turn" in reply.reply.footer and "left out" in reply.reply.footer
        await wait_for(pilot, lambda: any("left out" in str(n.message) for n in app._notifications))
        assert len(said(screen)) == 10, "nothing is dropped from the chat itself"
    [conversation] = stored()
    assert len(conversation.path) == 10
