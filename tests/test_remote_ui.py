"""The chat screen on a remote OpenAI-compatible server (the misbehaving fake on 127.0.0.1)."""

from __future__ import annotations

from fake_openai import REPLY, fake_server, prompt_words
from test_models_screen import open_models
from test_ui import SIZE, loaded, make_app, reply_done, said, send, wait_for
from tui_chat.config import RemoteProfile, history_path
from tui_chat.engine.params import SPECS
from tui_chat.history import History
from tui_chat.pricing import turn_cost
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.panel.slider import Slider
from tui_chat.ui.widgets.messages import ReplyMessage


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
            footer = reply.reply.footer
            assert footer.startswith("cut short: the server at") and "closed the stream mid-reply" in footer
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
    with fake_server(family="openai") as server:
        app = make_app("@plain", remotes={"plain": RemoteProfile("plain", server.base_url, model="words")})
        async with app.run_test(size=SIZE) as pilot:
            screen = await loaded(pilot)
            info = screen.workspace.backend.info
            assert {"top_k", "min_p", "repeat_penalty", "typical_p", "dry_multiplier"} <= set(info.ignored_params)
            assert "frequency_penalty" not in info.ignored_params
            for name in set(info.ignored_params) & set(SPECS):
                assert screen.query_one(f"#{name}", Slider).disabled
                assert "ignores" in str(screen.query_one(f"#hint-{name}").render())
            assert not screen.query_one("#temperature", Slider).disabled
            screen.query_one("#temperature", Slider).focus()
            await pilot.press("right")
            assert "next reply" in str(screen.query_one("#note-temperature").render())
            assert "unknown" in str(screen.query_one(MetricsPanel).query_one("#tokens").render())


async def test_the_model_panel_says_what_a_real_server_is_not_sent_and_reads_otherwise(tiny_server):
    app = make_app("@lab", remotes={"lab": RemoteProfile("lab", tiny_server, model="tiny")})
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        facts = str(screen.query_one("#model-facts").render())
        assert "Not sent: Typical-p, Top-nσ, XTC probability" in facts
        assert "Logit bias: the bias goes to every token of the text as the server tokenizes it" in facts


async def test_an_unknown_server_name_is_a_clear_error_and_the_app_stays_up(tiny_model):
    app = make_app("@nowhere")
    async with app.run_test(size=SIZE) as pilot:
        screen = pilot.app.screen
        await wait_for(pilot, lambda: "unknown server" in str(screen.query_one("#status").render()))
        assert screen.workspace.backend is None
        screen.loader.load(str(tiny_model))
        await loaded(pilot)
        await send(pilot, "hello")
        await reply_done(pilot)


async def test_a_server_as_the_default_model_and_switching_back_to_a_local_one(tiny_model):
    with fake_server() as server:
        app = make_app(None, remotes={"lab": RemoteProfile("lab", server.base_url, model="words")},
                       default_model="@lab")
        async with app.run_test(size=SIZE) as pilot:
            screen = await loaded(pilot)
            assert screen.workspace.backend.info.backend == "openai" and screen.session.model == "@lab"
            screen.loader.load(str(tiny_model))
            await wait_for(pilot, lambda: screen.workspace.backend.info.backend != "openai")
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
            await wait_for(pilot, lambda: screen.is_current and screen.workspace.backend.info.backend == "openai")
            assert screen.session.model == "@lab"
            assert f"server {server.base_url.split('/')[2]}" in str(screen.query_one("#model-facts").render())
            await send(pilot, "hello")
            await reply_done(pilot)
            assert server.requests[-1]["model"] == "words"


async def test_the_panel_shows_the_servers_own_figures_and_what_a_stopped_reply_read():
    """llama-server names its model by its path and says its quantisation; its decode rate reaches the panel;
    a reply stopped with Esc keeps the prompt the server read, and its input is costed."""
    with fake_server(served=("/srv/models/words.gguf", "/srv/models/slow.gguf")) as server:
        app = make_app("@lab", remotes={"lab": RemoteProfile("lab", server.base_url)})
        async with app.run_test(size=SIZE) as pilot:
            screen = await loaded(pilot)
            panel = screen.query_one(MetricsPanel)
            assert str(panel.query_one("#model-title").render()) == "words"
            facts = str(panel.query_one("#model-facts").render())  # broken between its parts to fit the panel
            assert facts.startswith("Q4_K_M") and f"server {server.base_url.split('/')[2]}" in facts
            await send(pilot, "hi")
            await reply_done(pilot)
            assert "Decode" in str(panel.query_one("#speed").render())
            assert str(panel.query_one("#speed").render()).endswith("\n  server 250.0 tok/s")
            screen.loader.load("@lab:/srv/models/slow.gguf")
            await wait_for(pilot, lambda: screen.workspace.backend.info.name == "slow")
            spent = panel.session_cost()
            await send(pilot, "and again")
            await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) >= 2)
            await pilot.press("escape")
            reply = await reply_done(pilot)
            read = len(prompt_words([{"role": "user", "content": "hi"}, {"role": "assistant", "content": REPLY},
                                     {"role": "user", "content": "and again"}]))
            assert reply.reply.footer.startswith("stopped")
            last = screen.session.spent()[-1]
            assert last.prompt_tokens == read and last.cached_tokens == read - 4, "only `<user> and again <assistant>`"
            assert f"in {read:,} · out" in str(panel.query_one("#tokens").render())
            cost = turn_cost(panel.price, read, last.cached_tokens, last.completion_tokens)
            assert cost.input > 0 and panel.session_cost() - spent == cost.total
