"""Each sampler setting against llama.cpp's own sampler, on fixed logits over the tiny model's vocabulary;
the order of the chain; the logit bias. The chain is built by chain.py from SamplingParams, the reference
by hand from llama.cpp's constructors: same survivors, same draw with the same seed."""

import ctypes
import math

import llama_cpp
import numpy as np
import pytest

from conftest import GREEDY, collect
from tui_chat.engine.base import Message, Request, Stage
from tui_chat.engine.local.chain import DRY_SEQUENCE_BREAKERS, PENALTY_LAST_N, Candidates, plan
from tui_chat.engine.local.cpu import Threads
from tui_chat.engine.local.llamacpp import LlamaSession
from tui_chat.engine.local.xray import explain, verdict
from tui_chat.engine.params import DEFAULT_ORDER, LiveParams, SamplingParams

# Every sampler off: each test turns on one.
BARE = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
SEEDS = range(8)


@pytest.fixture(scope="module")
def session(tiny_model):
    session = LlamaSession(tiny_model, n_ctx=256, gpu_layers=0, n_batch=32, threads=Threads(1, 1))
    yield session
    session.close()


@pytest.fixture(scope="module")
def logits(session):
    return np.random.default_rng(7).normal(0.0, 2.5, session.n_vocab).astype(np.float32)


@pytest.fixture(scope="module")
def history(session):
    """Recent tokens with a repeat in them, for the penalties and DRY: `... the capital of` again."""
    words = session.continuation(" what is the capital of France and what is the capital of")
    return words


def _dry(session, seed):
    breakers = (ctypes.c_char_p * len(DRY_SEQUENCE_BREAKERS))(*(b.encode() for b in DRY_SEQUENCE_BREAKERS))
    return llama_cpp.llama_sampler_init_dry(session.vocab, 0.8, 1.75, 2, 64, breakers, len(DRY_SEQUENCE_BREAKERS))


def _bias(session, seed):
    entries = [llama_cpp.llama_logit_bias(_token_of(session, b" Paris"), 5.0),
               llama_cpp.llama_logit_bias(_token_of(session, b" the"), -math.inf)]
    return llama_cpp.llama_sampler_init_logit_bias(session.n_vocab, 2, (llama_cpp.llama_logit_bias * 2)(*entries))


def _token_of(session, piece: bytes) -> int:
    return next(t for t in range(session.n_vocab) if session.piece(t) == piece)


CASES = {
    "typical_p": ({"typical_p": 0.6}, lambda s, seed: llama_cpp.llama_sampler_init_typical(0.6, 1)),
    "top_n_sigma": ({"top_n_sigma": 1.2}, lambda s, seed: llama_cpp.llama_sampler_init_top_n_sigma(1.2)),
    "xtc": ({"xtc_probability": 0.7, "xtc_threshold": 0.02},
            lambda s, seed: llama_cpp.llama_sampler_init_xtc(0.7, 0.02, 1, seed)),
    "penalties": ({"repeat_penalty": 1.3, "frequency_penalty": 0.4, "presence_penalty": 0.2},
                  lambda s, seed: llama_cpp.llama_sampler_init_penalties(s.n_vocab, PENALTY_LAST_N, 1.3, 0.4, 0.2)),
    "dry": ({"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64}, _dry),
    "mirostat_v2": ({"mirostat_tau": 3.0, "mirostat_eta": 0.1},
                    lambda s, seed: llama_cpp.llama_sampler_init_mirostat_v2(seed, 3.0, 0.1)),
    "logit_bias": ({"logit_bias": [" Paris=5", " the=-inf"]}, _bias),
    "temperature": ({"temperature": 0.5}, lambda s, seed: llama_cpp.llama_sampler_init_temp(0.5)),
    "top_k": ({"top_k": 12}, lambda s, seed: llama_cpp.llama_sampler_init_top_k(12)),
    "top_p": ({"top_p": 0.5}, lambda s, seed: llama_cpp.llama_sampler_init_top_p(0.5, 1)),
    "min_p": ({"min_p": 0.2}, lambda s, seed: llama_cpp.llama_sampler_init_min_p(0.2, 1)),
}


def _primed(sampler, history):
    for token in history:
        llama_cpp.llama_sampler_accept(sampler, token)
    return sampler


def _survivors(sampler, logits) -> dict[int, float]:
    candidates = Candidates(np.arange(len(logits), dtype=np.int32), logits)
    candidates.apply(sampler)
    rows = candidates.survivors()
    return dict(zip(rows["id"].tolist(), rows["logit"].tolist(), strict=True))


@pytest.mark.parametrize("stage", CASES)
def test_each_sampler_keeps_what_llama_cpp_keeps_and_draws_the_same(session, logits, history, stage):
    changes, reference = CASES[stage]
    params = BARE.with_changes(**changes)
    selector = "mirostat_v2" if stage == "mirostat_v2" else "dist"
    assert plan(params) == ((stage, selector) if stage != selector else (selector,))
    for seed in SEEDS:
        ours = session.chains.build(params, seed, history)
        theirs = _primed(reference(session, seed), history)
        try:
            assert _survivors(ours.element(0), logits) == _survivors(theirs, logits)
        finally:
            ours.free()
            llama_cpp.llama_sampler_free(theirs)
        ours = session.chains.build(params, seed, history)
        theirs = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(theirs, reference(session, seed))
        if selector == "dist":
            llama_cpp.llama_sampler_chain_add(theirs, llama_cpp.llama_sampler_init_dist(seed))
        _primed(theirs, history)
        try:
            drawn = ours.apply(Candidates(np.arange(len(logits), dtype=np.int32), logits))
            candidates = Candidates(np.arange(len(logits), dtype=np.int32), logits)
            candidates.apply(theirs)
            assert drawn == candidates.selected
        finally:
            ours.free()
            llama_cpp.llama_sampler_free(theirs)


def test_each_sampler_changes_these_logits(session, logits, history):
    """Guards the comparison above against samplers that were silently off on both sides."""
    untouched = _survivors(llama_cpp.llama_sampler_init_temp(1.0), logits)
    for stage, (_, reference) in CASES.items():
        if stage == "mirostat_v2":
            continue  # it picks; its truncation depends on its running target
        sampler = _primed(reference(session, 0), history)
        assert _survivors(sampler, logits) != untouched, stage
        llama_cpp.llama_sampler_free(sampler)


def test_the_plan_follows_llama_cpp():
    assert plan(SamplingParams()) == ("penalties", "top_k", "top_p", "min_p", "temperature", "dist")
    # temperature 0: greedy where temperature stands; the cuts that keep the likeliest cannot change it
    assert plan(SamplingParams(temperature=0.0, xtc_probability=0.5)) == ("penalties", "xtc", "greedy")
    assert plan(SamplingParams(temperature=0.0, sampler_order=("temperature", "xtc"), xtc_probability=0.5)) == (
        "greedy",)
    # mirostat replaces the ordered stages, as in llama.cpp; the bias always comes first
    assert plan(SamplingParams(mirostat_tau=5.0, logit_bias=(("a", 1.0),))) == (
        "logit_bias", "temperature", "mirostat_v2")
    # a stage left out of the order is not applied
    assert plan(SamplingParams(sampler_order=("min_p", "temperature"))) == ("min_p", "temperature", "dist")


def _seven_four_nine_eight(n_vocab: int) -> tuple[np.ndarray, int, int]:
    """llama.cpp #7498's situation: a token at 96 %, one at 1 %, and a long tail."""
    logits = np.full(n_vocab, -30.0, dtype=np.float32)
    likely, rare = 600, 601
    logits[likely] = 0.0
    logits[rare] = math.log(0.01 / 0.96)
    return logits, likely, rare


def test_order_decides_whether_a_one_percent_token_survives_min_p(session):
    """#7498: with min-p 0.05 a 1 % token next to a 96 % one is cut, unless temperature ran first and
    flattened the distribution min-p looks at. llama.cpp's default order runs temperature last."""
    logits, likely, rare = _seven_four_nine_eight(session.n_vocab)
    hot = BARE.with_changes(temperature=2.0, min_p=0.05)
    temperature_first = hot.with_changes(sampler_order=("temperature", "min_p"))
    draws = {}
    for name, params in (("default", hot), ("temperature first", temperature_first)):
        draws[name] = set()
        for seed in range(200):
            chain = session.chains.build(params, seed, ())
            draws[name].add(chain.apply(Candidates(np.arange(len(logits), dtype=np.int32), logits)))
            chain.free()
    assert draws["default"] == {likely}
    assert draws["temperature first"] == {likely, rare}

    prob, rank, stages, verdict = explain(session, logits, rare, "rare", temperature_first, ())
    assert rank == 2 and prob == pytest.approx(0.01 / 0.96 / (1 + 0.01 / 0.96), rel=1e-3)
    assert [s.name for s in stages] == ["temperature", "min_p"]
    assert stages[-1].kept == 2 and stages[-1].rank == 2
    assert verdict == (f"'rare' drawn at rank 2 with p = 0.01: a {stages[-1].prob:.1%} chance among all "
                       "candidates; temperature 2 ran before min-p 0.05 (in llama.cpp's order min-p 0.05 removes it)")
    _, _, default_stages, _ = explain(session, logits, rare, "rare", hot, ())
    assert [(s.name, s.rank) for s in default_stages] == [("min_p", None), ("temperature", None)]


def test_a_banned_token_never_appears(tiny):
    """A bias of -inf on the text of the token greedy decoding picks most: that id is never drawn."""
    request = Request([Message("user", "Hello, what is the capital of France?")], LiveParams(GREEDY), top_logprobs=1)
    tokens, _ = collect(tiny.generate(request))
    counts = {}
    for token in tokens:
        counts[token.token_id] = counts.get(token.token_id, 0) + 1
    banned = max(counts, key=counts.get)
    text = next(t.piece for t in tokens if t.token_id == banned)
    for params in (GREEDY, GREEDY.with_changes(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)):
        for seed in range(3):
            ban = params.with_changes(logit_bias=[(text, -math.inf)], seed=seed, max_tokens=64)
            drawn, _ = collect(tiny.generate(Request([Message("user", "Hello, what is the capital of France?")],
                                                     LiveParams(ban), xray=True)))
            assert banned not in [t.token_id for t in drawn]
            assert drawn[0].stages[0].name == "logit_bias" and drawn[0].stages[0].kept == tiny.session.n_vocab - 1


def test_a_bias_set_mid_reply_applies_from_the_next_token(tiny):
    """The chain is rebuilt when the settings move: a +100 bias set after the first token wins every
    draw from the next one on (as test_engine's temperature change, for the new settings)."""
    live = LiveParams(BARE.with_changes(temperature=1.5, seed=3, max_tokens=300))
    favoured = _token_of(tiny.session, b" hello")
    tokens = []
    for event in tiny.generate(Request([Message("user", "Hello, what is the capital of France?")], live)):
        if hasattr(event, "token_id"):
            tokens.append(event)
            if len(tokens) == 1:
                live.update(logit_bias=[(" hello", 100)])
    late = [t for t in tokens if t.params_version == live.version]
    assert len(late) > 200 and all(t.token_id == favoured for t in late)
    assert tokens[0].params_version != live.version


def test_default_order_is_llama_cpps():
    assert DEFAULT_ORDER == ("penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc",
                             "temperature")


def test_the_verdict_reads_the_stage_figures():
    def stage(name, label, kept, mass, rank, prob):
        return Stage(name, label, kept, mass, rank, prob)

    xtc = [stage("top_k", "top-k 40", 40, 0.9, 3, 0.05), stage("xtc", "XTC 0.5 above 0.1", 38, 0.5, 1, 0.3),
           stage("temperature", "temperature 0.8", 38, 0.5, 1, 0.35)]
    assert verdict(" the", 0.04, 3, xtc) == ("' the' drawn at rank 3 with p = 0.04: a 35.0% chance among the 38 "
                                              "candidates XTC 0.5 above 0.1 left; XTC 0.5 above 0.1 removed the 2 "
                                              "likelier tokens")
    luck = [stage("top_k", "top-k 40", 40, 0.9, 7, 0.02), stage("min_p", "min-p 0.05", 12, 0.8, 7, 0.03),
            stage("temperature", "temperature 1.2", 12, 0.8, 7, 0.04)]
    assert verdict("x", 0.011, 7, luck) == ("'x' drawn at rank 7 with p = 0.011: a 4.0% chance among the 12 "
                                             "candidates min-p 0.05 left")
    assert verdict("x", 0.5, 1, luck[:1]).startswith("'x' drawn at rank 1 with p = 0.5: the likeliest token")


def _plain_stages(chain, logits: np.ndarray, token: int) -> list[tuple]:
    """Each stage read the plain way: apply it to the whole array, then look at every candidate left."""
    raw = np.exp(logits.astype(np.float64) - logits.max())
    raw /= raw.sum()
    candidates = Candidates(np.arange(len(logits), dtype=np.int32), logits)
    out = []
    for index, name in enumerate(chain.stages[:-1]):
        candidates.apply(chain.element(index))
        rows = candidates.survivors()
        kept = rows["logit"].astype(np.float64)
        hit = np.flatnonzero(rows["id"] == token)
        shares = np.exp(kept - kept.max())
        out.append((name, len(rows), float(raw[rows["id"]].sum()),
                    1 + int(np.count_nonzero(kept > kept[hit[0]])) if hit.size else None,
                    float(shares[hit[0]] / shares.sum()) if hit.size else None))
    return out


@pytest.mark.parametrize("changes", [
    {"repeat_penalty": 1.3, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "temperature": 0.7},  # the default chain
    {"repeat_penalty": 1.3, "frequency_penalty": -0.5, "sampler_order": ("temperature", "penalties", "min_p")},
    {"dry_multiplier": 0.8, "temperature": 1.4, "min_p": 0.02},
    {"logit_bias": (("a", -math.inf), ("b", 3.0)), "repeat_penalty": 1.2, "top_n_sigma": 1.5},
], ids=["default", "temperature-first", "dry", "bias-and-top-n-sigma"])
def test_the_stage_reader_reads_what_each_stage_left_as_the_plain_way_does(session, logits, history, changes):
    """The X-ray reads a stage that only moves some logits from the tokens it touched, and runs one softmax
    per token (issue 24, item 6): its figures are those of looking at every candidate after every stage."""
    params = BARE.with_changes(**changes)
    ranked = np.argsort(-logits)
    penalised = next(int(t) for t in history if t in ranked[:50])
    for token in (int(ranked[0]), int(ranked[7]), penalised, int(ranked[len(ranked) // 2])):
        chain = session.chains.build(params, 3, history)
        try:
            plain = _plain_stages(chain.clone(), logits, token)
            read = session.stage_reader.stages(chain, logits, token)
        finally:
            chain.free()
        assert [(s.name, s.kept, s.rank) for s in read] == [(p[0], p[1], p[3]) for p in plain], token
        assert [s.mass for s in read] == pytest.approx([p[2] for p in plain], abs=1e-5)
        assert [s.prob for s in read] == pytest.approx([p[4] for p in plain], rel=1e-4)


@pytest.mark.starter
@pytest.mark.parametrize("params", [
    GREEDY.with_changes(repeat_penalty=1.3, max_tokens=48),  # greedy after the penalties
    SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, seed=11, max_tokens=48),
    SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=48, logit_bias=((" the", 6.0), (" a", -10.0))),
])
def test_a_chain_run_over_the_shortlist_draws_what_the_whole_vocabulary_draws(starter, params, monkeypatch):
    """On the starter's 262,144 tokens: the shortlist (the likeliest logits and what a stage may raise) gives
    token for token the reply llama.cpp's own sampling over every token gives, greedy and seeded."""
    from tui_chat.engine.local import chain as chain_module

    question = [Message("user", "Tell me a story about a cat.")]
    monkeypatch.setattr(starter.session, "backend_sampling", False)  # the host's draws, not llama.cpp's graph's

    def reply() -> list[int]:
        starter.session.keep_prefix([])
        tokens, done = collect(starter.generate(Request(question, LiveParams(params))))
        assert done.stop_reason in ("length", "eos", "stop")
        return [token.token_id for token in tokens]

    assert chain_module.shortlist(plan(params), params) is not None
    fast = reply()
    monkeypatch.setattr(chain_module, "shortlist", lambda stages, params: None)
    assert reply() == fast


def test_the_chains_that_need_every_token_are_run_over_every_token():
    from tui_chat.engine.local.chain import shortlist

    base = SamplingParams(temperature=0.8, top_k=40)
    assert shortlist(plan(base), base) is not None
    for params in (base.with_changes(top_k=0), base.with_changes(mirostat_tau=5.0), base.with_changes(top_n_sigma=1.0),
                   base.with_changes(sampler_order=("top_p", "top_k", "temperature")),
                   base.with_changes(top_k=900)):
        assert shortlist(plan(params), params) is None, params


def test_the_likeliest_of_a_few_are_found_without_partitioning_the_whole_vocabulary(monkeypatch):
    """The estimate from every 64th logit must leave at least k: the greedy chain's shortlist (65) and the
    inspector's top 10 are asked for every token, and the fallback (a partition of all 262,144) costs more than
    the rest of the token's work. It used to be paid on a quarter of the tokens for k = 10."""
    from tui_chat.engine import pool

    whole: list[int] = []
    partition = np.argpartition

    def counted(values, kth, *args, **kwargs):
        if len(values) == 262_144:
            whole.append(kth)
        return partition(values, kth, *args, **kwargs)

    monkeypatch.setattr(pool.np, "argpartition", counted)
    rng = np.random.default_rng(3)
    for _ in range(40):
        logits = rng.normal(0.0, 3.0, 262_144).astype(np.float32)
        for k in (1, 10, 40, 65, 104):
            assert len(pool.likeliest(logits, k)) == k
    assert whole == []


@pytest.mark.parametrize("shape", ["peaked", "flat", "sorted_by_id", "few_finite"])
def test_the_likeliest_are_exactly_the_largest_whatever_the_distribution(shape):
    """The sampler's shortlist and the inspector's top come from `likeliest`: the k largest logits exactly,
    whether the estimate from every 64th logit holds (a peaked or flat distribution) or misleads (logits
    ordered by id, a vocabulary banned but for a few) and the whole partition has to be paid."""
    from tui_chat.engine.pool import likeliest

    rng = np.random.default_rng(7)
    logits = rng.normal(0.0, 3.0, 262_144).astype(np.float32)
    if shape == "peaked":
        logits[12_345] = 60.0
    elif shape == "flat":
        logits = rng.uniform(-0.01, 0.01, 262_144).astype(np.float32)
    elif shape == "sorted_by_id":
        logits.sort()
    else:
        logits[:] = -np.inf
        logits[rng.choice(262_144, 1_500, replace=False)] = rng.normal(0.0, 1.0, 1_500)
    for k in (1, 40, 1024):
        found = likeliest(logits, k)
        assert len(found) == len(set(found.tolist())) == k
        assert logits[found].min() >= np.partition(logits, -k)[-k]


@pytest.mark.parametrize("changes", [{"repeat_penalty": 1.3}, {"repeat_penalty": 1.1, "presence_penalty": 0.5},
                                     {"repeat_penalty": 1.0, "logit_bias": ((" Paris", -3.0),)}])
def test_greedy_after_stages_that_only_lower_picks_as_the_whole_vocabulary_would(session, logits, history, changes):
    """A greedy pick after the penalties or a negative bias takes the raw argmax in one pass, unless that token is one
    the stages lower: then the chain runs over the tokens they name and the best of the rest. Either way the pick
    is the whole vocabulary's, a tie included, and the row is left as it was."""
    params = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0).with_changes(**changes)
    paris = _token_of(session, b" Paris")
    named = [*history, paris]
    rows = []
    for lead in (0.0, 0.5, 4.0):  # the named token made the raw best by a margin the stages may or may not undo
        for best in (None, *named[-3:]):
            row = logits.copy()
            if best is not None:
                row[best] = row.max() + lead
            rows.append(row)
    for beside in (paris - 1, paris + 1):  # the bias takes Paris from 8 to 5 exactly: level with a lower id, a higher
        tie = np.clip(logits, -10.0, 4.0)
        tie[paris], tie[beside] = 8.0, 5.0
        rows.append(tie)
    for row in rows:
        chain = session.chains.build(params, 1, history)
        everything = chain.clone()
        try:
            assert chain.picks_raw_best
            whole = everything.apply(Candidates(np.arange(len(row), dtype=np.int32), row))
            before = row.copy()
            assert chain.draw_greedy(row, int(np.argmax(row))) == whole, changes
            assert np.array_equal(row, before)
            assert list(chain.recent)[-1] == whole  # recorded for the penalties
        finally:
            chain.free()
            everything.free()
