"""Per-token probabilities from the decode loop: checked against an independent softmax of llama.cpp's logits."""

import json

import llama_cpp
import numpy as np
import pytest

from conftest import GREEDY, collect, run_cli
from tui_chat.engine.base import Message, PoolCut, Request
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.engine.pool import kept_by, pool_cut

PROMPT = "Hello, what is the capital of France?"
SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.0, seed=11, max_tokens=24)


def inspected(backend, params: SamplingParams, top: int = 5):
    return collect(backend.generate(Request([Message("user", PROMPT)], LiveParams(params), top_logprobs=top)))


def softmax(row: np.ndarray) -> np.ndarray:
    shifted = np.exp(row.astype(np.float64) - row.max())
    return shifted / shifted.sum()


def test_probabilities_match_an_independent_softmax_of_all_logits(tiny, tiny_model):
    tokens, done = inspected(tiny, SAMPLED, top=10)
    reference = llama_cpp.Llama(model_path=str(tiny_model), n_ctx=512, logits_all=True, verbose=False)
    ids = list(done.prompt_ids) + [t.token_id for t in tokens]
    reference.eval(ids[:-1])
    first = len(done.prompt_ids) - 1
    for step, token in enumerate(tokens):
        expected = softmax(reference.scores[first + step])
        assert token.prob == pytest.approx(expected[token.token_id], abs=1e-3)
        order = np.argsort(expected)[::-1][:10]
        assert [c.prob for c in token.top] == pytest.approx(list(expected[order]), abs=1e-3)
        assert {c.token_id for c in token.top[:3]} == set(order[:3].tolist())


def test_temperature_zero_equals_top_k_one(tiny):
    greedy, _ = inspected(tiny, GREEDY)
    top_one, _ = inspected(tiny, GREEDY.with_changes(temperature=1.0, top_k=1, seed=5))
    assert [t.token_id for t in greedy] == [t.token_id for t in top_one]
    assert all(t.pool == PoolCut(1, 1, 1) for t in greedy)
    assert all(t.pool.top_k == 1 for t in top_one)


def test_same_seed_same_reply_and_same_probabilities(tiny):
    one, _ = inspected(tiny, SAMPLED)
    two, _ = inspected(tiny, SAMPLED)
    assert [(t.token_id, t.prob, t.top) for t in one] == [(t.token_id, t.prob, t.top) for t in two]


def test_pool_cut_reported_per_token(tiny):
    tokens, _ = inspected(tiny, SAMPLED)
    for token in tokens:
        assert token.pool.top_k == 40
        assert 1 <= token.pool.min_p <= token.pool.top_p <= 40
        assert token.piece and token.prob > 0


def test_pool_cut_follows_llama_cpp_order():
    ranked = np.array([0.4, 0.3, 0.2, 0.05, 0.03, 0.02])
    params = SamplingParams(temperature=1.0, top_k=4, top_p=0.75, min_p=0.0)
    # top-k keeps 4 (mass 0.95); renormalised, 0.4/0.95 + 0.3/0.95 = 0.737 < 0.75, a third is needed.
    assert pool_cut(ranked, 100, params) == PoolCut(4, 3, 3)
    assert pool_cut(ranked, 100, params.with_changes(min_p=0.6)) == PoolCut(4, 3, 2)
    assert pool_cut(ranked, 100, params.with_changes(top_k=0, top_p=1.0, min_p=0.1)) == PoolCut(100, 100, 4)
    assert pool_cut(ranked[:3], 100, params.with_changes(top_k=0, top_p=0.95)) == PoolCut(100, None, None)


def test_kept_by_counts_what_the_settings_keep_among_the_listed_candidates():
    listed = [0.4, 0.3, 0.2, 0.05, 0.03]
    assert kept_by(listed, SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)) == 2
    assert kept_by(listed, SamplingParams(temperature=1.0, top_k=0, top_p=0.6, min_p=0.0)) == 2
    assert kept_by(listed, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1)) == 4
    assert kept_by(listed, SamplingParams(temperature=1.0, top_k=0, top_p=0.99, min_p=0.0)) == 5
    assert kept_by(listed, SamplingParams(temperature=0.0)) == 1


def test_headless_json_carries_tokens_and_prompt_ids(tiny_model, tiny):
    result = run_cli("run", "-m", str(tiny_model), "-p", PROMPT, "--temperature", "0",
                     "--max-tokens", "8", "--top-logprobs", "3", "--json")
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    assert len(turn["tokens"]) == 8 and turn["prompt_ids"][0] == 1
    assert len(turn["prompt_ids"]) == turn["prompt_tokens"]
    for entry in turn["tokens"]:
        assert len(entry["top"]) == 3 and entry["id"] == entry["top"][0]["id"]
        assert entry["prob"] == pytest.approx(entry["top"][0]["prob"])
    assert "".join(e["token"] for e in turn["tokens"]) == turn["text"]  # the reply exactly, whitespace included


def test_headless_refuses_too_many_alternatives(tiny_model):
    result = run_cli("run", "-m", str(tiny_model), "-p", "hi", "--top-logprobs", "50")
    assert result.returncode == 2 and "top-logprobs must be a whole number between 0 and 20 (got 50)" in result.stderr


def branch_of(backend, tokens, cut: int, rank: int = 1, params: SamplingParams = GREEDY):
    """Branch the reply at token `cut`: keep what came before and force its `rank`-th alternative."""
    forced = tuple(t.token_id for t in tokens[:cut]) + (tokens[cut].top[rank].token_id,)
    request = Request([Message("user", PROMPT)], LiveParams(params), top_logprobs=5, forced=forced)
    return forced, collect(backend.generate(request))


def greedy_reference(model_path, prompt_ids, count: int) -> list[int]:
    """A fresh llama-cpp-python model, reading the whole prompt in one go: no cache shared with ours."""
    reference = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, verbose=False)
    produced = []
    for token in reference.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0):
        if len(produced) == count:
            break
        produced.append(token)
    return produced


def test_a_branch_rewinds_the_cache_and_continues_as_a_fresh_prompt_would(tiny, tiny_model):
    tokens, done = inspected(tiny, GREEDY)
    cut = len(tokens) // 2
    forced, (branch_tokens, branch) = branch_of(tiny, tokens, cut)
    assert branch.prompt_ids == done.prompt_ids, "the given tokens are the reply's start, not its prompt"
    assert branch.metrics.prompt_tokens - branch.metrics.cached_tokens == 1
    given = [t for t in branch_tokens if t.forced]
    drawn = [t for t in branch_tokens if not t.forced]
    assert [t.token_id for t in given] == list(forced) and all(t.prob is None for t in given)
    assert branch.metrics.completion_tokens == len(drawn) > 0
    assert [t.token_id for t in drawn] == greedy_reference(tiny_model, branch.prompt_ids + forced, len(drawn))
    assert branch.text == "".join(t.text for t in branch_tokens)
    assert branch.text.startswith("".join(t.text for t in tokens[:cut]))


def test_the_original_reply_comes_back_from_the_cache_after_a_branch(tiny):
    tokens, done = inspected(tiny, GREEDY)
    branch_of(tiny, tokens, 3)
    again_tokens, again = inspected(tiny, GREEDY)
    assert again.text == done.text
    assert [t.prob for t in again_tokens] == pytest.approx([t.prob for t in tokens], abs=1e-4)


def test_forcing_the_end_of_text_token_ends_the_reply(tiny):
    tokens, done = inspected(tiny, GREEDY)
    eos = llama_cpp.llama_vocab_eos(tiny.session.vocab)
    request = Request([Message("user", PROMPT)], LiveParams(GREEDY), forced=(tokens[0].token_id, eos))
    branch_tokens, branch = collect(tiny.generate(request))
    assert branch.stop_reason == "eos" and branch.metrics.completion_tokens == 0
    assert branch.text == tokens[0].text


def test_the_shortlist_of_the_likeliest_tokens_is_the_whole_partition():
    """Peaked, flat and banned (-inf) logits: the same set as a partition of the whole vocabulary."""
    import numpy as np

    from tui_chat.engine.pool import likeliest

    rng = np.random.default_rng(7)
    for spread in (0.5, 3.0, 30.0):
        logits = (rng.standard_normal(262_144) * spread).astype(np.float32)
        logits[rng.integers(0, len(logits), 50)] = -np.inf
        for k in (1, 10, 40, 1024):
            assert set(likeliest(logits, k)) == set(np.argsort(logits)[-k:]), (spread, k)
    assert len(likeliest(np.zeros(5, dtype=np.float32), 10)) == 5
