"""What a new user met (issue 16's defects), each on the real app with the real tiny model: navigating
away mid-reply, settings that leaked between chats, typing while the model loads, a lost default
model, a failed open that left a false banner."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList

from conftest import GREEDY
from test_history_ui import chats_open
from test_ui import SIZE, loaded, make_app, reply_done, said, screen_open, send, wait_for
from tui_chat.commands.common import opener_for
from tui_chat.config import Config, history_path, load_config
from tui_chat.engine.base import TurnMetrics
from tui_chat.engine.models import STARTER_NAME
from tui_chat.history import History
from tui_chat.session import Branch, Turn
from tui_chat.ui.app import ChatApp
from tui_chat.ui.screens.open_model import OpenModelScreen
from tui_chat.ui.widgets.messages import UserMessage
from tui_chat.ui.widgets.prompt import PromptInput
from tui_chat.wording import reply_footer

LONG = GREEDY.with_changes(max_tokens=100_000)


async def streaming(pilot, tokens: int = 30):
    screen = pilot.app.screen
    await send(pilot, "Hello there")
    await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) >= tokens
                   and screen.reply.metrics is not None)
    return screen


def last_reply():
    with History(history_path()) as history:
        conversation = history.load(history.conversations()[-1].id)
    return conversation.path[-1]


async def test_a_new_chat_mid_reply_keeps_the_reply_as_stopped_with_its_figures(tiny_model):
    app = make_app(str(tiny_model), sampling=LONG, n_ctx=8192)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        screen = await streaming(pilot)
        shown = screen.reply.text
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: screen.reply is None and not screen.query(UserMessage))
    reply = last_reply()
    assert reply.state == "stopped" and reply.stop_reason == "cancelled"
    assert reply.content.startswith(shown) and reply.content
    assert reply.metrics["completion_tokens"] >= 30 and reply.metrics["ttft_s"] > 0


async def test_quitting_mid_reply_keeps_the_reply_as_stopped(tiny_model):
    app = make_app(str(tiny_model), sampling=LONG, n_ctx=8192)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await streaming(pilot)
    reply = last_reply()
    assert reply.state == "stopped" and reply.content and reply.metrics["completion_tokens"] >= 30


async def test_opening_another_chat_mid_reply_keeps_the_reply_as_stopped(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=8), n_ctx=8192)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "A first chat")
        await reply_done(pilot)
        await pilot.press("ctrl+n")
        screen.live.update(max_tokens=100_000)
        await streaming(pilot)
        with History(history_path()) as history:
            first = history.conversations()[-1].id
        await screen.rooms["chats"].open_conversation(first)
        await wait_for(pilot, lambda: screen.reply is None and said(screen)[0].content == "A first chat")
    with History(history_path()) as history:
        second = history.load(history.conversations()[0].id)
    assert second.path[-1].state == "stopped" and second.path[-1].content


async def test_a_new_chat_starts_from_the_configs_settings_not_the_last_opened_chats(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=16))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        await pilot.press("ctrl+n")
    essay = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=500))
    async with essay.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chats_open(pilot)
        await pilot.press("enter")  # the saved chat, with max tokens 16
        await wait_for(pilot, lambda: screen.is_current and said(screen))
        assert screen.live.snapshot()[1].max_tokens == 16
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert screen.live.snapshot()[1].max_tokens == 500, "the config's max tokens, not the opened chat's"


async def test_enter_while_the_model_loads_is_sent_when_it_is_ready(tiny_model):
    gate = threading.Event()
    config = Config(sampling=GREEDY, n_ctx=1024)
    opener = opener_for(config)[0]

    def slow_opener(name):
        gate.wait(30)  # the model takes its time to load
        return opener(name)

    app = ChatApp(config, slow_opener, str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.workspace.loading is not None)
        await send(pilot, "Hello there")
        await pilot.pause()
        status = str(screen.query_one("#status").render())
        assert "your message is sent as soon as it is ready" in status and screen.workspace.backend is None
        assert screen.query_one(PromptInput).text == ""
        gate.set()
        reply = await reply_done(pilot)
        assert [message.text for message in screen.query(UserMessage)] == ["Hello there"] and reply.text


async def test_a_failed_open_leaves_no_false_banner_while_the_model_keeps_answering(tiny_model, tmp_path):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await loaded(pilot)
        backend = screen.workspace.backend
        screen.loader.load(str(tmp_path / "missing.gguf"))
        await wait_for(pilot, lambda: screen.workspace.loading is None)
        await pilot.pause()
        status = screen.query_one("#status")
        assert not status.display and screen.workspace.backend is backend
        assert any("model file not found" in n.message for n in app._notifications)
        await send(pilot, "Hello there")
        assert (await reply_done(pilot)).text


@pytest.mark.starter
async def test_a_lost_default_model_gives_way_to_the_starter_with_a_warning(tmp_path, starter_model):
    config = Config(sampling=GREEDY, n_ctx=1024, default_model=str(tmp_path / "my-gemma.gguf"))
    app = ChatApp(config, opener_for(config)[0], None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await loaded(pilot)
        assert Path(screen.workspace.backend.info.path).resolve() == starter_model.resolve()

        def warned() -> bool:  # a notification is a message: it is listed once the app has handled it
            warnings = [n.message for n in app._notifications if n.severity == "warning"]
            return any("my-gemma.gguf" in w and "the starter model opens instead" in w for w in warnings)

        await wait_for(pilot, warned)
        assert screen.session.model == STARTER_NAME


def test_words_and_numbers_read_as_a_person_writes_them():
    assert reply_footer("eos", {"completion_tokens": 1}).startswith("end of text · 1 token")
    assert reply_footer("eos", {"completion_tokens": 2}).startswith("end of text · 2 tokens")
    one_token_read = TurnMetrics(prompt_tokens=40, cached_tokens=39, prefill_s=0.14)
    assert one_token_read.prefill_tok_s is None, "a 1-token read is a decode step, not a prompt rate"
    assert TurnMetrics(prompt_tokens=40, cached_tokens=0, prefill_s=0.1).prefill_tok_s == pytest.approx(400)


async def test_f1_names_keys_as_they_are_typed(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=(100, 60)) as pilot:
        await loaded(pilot)
        await pilot.press("f1")
        await pilot.pause(0.2)
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "left_square_bracket" not in text and "Show the reply's previous branch" in text
        line = next(line for line in text.splitlines() if "Show the reply's previous branch" in line)
        assert " [ " in line


async def test_an_empty_reply_says_so(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        turn = Turn("question", [Branch("", "end of text · 0 tokens")])
        screen.session.turns = [turn]
        await screen.view.show(screen.session)
        await pilot.pause()
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "(no text)" in text and "end of text · 0 tokens" in text


@pytest.mark.starter
async def test_ctrl_o_lists_local_models_and_sets_context_and_gpu_layers(tiny_model, starter_model):
    app = make_app(str(tiny_model), n_ctx=1024)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await loaded(pilot)
        await pilot.press("ctrl+o")
        opened = await screen_open(pilot, OpenModelScreen)
        names = [str(option.prompt) for option in opened.query_one(OptionList).options]
        assert any(starter_model.name in name for name in names), names
        context = opened.query_one("#n-ctx", Input)
        assert context.value == "1024"
        context.value = "2048"
        opened.query_one("#gpu-layers", Input).value = "0"
        await pilot.press("down")
        starter = next(i for i, name in enumerate(names) if starter_model.name in name)
        opened.query_one(OptionList).highlighted = starter
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.workspace.backend is not None
                       and screen.workspace.backend.info.n_ctx == 2048)
        assert screen.workspace.backend.info.gpu_layers == 0
    saved = load_config()
    assert saved.n_ctx == 2048 and saved.gpu_layers == 0


async def test_an_earlier_message_can_be_edited_and_the_chat_goes_on_from_it(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=6))
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await loaded(pilot)
        for text in ("First question", "Second question", "Third question"):
            await send(pilot, text)
            await reply_done(pilot)
        second = screen.query(UserMessage)[1]
        second.focus()
        await pilot.press("e")
        await wait_for(pilot, lambda: len(screen.query(UserMessage)) == 1)
        prompt = screen.query_one(PromptInput)
        assert prompt.text == "Second question" and [t.question for t in screen.session.turns] == ["First question"]
        prompt.text = "Second, edited"
        await pilot.press("enter")
        await reply_done(pilot)
        assert [m.content for m in said(screen) if m.role == "user"] == ["First question", "Second, edited"]
    with History(history_path()) as history:
        path = history.load(history.conversations()[0].id).path
    assert [m.content for m in path if m.role == "user"] == ["First question", "Second, edited"]


async def test_deleting_an_earlier_message_asks_once_more_then_deletes_it_and_what_follows(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=6))
    async with app.run_test(size=(100, 40), notifications=True) as pilot:
        screen = await loaded(pilot)
        for text in ("First question", "Second question"):
            await send(pilot, text)
            await reply_done(pilot)
        first = screen.query(UserMessage)[0]
        first.focus()
        await pilot.press("delete")
        await pilot.pause()
        assert len(screen.session.turns) == 2
        assert any("Press Delete again" in n.message for n in app._notifications)
        await pilot.press("delete")
        await wait_for(pilot, lambda: not screen.query(UserMessage))
        assert screen.session.turns == []
    with History(history_path()) as history:
        assert history.load(history.conversations()[0].id).messages == ()


async def test_a_cut_reply_continues_where_it_stopped(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=8))
    async with app.run_test(size=(100, 40), notifications=True) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        cut = reply.text
        await pilot.press("f8")
        await wait_for(pilot, lambda: screen.reply is None and len(reply.branches) == 2)
        assert reply.text.startswith(cut) and len(reply.text) > len(cut)
        assert "continued at token 8, 1 token read" in reply.reply.footer and len(reply.reply.tokens) == 16
        assert said(screen)[-1].content == reply.text, "the chat goes on from the continued reply"
