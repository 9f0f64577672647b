"""The chat screen on a remote OpenAI-compatible server (the misbehaving fake on 127.0.0.1)."""

from __future__ import annotations

from fake_openai import fake_server
from test_models_screen import open_models
from test_ui import SIZE, loaded, make_app, reply_done, said, send, wait_for
from tui_chat.config import RemoteProfile, history_path
from tui_chat.history import History
from tui_chat.ui.widgets.messages import ReplyMessage
from tui_chat.ui.widgets.metrics import MetricsPanel
from tui_chat.ui.widgets.slider import Slider


async def test_a_reply_cut_mid_stream_stays_on_screen_and_in_the_history():
    with fake_server() as server:
        app = make_app("@lab:cut", remotes={"lab": RemoteProfile("lab", server.base_url)})
        async with app.run_test(size=SIZE) as pilot:
            screen = await loaded(pilot)
            host = server.base_url.split("/")[2]
            assert f"server {host}" in str(screen.query_one("#model-facts").render())
            await send(pilot, "hi")
            reply = await reply_done(pilot)
            assert reply.text == "Paris is the"
            assert reply.footer.startswith("cut short: the server at") and "closed the stream mid-reply" in reply.footer
            assert said(screen)[-1].content == "Paris is the"
            await send(pilot, "go on")
            await wait_for(pilot, lambda: len(screen.query(ReplyMessage)) == 2 and screen.reply is None)
            assert server.requests[-1]["messages"][1] == {"role": "assistant", "content": "Paris is the"}
    with History(history_path()) as history:
        [chat] = history.conversations()
        stored = history.load(chat.id).path
    assert (stored[1].content, stored[1].state) == ("Paris is the", "error")
    assert chat.model == "@lab:cut"


async def test_settings_a_plain_server_ignores_are_greyed_out_and_apply_per_reply():
    with fake_server(llama_server=False) as server:
        app = make_app("@plain", remotes={"plain": RemoteProfile("plain", server.base_url, model="words")})
        async with app.run_test(size=SIZE) as pilot:
            screen = await loaded(pilot)
            info = screen.backend.info
            assert set(info.ignored_params) == {"top_k", "min_p", "repeat_penalty"}
            for name in info.ignored_params:
                assert screen.query_one(f"#{name}", Slider).disabled
                assert "ignores" in str(screen.query_one(f"#hint-{name}").render())
            assert not screen.query_one("#temperature", Slider).disabled
            screen.query_one("#temperature", Slider).focus()
            await pilot.press("right")
            assert "next reply" in str(screen.query_one("#note-temperature").render())
            assert "unknown" in str(screen.query_one(MetricsPanel).query_one("#tokens").render())


async def test_an_unknown_server_name_is_a_clear_error_and_the_app_stays_up(tiny_model):
    app = make_app("@nowhere")
    async with app.run_test(size=SIZE) as pilot:
        screen = pilot.app.screen
        await wait_for(pilot, lambda: "unknown server" in str(screen.query_one("#status").render()))
        assert screen.backend is None
        screen.load_model(str(tiny_model))
        await loaded(pilot)
        await send(pilot, "hello")
        await reply_done(pilot)


async def test_a_server_as_the_default_model_and_switching_back_to_a_local_one(tiny_model):
    with fake_server() as server:
        app = make_app(None, remotes={"lab": RemoteProfile("lab", server.base_url, model="words")},
                       default_model="@lab")
        async with app.run_test(size=SIZE) as pilot:
            screen = await loaded(pilot)
            assert screen.backend.info.backend == "openai" and screen.session.model == "@lab"
            screen.load_model(str(tiny_model))
            await wait_for(pilot, lambda: screen.backend.info.backend != "openai")
            await send(pilot, "hello")
            await reply_done(pilot)
            assert screen.session.model == str(tiny_model)


async def test_the_models_screen_switches_to_a_server_and_back(tiny_model):
    with fake_server() as server:
        app = make_app(str(tiny_model), remotes={"lab": RemoteProfile("lab", server.base_url, model="words")})
        async with app.run_test(size=SIZE) as pilot:
            screen = await loaded(pilot)
            await open_models(pilot)
            await pilot.press("r")
            await pilot.pause()
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.is_current and screen.backend.info.backend == "openai")
            assert screen.session.model == "@lab"
            assert f"server {server.base_url.split('/')[2]}" in str(screen.query_one("#model-facts").render())
            await send(pilot, "hello")
            await reply_done(pilot)
            assert server.requests[-1]["model"] == "words"
