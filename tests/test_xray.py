"""The sampler X-ray and word probabilities on real models: figures against the inspector, against an
independent softmax of llama.cpp's logits and against the reply itself; recomputed on demand in the
scratch sequence without disturbing the conversation."""

import json

import llama_cpp
import numpy as np
import pytest

from conftest import GREEDY, open_backend, run_cli
from tui_chat.engine.base import Candidate, Done, Error, Message, PromptProgress, Request, Token, XRay
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.engine.stages import plan
from tui_chat.probe import TokenProbe, position_context
from tui_chat.session import ChatSession

PROMPT = "Hello, what is the capital of France?"
SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.0, seed=11, max_tokens=24)


@pytest.fixture(scope="module")
def steady_tiny(tiny_model):
    """A fixed thread count: one that follows the machine's load changes the rounding between two runs,
    and these tests compare figures computed at different moments to 1e-6."""
    backend = open_backend(tiny_model, n_ctx=1024, threads=1, threads_batch=1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def steady_starter(starter_model):
    backend = open_backend(starter_model, n_ctx=2048, threads=1, threads_batch=1)
    yield backend
    backend.close()


def reply(backend, params: SamplingParams, **request) -> tuple[list[Token], Done, tuple[int, ...]]:
    prompt_ids = ()
    tokens, done = [], None
    for event in backend.generate(Request([Message("user", PROMPT)], LiveParams(params), **request)):
        if isinstance(event, PromptProgress) and event.prompt_ids:
            prompt_ids = event.prompt_ids
        elif isinstance(event, Token):
            tokens.append(event)
        elif isinstance(event, (Done, Error)):
            done = event
    assert isinstance(done, Done), done
    assert prompt_ids == done.prompt_ids
    return tokens, done, prompt_ids


def softmax(row: np.ndarray) -> np.ndarray:
    shifted = np.exp(row.astype(np.float64) - row.max())
    return shifted / shifted.sum()


def test_stages_of_each_token_agree_with_the_pool_arithmetic_and_the_raw_distribution(tiny, tiny_model):
    tokens, done, _ = reply(tiny, SAMPLED, top_logprobs=5, xray=True)
    reference = llama_cpp.Llama(model_path=str(tiny_model), n_ctx=512, logits_all=True, verbose=False)
    reference.eval(list(done.prompt_ids) + [t.token_id for t in tokens][:-1])
    first = len(done.prompt_ids) - 1
    for step, token in enumerate(tokens):
        names = [s.name for s in token.stages]
        assert names == ["top_k", "top_p", "min_p", "temperature"]
        top_k, top_p, min_p, temperature = token.stages
        assert (top_k.kept, top_p.kept, min_p.kept) == (token.pool.top_k, token.pool.top_p, token.pool.min_p)
        raw = np.sort(softmax(reference.scores[first + step]))[::-1]
        assert top_k.mass == pytest.approx(raw[:40].sum(), abs=1e-3)
        assert min_p.mass == pytest.approx(raw[: min_p.kept].sum(), abs=1e-3)
        assert temperature.kept == min_p.kept and temperature.mass == min_p.mass
        # the drawn token survived every cut; temperature changes its share, not its rank
        assert all(s.rank is not None for s in token.stages) and temperature.rank == min_p.rank
        assert top_k.prob == pytest.approx(token.prob / top_k.mass, rel=1e-4)


def test_on_demand_xray_equals_the_one_taken_while_drawing(steady_tiny):
    params = SAMPLED.with_changes(repeat_penalty=1.2)
    tokens, _, prompt_ids = reply(steady_tiny, params, top_logprobs=3, xray=True)
    for index in range(1, len(tokens)):
        token = tokens[index]
        xray = steady_tiny.xray(position_context(prompt_ids, tokens, index), token.token_id, params).result()
        assert isinstance(xray, XRay), xray
        assert xray.prob == pytest.approx(token.prob, abs=1e-6)
        assert [(s.name, s.kept, s.rank) for s in xray.stages] == [(s.name, s.kept, s.rank) for s in token.stages]
        assert [s.mass for s in xray.stages] == pytest.approx([s.mass for s in token.stages], abs=1e-6)
        assert xray.verdict.startswith(f"{token.piece!r} drawn at rank {xray.rank} with p = ")


def test_the_verdict_names_what_let_a_token_through(tiny):
    """Greedy with a repeat penalty: where the pick is not the raw favourite, the penalty is the reason."""
    params = GREEDY.with_changes(repeat_penalty=2.0, max_tokens=48)
    tokens, _, prompt_ids = reply(tiny, params, top_logprobs=1)
    moved = [i for i, t in enumerate(tokens) if t.top[0].token_id != t.token_id]
    assert moved, "the penalty changed at least one greedy pick"
    for index in moved[:3]:
        xray = tiny.xray(position_context(prompt_ids, tokens, index), tokens[index].token_id, params).result()
        assert [s.name for s in xray.stages] == ["penalties", "greedy"]
        assert xray.rank > 1 and xray.stages[0].rank == 1
        assert xray.verdict.endswith("because repeat penalty 2 pushed the likelier tokens below it, "
                                     "and temperature 0 takes the likeliest")


def test_word_probability_of_the_top_word_equals_the_inspectors(steady_starter):
    tokens, _, prompt_ids = reply(steady_starter, GREEDY, top_logprobs=5)
    checked = 0
    for index, token in enumerate(tokens[:12]):
        best = token.top[0]
        word = steady_starter.word_probability(position_context(prompt_ids, tokens, index), best.text).result()
        if [t.token_id for t in word.tokens] != [best.token_id]:
            continue  # this piece tokenizes differently when written on its own
        # Recomputed in the scratch sequence, the position's logits come from another llama_decode than the
        # reply's step: the same numbers on an AMD EPYC (1e-6), ~2 % apart on an Intel Xeon with AVX-512, whose
        # kernels sum a batch's rows in another order (issue 38). Near-ties aside, the rank holds on both.
        assert word.prob == pytest.approx(best.prob, rel=0.05)
        assert word.rank == 1
        checked += 1
    assert checked >= 5


def test_a_two_token_phrase_is_the_product_of_its_conditionals_measured_by_feeding_it(steady_starter):
    tokens, _, prompt_ids = reply(steady_starter, GREEDY.with_changes(max_tokens=4))
    context = position_context(prompt_ids, tokens, 1)
    phrase = steady_starter.word_probability(context, " Paris is").result()
    assert len(phrase.tokens) == 2
    first, second = phrase.tokens
    fed = steady_starter.word_probability(context + (first.token_id,), second.text).result()
    assert [t.token_id for t in fed.tokens] == [second.token_id]
    alone = steady_starter.word_probability(context, first.text).result()
    assert phrase.prob == pytest.approx(alone.prob * fed.prob, rel=1e-6)


def test_word_probability_far_outside_the_top_twenty(tiny, tiny_model):
    """The probability of an unlikely word, checked against an independent run of llama.cpp."""
    tokens, done, prompt_ids = reply(tiny, GREEDY.with_changes(max_tokens=3))
    context = position_context(prompt_ids, tokens, 2)
    reference = llama_cpp.Llama(model_path=str(tiny_model), n_ctx=512, logits_all=True, flash_attn=True,
                                verbose=False)
    reference.eval(list(context))
    raw = softmax(reference.scores[len(context) - 1])
    rare = int(np.argsort(raw)[len(raw) // 2])  # a median token: rank ~450 of 893
    word = tiny.word_probability(context, tiny.session.detokenize([rare])).result()
    assert word.tokens[0].token_id == rare and word.rank > 20
    assert word.prob == pytest.approx(raw[rare], rel=1e-3)


def test_xray_mid_reply_leaves_the_reply_as_it_would_have_been(steady_tiny):
    """An X-ray asked for while a reply is written runs between two tokens, in the scratch sequence: it
    comes back before the reply ends, and the reply is the one written without it. (Its cells may sit
    elsewhere in the cache afterwards, which moves logits by rounding only: hence greedy, and tolerances.)"""
    params = GREEDY.with_changes(max_tokens=600)
    undisturbed, _, _ = reply(steady_tiny, params, top_logprobs=1)
    stream = steady_tiny.generate(Request([Message("user", PROMPT)], LiveParams(params), top_logprobs=1))
    seen, prompt_ids, xray, arrived_at = [], (), None, None
    for event in stream:
        if isinstance(event, PromptProgress) and event.prompt_ids:
            prompt_ids = event.prompt_ids
        if isinstance(event, Token):
            seen.append(event)
            if xray is None:
                xray = steady_tiny.xray(position_context(prompt_ids, seen, 0), event.token_id, params)
            elif arrived_at is None and xray.drain(0):
                arrived_at = len(seen)
    assert arrived_at is not None and arrived_at < len(seen)
    assert [t.token_id for t in seen] == [t.token_id for t in undisturbed]
    assert [t.prob for t in seen] == pytest.approx([t.prob for t in undisturbed], abs=1e-5)


def test_xray_opens_quickly_on_the_starter_model(steady_starter):
    tokens, _, prompt_ids = reply(steady_starter, SamplingParams(seed=2, max_tokens=16))
    times = []
    for index in range(1, len(tokens)):
        xray = steady_starter.xray(position_context(prompt_ids, tokens, index), tokens[index].token_id,
                            SamplingParams(seed=2, max_tokens=16)).result()
        times.append(xray.elapsed_s)
    # the target is < 100 ms on a quiet machine (benchmarks/sampling.py); a loaded test runner gets slack
    assert np.median(times) < 0.5


def test_bad_questions_get_one_line(tiny):
    assert tiny.xray((), 5, GREEDY).result() == Error("there is no text before this position to compute it from")
    assert tiny.word_probability((1, 2), "").result() == Error("type a word or phrase to ask about")


def test_stage_entries_for_the_json_report(tiny):
    tokens, _, _ = reply(tiny, SAMPLED, xray=True)
    entry = tokens[0].stages[0].as_dict()
    assert set(entry) == {"name", "kept", "mass", "rank", "prob"} and entry["name"] == "top_k"


def _finish(session: ChatSession) -> None:
    for event in session.writing.stream:
        if session.take([event]).ending is not None:
            return


def _check_against_the_record(backend, session: ChatSession, branch, indexes) -> int:
    """The X-ray and the word probability at each drawn token of `branch`, recomputed as the inspector
    does, give the probability the reply recorded when it drew that token."""
    probe = TokenProbe(backend, session.live, branch, session.model)
    assert probe.why_not() is None
    checked = 0
    for index in indexes:
        token = branch.tokens[index]
        if token.forced:
            continue
        xray = probe.xray(index).result()
        assert isinstance(xray, XRay), xray
        assert xray.prob == pytest.approx(token.prob, abs=1e-4), f"token {index} {token.piece!r}"
        assert xray.rank == 1 + sum(c.prob > token.prob for c in token.top if c.token_id != token.token_id)
        checked += 1
    return checked


def test_xray_on_a_branched_and_a_continued_reply_equals_the_replys_own_record(steady_starter):
    """A branch and a continuation (F8) start with tokens the engine was given: the X-ray reads each of
    them once, in place, as the model did (issue 25, item 3: it used to read the kept prefix twice)."""
    session = ChatSession(LiveParams(GREEDY.with_changes(max_tokens=20)), model="starter", top_logprobs=5)
    turn = session.ask("Write a short poem about the sea.", steady_starter.generate)
    _finish(session)
    first = turn.reply
    assert len(first.tokens) == 20
    assert _check_against_the_record(steady_starter, session, first, [0, 6, 14]) == 3
    alternative = first.tokens[5].top[1]
    session.branch(5, Candidate(alternative.token_id, alternative.text, alternative.prob), steady_starter.generate)
    _finish(session)
    branched = turn.reply
    assert branched is not first and branched.tokens[5].forced and len(branched.tokens) > 15
    assert _check_against_the_record(steady_starter, session, branched, [2, 6, 9, 14]) == 4
    session.continue_reply(steady_starter.generate)
    _finish(session)
    continued = turn.reply
    kept = len(branched.tokens)
    assert continued is not branched and len(continued.tokens) > kept + 4
    assert _check_against_the_record(steady_starter, session, continued, [3, kept - 1, kept, kept + 3]) == 4



def recomputed_stages(raw_logits: np.ndarray, window: list[int], token: int, params: SamplingParams) -> list[tuple]:
    """The default chain (repeat penalty, top-k, top-p, min-p, XTC firing, temperature) redone in numpy from
    a position's raw logits, as llama.cpp's samplers define each stage: (name, kept, mass, rank, prob)."""
    raw = softmax(raw_logits)
    logits = raw_logits.astype(np.float64).copy()
    ids = np.arange(len(logits))
    out = []

    def record(name):
        kept = logits[ids]
        mine = np.flatnonzero(ids == token)
        share = softmax(kept)
        rank = 1 + int(np.count_nonzero(kept > kept[mine[0]])) if mine.size else None
        out.append((name, len(ids), float(raw[ids].sum()), rank, float(share[mine[0]]) if mine.size else None))

    for stage in plan(params)[:-1]:
        if stage == "penalties":
            seen = np.unique(window[-64:])
            logits[seen] = np.where(logits[seen] > 0, logits[seen] / params.repeat_penalty,
                                    logits[seen] * params.repeat_penalty)
        elif stage == "top_k":
            ids = ids[np.argsort(-logits[ids], kind="stable")][: params.top_k]
        elif stage == "top_p":
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            cumulative = np.cumsum(softmax(logits[ids]))
            ids = ids[: 1 + int(np.searchsorted(cumulative, params.top_p))]
        elif stage == "min_p":
            ids = ids[logits[ids] >= logits[ids].max() + np.log(params.min_p)]
        elif stage == "xtc":  # fires (probability 1): every candidate at or above the threshold but the last goes
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            above = int(np.count_nonzero(softmax(logits[ids]) >= params.xtc_threshold))
            ids = ids[above - 1 :] if above > 1 else ids
        elif stage == "temperature":
            logits[ids] /= params.temperature
        else:
            raise AssertionError(f"not recomputed here: {stage}")
        record(stage)
    return out


@pytest.mark.parametrize("flags", [
    ["--xtc-probability", "1.0", "--xtc-threshold", "0.1"],  # issue 25, item 4
    [],  # the default chain
], ids=["xtc", "default-chain"])
def test_run_xray_stages_equal_a_numpy_recomputation_from_the_raw_logits(starter_model, flags):
    result = run_cli("run", "-m", str(starter_model), "-p", "Tell me a story about a cat", *flags, "--max-tokens", "16",
                     "--seed", "5", "--top-logprobs", "5", "--xray", "--json", "--threads", "1")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    params = SamplingParams(**{k: tuple(v) if isinstance(v, list) else v for k, v in report["params"].items()
                               if k not in ("stop", "logit_bias")})
    turn = report["turns"][0]
    prompt, tokens = turn["prompt_ids"], turn["tokens"]
    reference = llama_cpp.Llama(model_path=str(starter_model), n_ctx=512, logits_all=True, flash_attn=True,
                                n_threads=1, verbose=False)
    reference.eval(prompt)  # the prompt in one batch, then one token at a time, as the engine reads them
    rows = [np.array(reference.scores[len(prompt) - 1])]
    for entry in tokens[:-1]:
        reference.eval([entry["id"]])
        rows.append(np.array(reference.scores[reference.n_tokens - 1]))
    xtc_fired = 0
    for index, (entry, row) in enumerate(zip(tokens, rows, strict=True)):
        expected = recomputed_stages(row, prompt + [t["id"] for t in tokens[:index]], entry["id"], params)
        stages = entry["stages"]
        assert [s["name"] for s in stages] == [e[0] for e in expected]
        for stage, (name, kept, mass, rank, prob) in zip(stages, expected, strict=True):
            where = f"token {index} {entry['token']!r}, {name}"
            assert (stage["kept"], stage["rank"]) == (kept, rank), where
            assert stage["mass"] == pytest.approx(mass, abs=2e-3), where
            assert stage["prob"] == pytest.approx(prob, abs=2e-3), where
        assert all(s["rank"] is not None for s in stages), "a drawn token survived every stage"
        named = {s["name"]: s for s in stages}
        assert named["temperature"]["rank"] == stages[-2]["rank"], "temperature never reorders"
        if "xtc" in named:
            xtc_fired += named["xtc"]["kept"] < named["min_p"]["kept"]
    if flags:
        assert xtc_fired >= 3, "XTC removed candidates at several tokens"
