"""The llama.cpp backend on the tiny random model: fast, real llama.cpp, every path of the decode loop."""

import time

import pytest

from conftest import GREEDY, ask, collect, open_backend
from tiny_model import build_vocab, write_tiny_model
from tui_chat.engine.base import Done, Error, Message, PromptProgress, Request, Token
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import LiveParams, SamplingParams

PROMPT = "Hello, what is the capital of France?"


def test_loaded_model_is_described(tiny):
    info = tiny.info
    assert info.n_ctx == 1024 and info.n_layers == 2
    assert info.chat_format == "plain"
    assert info.quantization == "F16"
    assert info.gpu_layers == 0 and info.offload == f"CPU {info.cpu}".strip() and info.threads >= 1


def test_greedy_is_deterministic_across_backends(tiny, tiny_model):
    first = ask(tiny, PROMPT)
    again = ask(tiny, PROMPT)
    other = open_backend(tiny_model, n_ctx=1024)
    try:
        fresh = ask(other, PROMPT)
    finally:
        other.close()
    assert first.text == again.text == fresh.text
    assert first.metrics.completion_tokens == 32 and first.stop_reason == "length"


def test_same_seed_same_reply_other_seed_other_reply(tiny):
    sampled = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24)
    one = ask(tiny, PROMPT, sampled.with_changes(seed=7))
    two = ask(tiny, PROMPT, sampled.with_changes(seed=7))
    three = ask(tiny, PROMPT, sampled.with_changes(seed=8))
    assert one.text == two.text
    assert one.text != three.text


def test_max_tokens_stops_with_length(tiny):
    done = ask(tiny, PROMPT, GREEDY.with_changes(max_tokens=5))
    assert done.stop_reason == "length" and done.metrics.completion_tokens == 5


def test_stop_sequence_cuts_the_reply_and_is_not_shown(tiny):
    full = ask(tiny, PROMPT).text
    stop = full.split()[3]
    done = ask(tiny, PROMPT, GREEDY.with_changes(stop=[stop]))
    assert done.stop_reason == "stop"
    assert done.text == full[: full.index(stop)]
    assert stop not in done.text


def test_end_of_generation_token_stops_with_eos(tiny, tmp_path):
    tokens, _ = collect(tiny.generate(Request([Message("user", PROMPT)], LiveParams(GREEDY))))
    pieces = build_vocab()[0]
    third = pieces[tokens[2].token_id]
    backend = open_backend(write_tiny_model(tmp_path / "eos.gguf", eos_like=third), n_ctx=512)
    try:
        events, done = collect(backend.generate(Request([Message("user", PROMPT)], LiveParams(GREEDY))))
    finally:
        backend.close()
    assert done.stop_reason == "eos"
    assert done.metrics.completion_tokens <= 3
    assert events[-1].token_id == 2 and events[-1].text == ""


def test_reading_a_prompt_asks_python_whether_to_stop_only_now_and_then(tiny_model):
    """llama.cpp asks whether to abort at every node of its graph; a Python callback there took the GIL each
    time, which a busy UI thread holds (prompt reading was 1.7x as slow beside one). It reads a flag in C, and
    Python is asked between chunks and by a watcher every ABORT_POLL_S; a stop still ends it mid-chunk."""
    from tui_chat.engine.local.cpu import Threads
    from tui_chat.engine.local.llamacpp import LlamaSession, PrefillAborted

    session = LlamaSession(tiny_model, n_ctx=512, gpu_layers=0, n_batch=32, threads=Threads(1, 1))
    try:
        prompt = session.tokenize("the quick brown fox jumps over the lazy dog " * 12, add_bos=True)[:128]
        asked = []
        started = time.perf_counter()
        session.prefill(prompt, lambda _done: None, lambda: asked.append(1) and False)
        chunks, seconds = len(prompt) // 32, time.perf_counter() - started
        assert len(session.tokens) == len(prompt)
        assert len(asked) <= chunks + seconds / 0.05 + 2
        session.keep_prefix([])
        with pytest.raises(PrefillAborted):
            session.prefill(prompt, lambda _done: None, lambda: True)
        assert session.tokens == []
    finally:
        session.close()


def test_cancel_stops_within_one_token_and_keeps_the_partial_reply(tiny):
    live = LiveParams(GREEDY.with_changes(max_tokens=1000))
    stream = tiny.generate(Request([Message("user", PROMPT)], live))
    seen: list[Token] = []
    cancelled_at = None
    for event in stream:
        if isinstance(event, Token):
            seen.append(event)
            if cancelled_at is None and len(seen) >= 5:
                cancelled_at = time.perf_counter()
                stream.cancel()
        elif isinstance(event, Done):
            done = event
    assert done.stop_reason == "cancelled"
    assert sum(1 for t in seen if t.at > cancelled_at) <= 1
    assert done.text == "".join(t.text for t in seen)
    assert done.metrics.completion_tokens == len(seen) < 1000


def test_sampling_change_applies_to_the_next_token(tiny):
    """Switch from random sampling to greedy mid-reply: from the next token on, each pick is the argmax."""
    live = LiveParams(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=3,
                                     max_tokens=1000))
    stream = tiny.generate(Request([Message("user", PROMPT)], live, top_logprobs=3))
    tokens: list[Token] = []
    changed_at = None
    for event in stream:
        if isinstance(event, Token):
            tokens.append(event)
            if changed_at is None:
                changed_at = time.perf_counter()
                new_version = live.update(temperature=0.0) and live.version
        elif isinstance(event, Done):
            done = event
    assert done.stop_reason in ("length", "context"), "it ran on until it was cut"
    late_old = [t for t in tokens if t.at > changed_at and t.params_version != new_version]
    assert len(late_old) <= 1, "at most the token already being sampled keeps the old settings"
    greedy_part = [t for t in tokens if t.params_version == new_version]
    assert len(greedy_part) > 500
    assert all(t.token_id == t.top[0].token_id for t in greedy_part)
    random_part = [t for t in tokens if t.params_version != new_version]
    assert random_part, "the reply started with the old settings"


def test_max_tokens_lowered_mid_reply_stops_at_once(tiny):
    live = LiveParams(GREEDY.with_changes(max_tokens=1000))
    stream = tiny.generate(Request([Message("user", PROMPT)], live))
    tokens: list[Token] = []
    lowered_at = None
    for event in stream:
        if isinstance(event, Token):
            tokens.append(event)
            if lowered_at is None:
                lowered_at = time.perf_counter()
                live.update(max_tokens=1)
        elif isinstance(event, Done):
            done = event
    assert done.stop_reason == "length"
    assert sum(1 for t in tokens if t.at > lowered_at) <= 1
    assert done.metrics.completion_tokens < 1000


def test_top_probabilities_are_a_sorted_distribution(tiny):
    tokens, done = collect(tiny.generate(Request([Message("user", PROMPT)], LiveParams(GREEDY), top_logprobs=5)))
    for token in tokens:
        probs = [c.prob for c in token.top]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True)
        assert 0 < sum(probs) <= 1.0001
        assert token.token_id == token.top[0].token_id and token.prob == pytest.approx(probs[0])


def test_next_turn_reads_only_new_tokens(tiny):
    first = ask(tiny, [Message("user", PROMPT)])
    conversation = [Message("user", PROMPT), Message("assistant", first.text), Message("user", "And of Germany?")]
    second = ask(tiny, conversation)
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    assert second.metrics.cached_tokens >= len(first.prompt_ids) + first.metrics.completion_tokens - 2
    new_tokens = second.metrics.prompt_tokens - second.metrics.cached_tokens
    assert 0 < new_tokens <= tiny.count_tokens("\nUser: And of Germany?\nAssistant:") + 2
    perf = tiny.session.perf()
    assert perf.n_p_eval == new_tokens


def test_reused_cache_gives_the_same_reply_as_a_fresh_read(tiny):
    first = ask(tiny, [Message("user", PROMPT)])
    conversation = [Message("user", PROMPT), Message("assistant", first.text), Message("user", "Tell me more.")]
    history = tiny.transcript.text, list(tiny.transcript.tokens)
    cached = ask(tiny, conversation)
    assert cached.metrics.cached_tokens > 0
    # Same token history as before the cached turn, but an empty KV cache: the same ids, all read afresh.
    tiny.transcript.text, tiny.transcript.tokens = history
    tiny.session.keep_prefix([])
    fresh = ask(tiny, conversation)
    assert fresh.metrics.cached_tokens == 0
    assert fresh.prompt_ids == cached.prompt_ids
    assert fresh.text == cached.text


def test_metrics_agree_with_llama_cpp_counters(tiny):
    long_prompt = " ".join(["the capital of France is Paris"] * 60)
    done = ask(tiny, long_prompt, GREEDY.with_changes(max_tokens=200))
    perf = tiny.session.perf()
    m = done.metrics
    assert perf.n_p_eval == m.prompt_tokens - m.cached_tokens > 300
    assert perf.n_eval == m.completion_tokens - 1
    assert m.prefill_s * 1000 == pytest.approx(perf.p_eval_ms, rel=0.5, abs=20)  # ours adds Python's share
    assert m.decode_tok_s <= perf.n_eval / (perf.eval_ms / 1000) * 1.05
    assert m.ttft_s >= m.prefill_s
    assert m.context_tokens == m.prompt_tokens + m.completion_tokens - 1
    assert m.n_ctx == 1024


def test_prompt_progress_counts_only_tokens_to_read(tiny):
    stream = tiny.generate(Request([Message("user", " ".join(["Hello world"] * 300))], LiveParams(GREEDY)))
    progress = [e for e in stream if isinstance(e, PromptProgress)]
    assert progress[0].done == 0 and progress[-1].done == progress[-1].total > 256
    assert len(progress) >= 3
    assert [p.done for p in progress] == sorted(p.done for p in progress)


def test_prompt_larger_than_context_is_a_clear_error(tiny_model):
    backend = open_backend(tiny_model, n_ctx=256)
    try:
        result = backend.generate(Request([Message("user", "Hello world " * 200)], LiveParams(GREEDY))).result()
        assert isinstance(result, Error)
        assert "but the context holds 256" in result.message
        still = ask(backend, PROMPT, GREEDY.with_changes(max_tokens=1000))
        assert still.stop_reason == "context" and still.metrics.context_tokens <= 256
    finally:
        backend.close()


def test_broken_model_file_is_an_error_event_and_the_worker_lives(tmp_path, tiny_model):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_model.read_bytes()[:50_000])
    backend = LlamaBackend(LlamaSettings(broken))
    try:
        result = backend.load().result()
        assert isinstance(result, Error)
        assert result.message.startswith("cannot load broken.gguf: ") and "\n" not in result.message
        orphan = backend.generate(Request([Message("user", "hi")])).result()
        assert isinstance(orphan, Error) and orphan.message == "no model is loaded"
    finally:
        backend.close()


def test_count_tokens_uses_the_model_tokenizer(tiny):
    assert tiny.count_tokens("Hello world") == 2
    assert tiny.count_tokens("") == 0


def test_a_bug_inside_a_turn_ends_the_stream_with_one_line_and_the_worker_lives_on(tiny, monkeypatch):
    from tui_chat.engine.local import reply

    def broken(self):
        raise ZeroDivisionError("division by zero")

    with monkeypatch.context() as patch:
        patch.setattr(reply.Reply, "run", broken)
        result = tiny.generate(Request([Message("user", "hi")], LiveParams(GREEDY))).result()
    assert isinstance(result, Error)
    assert result.message == "internal error (ZeroDivisionError: division by zero); details in the log"
    assert isinstance(ask(tiny, "hi"), Done)
