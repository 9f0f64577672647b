"""The real starter model (Gemma 3 270M, sliding-window attention) through real llama.cpp."""

import json
import time

import pytest

from conftest import GREEDY, ask, collect, open_backend, run_cli
from tui_chat.engine.base import Done, Message, PromptProgress, Request
from tui_chat.engine.params import LiveParams

pytestmark = pytest.mark.starter

QUESTIONS = [
    "What is the capital of France?",
    "And what is the capital of Germany?",
    "Tell me about the history of Berlin in a few sentences.",
    "What river flows through Paris?",
    "Which of the two cities is larger?",
    "Write a short poem about both cities.",
]


def test_starter_is_a_base_model_answered_through_a_plain_transcript(starter):
    assert starter.info.chat_format == "plain"
    assert starter.info.quantization == "Q4_K_M"
    done = ask(starter, QUESTIONS[0])
    assert done.text.strip() == "The capital of France is Paris."
    assert done.stop_reason == "stop"


TOLERANCE = 0.08  # batched reads and one-token steps use other Q4_K kernels: ~0.01 on AVX2, up to ~0.055 on AVX-512


def assert_alike_until_a_near_tie(ours: list, cold: list) -> None:
    """Two greedy replies to the same tokens from different cache states agree token for token, their
    probabilities within rounding, and may part only where rounding explains it: there, each side's pick has
    the same probability on both sides within TOLERANCE. (If every probability moves by at most TOLERANCE, two
    sides may prefer different tokens only when each side's gap between them is under twice that: on an Intel
    Xeon with AVX-512 the reused cache drew ' Berlin' 0.338 over ' Paris' 0.247 where a fresh read drew
    ' Paris' 0.290, a gap the old one-sided check of TOLERANCE called no tie.)"""
    pairs = list(zip(ours, cold, strict=False))
    parted = next((i for i, (a, b) in enumerate(pairs) if a.token_id != b.token_id), None)
    for a, b in pairs[:parted]:
        assert a.forced or a.prob == pytest.approx(b.prob, abs=TOLERANCE)
    if parted is None:
        assert len(ours) == len(cold)
        return
    mine, theirs = ({c.token_id: c.prob for c in side[parted].top} for side in (ours, cold))
    picks = (ours[parted].token_id, cold[parted].token_id)
    assert all(pick in mine and pick in theirs for pick in picks), f"parted at token {parted}: {mine} / {theirs}"
    for pick in picks:
        assert mine[pick] == pytest.approx(theirs[pick], abs=TOLERANCE), f"parted at token {parted} beyond rounding"
    assert mine[picks[0]] - mine[picks[1]] < 2 * TOLERANCE, f"parted at token {parted} without a near tie: {mine}"


def test_sliding_window_cache_reuse_matches_a_fresh_read(starter):
    """Turn after turn past the 512-token sliding window: replies from the reused cache equal fresh reads."""
    notes = "Notes on European capitals. " + "Paris is on the Seine and Berlin is on the Spree. " * 45
    conversation: list[Message] = [Message("system", notes)]
    reused = []
    params = LiveParams(GREEDY.with_changes(max_tokens=120))
    for question in QUESTIONS:
        conversation.append(Message("user", question))
        history = starter.transcript.text, list(starter.transcript.tokens)
        tokens, done = collect(starter.generate(Request(list(conversation), params, top_logprobs=2)))
        reused.append(done.metrics.cached_tokens)
        conversation.append(Message("assistant", done.text))
    assert done.metrics.prompt_tokens > 600, "the conversation must outgrow the 512-token sliding window"
    assert all(later > 600 for later in reused[1:])
    starter.transcript.text, starter.transcript.tokens = history
    starter.session.keep_prefix([])
    fresh_tokens, fresh = collect(starter.generate(Request(conversation[:-1], params, top_logprobs=2)))
    assert fresh.metrics.cached_tokens == 0
    assert fresh.prompt_ids == done.prompt_ids
    assert_alike_until_a_near_tie(tokens, fresh_tokens)


def test_prefill_reports_progress_and_can_be_cancelled(starter):
    long_question = "Summarise this: " + "The quick brown fox jumps over the lazy dog. " * 180
    stream = starter.generate(Request([Message("user", long_question)], LiveParams(GREEDY)))
    cancelled_at = None
    progress = []
    for event in stream:
        if isinstance(event, PromptProgress):
            progress.append(event)
            if event.done > 0 and cancelled_at is None:
                cancelled_at = time.perf_counter()
                stream.cancel()
        elif isinstance(event, Done):
            done, ended_at = event, time.perf_counter()
    assert progress[0].total > 1500
    assert progress[-1].done < progress[-1].total, "cancelled before the whole prompt was read"
    assert progress[1].eta_s is not None and progress[1].eta_s > 0
    assert done.stop_reason == "cancelled" and done.metrics.completion_tokens == 0
    assert ended_at - cancelled_at < 0.5
    again = ask(starter, QUESTIONS[0])
    assert again.text.strip() == "The capital of France is Paris."


def test_seeded_sampling_repeats_on_the_starter(starter_model):
    """The same seed draws the same reply when the run takes the same path: a fresh context each time.
    (From a warm cache the logits can differ in their last bits on some CPUs, and a draw with them.)"""
    params = GREEDY.with_changes(temperature=0.9, seed=1234, max_tokens=40)
    replies = []
    for _ in range(2):
        backend = open_backend(starter_model, n_ctx=2048)
        try:
            replies.append(ask(backend, QUESTIONS[2], params).text)
        finally:
            backend.close()
    assert replies[0] == replies[1]


def test_decode_metrics_are_live_and_consistent(starter):
    request = Request([Message("user", QUESTIONS[5])], LiveParams(GREEDY.with_changes(max_tokens=60)))
    events, done = collect(starter.generate(request))
    m = done.metrics
    perf = starter.session.perf()
    assert perf.n_eval == m.completion_tokens - 1
    assert 0.5 < m.decode_tok_s / (perf.n_eval / (perf.eval_ms / 1000)) <= 1.05
    assert 0 < m.ttft_s < 5


def test_a_branch_on_the_starter_rewinds_the_cache_and_matches_a_fresh_read(starter):
    """Branching inside a reply on the sliding-window model reads one token, and continues as a cold
    cache reading the whole prompt does, up to rounding: they may part only at a near tie.

    On this Q4_K_M model a batched read and one-token steps use different quantised kernels, so
    probabilities differ by up to ~0.01 on AVX2 and ~0.055 on AVX-512 (measured), not the ~1e-4 of the f32
    tiny model."""
    question = [Message("user", QUESTIONS[5])]
    params = LiveParams(GREEDY.with_changes(max_tokens=60))
    starter.session.keep_prefix([])  # the original reply too is read whole, as in a fresh chat
    tokens, done = collect(starter.generate(Request(question, params, top_logprobs=5)))
    cut = len(tokens) // 2
    assert cut > 5
    forced = tuple(t.token_id for t in tokens[:cut]) + (tokens[cut].top[1].token_id,)
    branch_tokens, branch = collect(starter.generate(Request(question, params, top_logprobs=2, forced=forced)))
    assert branch.metrics.prompt_tokens - branch.metrics.cached_tokens == 1
    assert branch.text != done.text
    starter.session.keep_prefix([])
    fresh_tokens, fresh = collect(starter.generate(Request(question, params, top_logprobs=2, forced=forced)))
    assert fresh.metrics.cached_tokens == 0
    assert_alike_until_a_near_tie(branch_tokens, fresh_tokens)


def test_a_media_placeholder_the_model_writes_is_kept_as_a_token_not_as_text(starter_model):
    """Gemma's `<start_of_image>` is a user-defined token in the starter's file (as `<table>` is), so llama.cpp
    prints it as text; a text chat has no image to open (issue 25, item 18). Drawn here through a logit bias:
    the reply's text leaves it out, its token stays, named, for the inspector."""
    result = run_cli("run", "-m", str(starter_model), "-p", "Show me a picture of a cat.", "--temperature", "0",
                     "--logit-bias", "<start_of_image>=+100", "--max-tokens", "3", "--top-logprobs", "2", "--json")
    assert result.returncode == 0, result.stderr
    [turn] = json.loads(result.stdout)["turns"]
    assert "<start_of_image>" not in turn["text"] and turn["text"] == ""
    assert [t["id"] for t in turn["tokens"]] == [255999] * 3
    assert all(t["token"] == "" and t["special"] == "<start_of_image>" for t in turn["tokens"])
    table = run_cli("run", "-m", str(starter_model), "-p", "Hi", "--temperature", "0", "--logit-bias", "<table>=+100",
                    "--max-tokens", "2", "--json")
    assert json.loads(table.stdout)["turns"][0]["text"].startswith("<table><table>"), "an HTML tag is text"
