"""Issue 44's wrong figures (items 6-9): the panel after a deleted exchange, a stopped remote stream's prompt and
rate, a full slot of `tui-chat serve` as its client says it, and the X-ray against the recorded candidates."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import GREEDY, collect
from fake_openai import fake_server
from test_ui import SIZE, chat, loaded, make_app, wait_for
from tui_chat.engine.base import Done, Loaded, Message, Request, Token
from tui_chat.engine.openai import OpenAIBackend, RemoteSettings
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.pricing import format_usd
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.widgets.messages import UserMessage
from tui_chat.wording import reply_footer


def connect(base_url: str, model: str | None = None) -> OpenAIBackend:
    backend = OpenAIBackend(RemoteSettings(base_url, model))
    loaded = backend.load().result()
    assert isinstance(loaded, Loaded), loaded
    return backend


def cost_line(panel: MetricsPanel, name: str) -> str:
    return next(line for line in str(panel.query_one("#cost").render()).splitlines() if line.startswith(name))


# --- item 6: a deleted exchange ----------------------------------------------------------------


async def delete_last_exchange(pilot, screen) -> None:
    screen.query(UserMessage)[-1].focus()
    await pilot.press("delete", "delete")
    await wait_for(pilot, lambda: len(screen.session.turns) == 1)
    await pilot.pause()


async def test_deleting_an_exchange_does_not_unspend_the_session(tiny_model):
    """The chat's sum leaves with the deleted reply; what the session spent stays, named apart."""
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chat(pilot, "One", "Two")
        panel = screen.query_one(MetricsPanel)
        spent = cost_line(panel, "Session")
        await delete_last_exchange(pilot, screen)
        assert cost_line(panel, "Session") == spent, "deleting does not un-spend"
        assert cost_line(panel, "Chat") == f"Chat     {format_usd(panel.chat_cost(), fine=True)}"
        assert panel.chat_cost() < panel.session_cost()


async def test_after_deleting_the_last_exchange_the_panel_shows_the_reply_now_last(tiny_model):
    """The reply's figures and the title line's rate are those of the reply left on screen, not the deleted one's."""
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chat(pilot, "One", "Two with a few more words to read")
        panel = screen.query_one(MetricsPanel)
        await delete_last_exchange(pilot, screen)
        last = screen.session.turns[-1].reply.metrics
        assert panel.metrics is last
        assert f"in {last.prompt_tokens:,} · out {last.completion_tokens:,}" in str(panel.query_one("#tokens").render())


# --- item 7: a remote stream stopped with Esc ----------------------------------------------------


def test_a_stopped_streams_prompt_starts_from_the_servers_count_and_makes_no_rate():
    """A plain OpenAI-compatible server (no tokenizer, no context size) reports the prompt only at the end: a
    reply stopped before it is estimated as the draft line bills it (the server's count of the conversation so
    far and the new message), and no prefill rate is made of an estimate over the time to the first token."""
    with fake_server(family="openai") as server:
        backend = connect(server.base_url, "stopping")
        try:
            asked = [Message("user", "Antidisestablishmentarianism notwithstanding, hello")]
            _, first = collect(backend.generate(Request(asked, LiveParams(GREEDY))))
            assert isinstance(first, Done) and not first.metrics.prompt_estimated
            question = "And what of that, then, my friend?"
            messages = [*asked, Message("assistant", first.text, first.reasoning), Message("user", question)]
            stream = backend.generate(Request(messages, LiveParams(GREEDY)))
            seen: list[Token] = []
            while not seen:
                seen += [event for event in stream.drain(timeout=5) if isinstance(event, Token)]
            stream.cancel()
            stopped = stream.result()
            draft_line = first.metrics.context_tokens + backend.count_tokens(question)
        finally:
            backend.close()
    assert isinstance(stopped, Done) and stopped.stop_reason == "cancelled"
    metrics = stopped.metrics
    assert metrics.prompt_estimated and metrics.ttft_s is not None
    assert metrics.prefill_tok_s is None, "an estimated prompt over a time to first token is no measured rate"
    assert metrics.prompt_tokens == draft_line


# --- item 8: a full slot of `tui-chat serve` ---------------------------------------------------


@contextmanager
def serving(model: Path) -> Iterator[str]:
    """A real `tui-chat serve` server, its engine in this process, a 1,024-token context: its base URL."""
    from tui_chat.engine.local.llama import LlamaBackend
    from tui_chat.engine.local.settings import LlamaSettings
    from tui_chat.pricing import PRESETS
    from tui_chat.serve.monitor import Monitor
    from tui_chat.serve.server import ServeOptions, TuiChatServer

    backend = LlamaBackend(LlamaSettings(model, n_ctx=1024))
    loaded = backend.load().result()
    assert isinstance(loaded, Loaded), loaded
    server = TuiChatServer(ServeOptions(port=0), backend, loaded.info, SamplingParams(temperature=0.0),
                           Monitor(next(iter(PRESETS.values()))))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()
        backend.close()


def test_a_reply_ended_by_a_full_slot_says_context_full_with_the_servers_cache(tiny_model):
    """OpenAI's `length` says both max tokens and a full context: the server says which, and its cache's fill."""
    with serving(tiny_model) as url:
        backend = connect(url)
        try:
            started = time.perf_counter()
            _, done = collect(backend.generate(Request([Message("user", "Hello")],
                                                       LiveParams(GREEDY.with_changes(max_tokens=1024)))))
        finally:
            backend.close()
    assert isinstance(done, Done), done
    assert time.perf_counter() - started < 60
    assert done.stop_reason == "context", "the slot filled before max tokens"
    assert reply_footer(done.stop_reason, done.metrics.as_dict()).startswith("context full")
    metrics = done.metrics
    assert metrics.n_ctx == 1024 and metrics.context_tokens == metrics.prompt_tokens + metrics.completion_tokens - 1, \
        "the cells the server's cache holds: the last token drawn is not read"


# --- item 9: the X-ray and the recorded candidates -------------------------------------------

PENALISED = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, seed=11,
                           max_tokens=64)


def sampled_reply(backend) -> tuple[list[Token], tuple[int, ...]]:
    tokens, done = collect(backend.generate(Request([Message("user", "Hello, what is the capital of France?")],
                                                    LiveParams(PENALISED), top_logprobs=5, xray=True)))
    assert isinstance(done, Done), done
    return tokens, done.prompt_ids


def test_the_recorded_pool_is_what_the_chain_cut_after_the_repeat_penalty(tiny):
    """The penalty runs before top-k, top-p and min-p in the chain: the pool recorded with each token counts what
    they cut of the penalised distribution, as the X-ray of the same draw does (it was the raw one's: one apart)."""
    tokens, _ = sampled_reply(tiny)
    for token in tokens:
        cuts = {stage.name: stage.kept for stage in token.stages}
        assert (token.pool.top_k, token.pool.top_p, token.pool.min_p) == (cuts["top_k"], cuts["top_p"], cuts["min_p"])


def test_a_sampled_draw_is_chance_not_the_penaltys_doing(tiny):
    """A token drawn at rank 4 from a pool of 27 was chance: the X-ray gives the odds, and says what the penalty did
    to the likelier tokens without calling it the reason."""
    from tui_chat.probe import position_context

    tokens, prompt_ids = sampled_reply(tiny)
    lines = [tiny.xray(position_context(prompt_ids, tokens, index), token.token_id, PENALISED).result().verdict
             for index, token in enumerate(tokens) if token.top and token.top[0].token_id != token.token_id]
    lowered = [line for line in lines if "repeat penalty 1.1 lowered the likelier tokens" in line]
    assert lowered, lines
    assert all("because" not in line and " chance among " in line for line in lines), lines
