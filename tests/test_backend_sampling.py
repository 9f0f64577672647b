"""llama.cpp's backend sampling: a reply's chain attached to its sequence, the token drawn inside llama.cpp's graph
(`LlamaSession.attach`, here forced on with `backend_sampling=True`: by default only where the output layer is on a
GPU), against the same chain drawn on the host (`backend_sampling=False`): the same replies, the fallback where a
stage or a reader needs the host, the seed's draws repeated, settings moved mid-reply."""

import numpy as np
import pytest

from conftest import GREEDY, collect, open_backend
from tui_chat.engine.base import Message, Request
from tui_chat.engine.formats import OutputFormat
from tui_chat.engine.local.chain import Chain
from tui_chat.engine.local.cpu import Threads
from tui_chat.engine.local.llamacpp import LlamaSession
from tui_chat.engine.params import LiveParams, SamplingParams

QUESTION = [Message("user", "Tell me a story about a cat.")]
DEFAULTS = SamplingParams(max_tokens=48)  # penalties, top-k, top-p, min-p, temperature, the draw: all in the graph
SEEDED = [DEFAULTS.with_changes(seed=seed) for seed in (3, 11)]


@pytest.fixture(scope="module")
def starter(starter_model):
    backend = open_backend(starter_model, n_ctx=2048, backend_sampling=True)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def starter_on_host(starter_model):
    backend = open_backend(starter_model, n_ctx=2048, backend_sampling=False)
    yield backend
    backend.close()


@pytest.fixture
def tiny(tiny_model):
    backend = open_backend(tiny_model, n_ctx=1024, backend_sampling=True)
    yield backend
    backend.close()


@pytest.fixture
def tiny_on_host(tiny_model):
    backend = open_backend(tiny_model, n_ctx=1024, backend_sampling=False)
    yield backend
    backend.close()


def reply(backend, params: SamplingParams, **request):
    """A reply from an empty cache (the prompt read the same way each time): its tokens and its `Done`."""
    backend.session.keep_prefix([])
    tokens, done = collect(backend.generate(Request(QUESTION, LiveParams(params), **request)))
    assert done.stop_reason in ("length", "eos", "stop"), done
    return tokens, done


def ids(tokens) -> list[int]:
    return [token.token_id for token in tokens]


@pytest.mark.parametrize("params", [
    DEFAULTS.with_changes(temperature=0.0),  # greedy after the penalties
    GREEDY.with_changes(max_tokens=48, logit_bias=((" the", 2.0), (" a", -5.0))),  # greedy after a logit bias
])
def test_greedy_replies_are_the_same_drawn_in_the_graph_or_on_the_host(starter, starter_on_host, params):
    tokens, done = reply(starter, params)
    host_tokens, host_done = reply(starter_on_host, params)
    assert (done.metrics.sampling_path, host_done.metrics.sampling_path) == ("llama.cpp", "python")
    assert ids(tokens) == ids(host_tokens) and done.text == host_done.text


def test_the_inspector_reads_the_host_path_and_records_the_same_probabilities(starter, starter_on_host):
    """The inspector reads the raw logits row, which a decode with a chain attached does not give
    (`test_a_decode_with_a_chain_attached_reads_the_chains_row_not_the_models`): with it on, the reply is drawn
    on the host, its probabilities as they are with backend sampling off."""
    params = DEFAULTS.with_changes(temperature=0.0)
    tokens, done = reply(starter, params, top_logprobs=5)
    host_tokens, _ = reply(starter_on_host, params, top_logprobs=5)
    plain, _ = reply(starter, params)
    assert done.metrics.sampling_path == "python"
    assert ids(tokens) == ids(host_tokens) == ids(plain)
    assert [(t.prob, t.top) for t in tokens] == [(t.prob, t.top) for t in host_tokens]


@pytest.mark.parametrize("params", SEEDED, ids=lambda p: f"seed {p.seed}")
def test_a_seeded_reply_repeats_in_the_graph_and_draws_as_the_host_does(starter, starter_on_host, params):
    """The same seed, the same reply; and the same one as the host's: the random numbers come from the one
    generator of the chain's `dist`, a uniform per token, on either path (here the cumulative sums they fall in
    agree; llama.cpp's graph sums in float32 where the host sums in double, so a draw within rounding of a
    boundary could part)."""
    first, done = reply(starter, params)
    again, _ = reply(starter, params)
    host, _ = reply(starter_on_host, params)
    other, _ = reply(starter, params.with_changes(seed=params.seed + 100))
    assert done.metrics.sampling_path == "llama.cpp"
    assert ids(first) == ids(again) == ids(host)
    assert ids(other) != ids(first)


@pytest.mark.parametrize("changes", [
    {"typical_p": 0.6}, {"xtc_probability": 0.5}, {"dry_multiplier": 0.8}, {"mirostat_tau": 5.0},
    {"top_n_sigma": 1.5},
], ids=lambda changes: next(iter(changes)))
def test_a_stage_without_a_backend_version_is_drawn_on_the_host_and_says_so(tiny, changes):
    _, done = reply(tiny, DEFAULTS.with_changes(**changes))
    assert done.metrics.sampling_path == "python"


@pytest.mark.parametrize("request_", [
    {"top_logprobs": 3}, {"xray": True}, {"format": OutputFormat("json")},
], ids=lambda request_: next(iter(request_)))
def test_a_reader_of_the_logits_row_keeps_the_host_path(tiny, request_):
    _, done = reply(tiny, DEFAULTS, **request_)
    assert done.metrics.sampling_path == "python"


def test_backend_sampling_is_a_setting_on_by_default_where_the_output_layer_is_on_a_gpu(tiny, tiny_on_host,
                                                                                         tiny_model):
    assert reply(tiny, DEFAULTS)[1].metrics.sampling_path == "llama.cpp"
    assert reply(tiny_on_host, DEFAULTS)[1].metrics.sampling_path == "python"
    backend = open_backend(tiny_model, n_ctx=1024)
    try:
        on_gpu = backend.session.gpu_layers > 0
        assert reply(backend, DEFAULTS)[1].metrics.sampling_path == ("llama.cpp" if on_gpu else "python")
    finally:
        backend.close()


def test_settings_moved_mid_reply_apply_from_the_next_token_in_the_graph(tiny, tiny_on_host):
    """The chain is rebuilt when the settings move: the one in the graph is detached, the last token read again
    for its logits row, the new chain's first token drawn from it on the host and the rest in the graph. A greedy
    reply whose penalty and bias change after its fifth token is the host's, token for token."""
    start = GREEDY.with_changes(max_tokens=40)

    def moved(backend):
        live = LiveParams(start)
        tokens = []
        backend.session.keep_prefix([])
        for event in backend.generate(Request(QUESTION, live)):
            if hasattr(event, "token_id"):
                tokens.append(event)
                if len(tokens) == 5:
                    live.update(repeat_penalty=1.5, logit_bias=[(" the", 3.0)])
            elif hasattr(event, "stop_reason"):
                return tokens, event

    tokens, done = moved(tiny)
    host, _ = moved(tiny_on_host)
    assert done.metrics.sampling_path == "llama.cpp"
    assert ids(tokens) == ids(host)
    assert tokens[0].params_version != tokens[-1].params_version


def test_a_word_probability_asked_mid_reply_is_read_beside_the_attached_chain(tiny, monkeypatch):
    """A quick job between two tokens decodes in the scratch sequence, which has no chain: its row is the model's,
    and the reply in the graph goes on, as it would without it."""
    from tui_chat.engine.local import llama

    params = SEEDED[0].with_changes(max_tokens=200)
    first, done = reply(tiny, params)
    context = [*done.prompt_ids, *ids(first[:3])]
    idle = tiny.word_probability(context, " the").result()
    asked, cached_then = [], []
    answer = llama.word_probability
    monkeypatch.setattr(llama, "word_probability",
                        lambda session, *args: cached_then.append(len(session.tokens)) or answer(session, *args))
    tiny.session.keep_prefix([])
    tokens = []
    for event in tiny.generate(Request(QUESTION, LiveParams(params))):
        if hasattr(event, "token_id"):
            tokens.append(event)
            if len(tokens) == 3:
                asked.append(tiny.word_probability(context, " the"))
        elif hasattr(event, "stop_reason"):
            assert event.metrics.sampling_path == "llama.cpp"
    assert asked[0].result() == idle and ids(tokens) == ids(first)
    assert cached_then[0] < len(done.prompt_ids) + len(first) - 1  # it was read while the reply was being written


@pytest.fixture
def session(tiny_model):
    session = LlamaSession(tiny_model, n_ctx=256, gpu_layers=0, n_batch=32, threads=Threads(1, 1),
                           backend_sampling=True)
    yield session
    session.close()


def _read(session: LlamaSession, text: str) -> None:
    session.keep_prefix([])
    session.prefill(session.tokenize(text, add_bos=True), lambda _: None, lambda: False)


def test_a_decode_with_a_chain_attached_reads_the_chains_row_not_the_models(session):
    """Why the inspector keeps the host path: after a decode with a chain attached, llama.cpp answers the logits
    row (`llama_get_logits_ith`) with what the chain left of it (here divided by its temperature), not the raw
    distribution the inspector records; read again with no chain attached, the row is the model's."""
    params = SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    _read(session, "The capital of France is")
    chain = session.new_sampler(params, 0)
    token = session.sample(chain)
    assert session.attach(chain)
    session.step(token)
    tempered = session.logits().copy()
    session.free_sampler(chain)
    session.reread_last()
    raw = session.logits()
    assert np.allclose(tempered, raw / 0.5) and not np.allclose(tempered, raw)


def test_a_chain_llama_cpp_would_run_only_in_part_is_drawn_on_the_host(session, monkeypatch):
    """Offered a chain with a stage it has no backend version of, llama.cpp would run the stages before it in its
    graph and leave the rest: `attach` takes it back and the chain, never offered again, draws on the host as a
    fresh one does."""
    params = SamplingParams(temperature=0.8, top_k=20, typical_p=0.5, seed=4)
    _read(session, "Once upon a time")
    monkeypatch.setattr(Chain, "fits_graph", property(lambda chain: True))
    offered = session.new_sampler(params, 4)
    assert not session.attach(offered)
    fresh = session.new_sampler(params, 4)
    assert [session.sample(offered) for _ in range(8)] == [session.sample(fresh) for _ in range(8)]
    session.free_sampler(offered)
    session.free_sampler(fresh)
