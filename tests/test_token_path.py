"""A token's own work in the engine (issue 45): the inspector's figures computed while the next token decodes give
the numbers computed between two decodes; the time to the first token named in its parts; the GPU-regime proxy
the benchmarks measure this on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import GREEDY, collect, open_backend, run_cli
from tui_chat.engine.base import Done, Message, Request
from tui_chat.engine.params import LiveParams, SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

QUESTION = [Message("user", "Write a short story about a lighthouse keeper.")]
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, repeat_penalty=1.1, seed=5,
                         max_tokens=48)


def reply(backend, params: SamplingParams, monkeypatch, overlap: bool):
    monkeypatch.setattr("tui_chat.engine.local.llamacpp.overlaps", lambda _threads: overlap)
    tokens, done = collect(backend.generate(Request(QUESTION, LiveParams(params), top_logprobs=10)))
    assert isinstance(done, Done), done
    return tokens


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_inspector_overlapped_with_the_next_decode_records_the_same_figures(tiny, params, monkeypatch):
    """Greedy and seeded replies token for token, and every recorded probability, candidate and pool cut, with
    the inspector's work in its own thread and at once between two decodes."""
    at_once = reply(tiny, params, monkeypatch, overlap=False)
    overlapped = reply(tiny, params, monkeypatch, overlap=True)
    assert [t.token_id for t in overlapped] == [t.token_id for t in at_once] and len(at_once) > 8
    for a, b in zip(overlapped, at_once, strict=True):
        assert a.prob == pytest.approx(b.prob, abs=1e-6) and a.pool == b.pool
        assert [c.token_id for c in a.top] == [c.token_id for c in b.top]
        assert [c.prob for c in a.top] == pytest.approx([c.prob for c in b.top], abs=1e-6)
    assert tiny.session._inspector is not None  # the overlapped run used the thread


def test_every_token_event_comes_before_the_reply_ends_and_in_order(tiny, monkeypatch):
    """A token's event waits one decode for its figures: none is lost at the end of a reply or when it is stopped."""
    monkeypatch.setattr("tui_chat.engine.local.llamacpp.overlaps", lambda _threads: True)
    events = list(tiny.generate(Request(QUESTION, LiveParams(GREEDY.with_changes(max_tokens=20)), top_logprobs=3)))
    done = events[-1]
    assert isinstance(done, Done) and done.metrics.completion_tokens == 20
    tokens = [e for e in events if hasattr(e, "token_id") and hasattr(e, "top")]
    assert len(tokens) == 20 and all(t.prob is not None and t.top for t in tokens)
    assert [t.at for t in tokens] == sorted(t.at for t in tokens)


def test_time_to_first_token_in_its_parts(tiny_model):
    """`run --json` names where the time to the first token went; the parts never add up to more than it."""
    done = run_cli("run", "--model", str(tiny_model), "-p", "Hello there", "--max-tokens", "4", "--temperature", "0",
                   "--json")
    assert done.returncode == 0, done.stderr
    turn = json.loads(done.stdout)["turns"][0]
    parts = ("queued_s", "template_s", "tokenize_s", "prefix_s", "restore_s", "prefill_s", "first_draw_s")
    assert all(turn[part] >= 0 for part in parts) and turn["prefill_s"] > 0 and turn["tokenize_s"] > 0
    assert sum(turn[part] for part in parts) <= turn["ttft_s"] + 1e-3


@pytest.fixture(scope="module")
def proxy(starter_model, tmp_path_factory):
    from proxy import write_proxy

    path = tmp_path_factory.mktemp("proxy") / "proxy.gguf"
    write_proxy(starter_model, path)
    return path


def test_the_gpu_regime_proxy_keeps_the_starters_vocabulary_and_template_with_tiny_layers(proxy, starter):
    """The benchmarks' proxy: the starter's tokenizer (its 262,144 tokens, the same ids for a text), two blocks, a
    fraction of its size, and logits heavy-tailed as a trained model's (a likeliest token far from uniform)."""
    backend = open_backend(proxy, n_ctx=1024)
    try:
        assert backend.info.n_layers == 2 and backend.info.size_bytes < starter.info.size_bytes / 5
        assert backend.session.n_vocab == starter.session.n_vocab == 262_144
        assert backend.count_tokens("The lighthouse keeper") == starter.count_tokens("The lighthouse keeper")
        tokens, done = collect(backend.generate(Request(QUESTION, LiveParams(GREEDY), top_logprobs=10)))
        assert isinstance(done, Done) and len(tokens) == GREEDY.max_tokens
        top = np.array([t.top[0].prob for t in tokens])
        assert np.median(top) > 100 / 262_144 and top.max() < 1.0  # peaked, never certain
    finally:
        backend.close()


def test_the_proxy_is_the_same_file_each_time(proxy, starter_model, tmp_path):
    from proxy import write_proxy

    again = tmp_path / "again.gguf"
    write_proxy(starter_model, again)
    assert again.read_bytes() == proxy.read_bytes()


def test_a_prompt_is_read_in_batches_the_device_takes():
    """llama.cpp's own batch defaults where layers sit on a GPU (a 2,048-token prompt in one call); on a CPU the
    chunks a stop and the progress are seen between."""
    from tui_chat.engine.local.llamacpp import device_batch

    assert device_batch(256, 4096, gpu_layers=0) == (256, 256)
    assert device_batch(256, 4096, gpu_layers=18) == (2048, 512)
    assert device_batch(256, 1024, gpu_layers=18) == (1024, 512)


async def test_the_panel_says_where_a_local_replys_tokens_were_drawn(tiny_model):
    """Issue 45: backend sampling or the app's own chain, said under the decode rate (a CPU draws with the app's)."""
    from textual.widgets import Static

    from test_ui import loaded, make_app, reply_done, send

    app = make_app(str(tiny_model))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello")
        await reply_done(pilot)
        await pilot.pause(0.2)
        assert "drawn by the app" in str(screen.query_one("#speed", Static).render())
