"""The sampling lab's engine and `run --compare`, on real llama.cpp: the tiny model and the starter.

Several settings over one read of the prompt, one decode per step for every live column; each column a reply
with its own rules; the conversation's cache left as a normal reply would find it."""

from __future__ import annotations

import json

import pytest

from conftest import GREEDY, run_cli
from tui_chat.engine.base import (
    ColumnEvent,
    Done,
    Error,
    LabDone,
    Loaded,
    Message,
    PromptProgress,
    Request,
    Token,
    XRay,
)
from tui_chat.engine.compare import divergence
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import InvalidParameter, LiveParams, SamplingParams, parse_settings

PROMPT = [Message("user", "Hello there, tell me about Paris")]
COUNTING = [Message("user", "Count from 1 to 100, separated by commas.")]  # the starter runs on to max tokens


def lab(backend, columns: list[SamplingParams], messages=PROMPT, **request):
    """Run the lab to its end; returns the LabDone (or Error) and each column's tokens."""
    stream = backend.compare(Request(messages, LiveParams(columns[0]), **request), [LiveParams(c) for c in columns])
    tokens: list[list[Token]] = [[] for _ in columns]
    final = None
    for event in stream:
        if isinstance(event, ColumnEvent) and isinstance(event.event, Token):
            tokens[event.column].append(event.event)
        elif isinstance(event, (LabDone, Error)):
            final = event
    return final, tokens


def single(backend, params: SamplingParams, messages=PROMPT, **request) -> tuple[Done, list[Token]]:
    stream = backend.generate(Request(messages, LiveParams(params), **request))
    tokens, done = [], None
    for event in stream:
        if isinstance(event, Token):
            tokens.append(event)
        elif isinstance(event, Done):
            done = event
    assert isinstance(done, Done), done
    return done, tokens


def open_lab(path, **settings) -> LlamaBackend:
    backend = LlamaBackend(LlamaSettings(path, **settings))
    assert isinstance(backend.load().result(), Loaded)
    return backend


@pytest.fixture
def tiny(tiny_model):
    backend = open_lab(tiny_model, n_ctx=1024)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def pinned(starter_model):
    """The starter on fixed threads: a thread count the governor changes between two runs may change the last
    digits of a logit, and a greedy pick at a near-tie with it."""
    backend = open_lab(starter_model, n_ctx=2048, threads=2, threads_batch=2)
    yield backend
    backend.close()


def test_the_prompt_is_read_once_for_every_column(tiny):
    columns = [GREEDY.with_changes(max_tokens=n) for n in (12, 6, 9)]
    final, tokens = lab(tiny, columns)
    assert isinstance(final, LabDone) and final.prompt_reads == 1
    prompt = final.columns[0].metrics.prompt_tokens
    assert all(done.metrics.prompt_tokens == prompt and done.metrics.cached_tokens == 0 for done in final.columns)
    # llama.cpp's own count of the tokens it evaluated: the prompt once, then each column's tokens but its last
    perf = tiny.session.perf()
    assert perf.n_p_eval + perf.n_eval == prompt + sum(len(t) - 1 for t in tokens)


def test_each_column_ends_by_its_own_rules_and_the_others_go_on(tiny):
    reference, reference_tokens = single(tiny, GREEDY.with_changes(max_tokens=20))
    words = reference.text.split()
    stop = words[len(words) // 2]
    columns = [GREEDY.with_changes(max_tokens=20), GREEDY.with_changes(max_tokens=4),
               GREEDY.with_changes(max_tokens=20, stop=(stop,))]
    final, tokens = lab(tiny, columns)
    assert isinstance(final, LabDone)
    long, short, stopped = final.columns
    assert (long.stop_reason, long.metrics.completion_tokens) == ("length", 20)
    assert (short.stop_reason, short.metrics.completion_tokens) == ("length", 4)
    assert stopped.stop_reason == "stop" and stopped.stop_sequence == stop and stop not in stopped.text
    # the short column freed its cells after 4 tokens; the long one went on as a single reply does
    assert long.text == reference.text
    assert [t.token_id for t in tokens[0]] == [t.token_id for t in reference_tokens]


def test_a_seeded_column_reproduces_itself_and_seeds_differ(tiny):
    columns = [SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=24)
               for seed in (7, 8)]
    first, _ = lab(tiny, columns)
    again, _ = lab(tiny, columns)
    alone, _ = lab(tiny, columns[:1])
    assert [d.text for d in first.columns] == [d.text for d in again.columns]
    assert alone.columns[0].text == first.columns[0].text
    assert first.columns[0].text != first.columns[1].text


@pytest.mark.starter
def test_a_setting_changed_mid_lab_applies_to_its_column_only(pinned):
    lives = [LiveParams(GREEDY.with_changes(max_tokens=60)) for _ in range(2)]
    stream = pinned.compare(Request(COUNTING, LiveParams(GREEDY)), lives)
    final = None
    for event in stream:
        if isinstance(event, ColumnEvent) and event.column == 1 and isinstance(event.event, Token):
            lives[1].update(max_tokens=5)
        if isinstance(event, LabDone):
            final = event
    assert final is not None
    assert (final.columns[0].stop_reason, final.columns[0].metrics.completion_tokens) == ("length", 60)
    assert final.columns[1].stop_reason == "length" and final.columns[1].metrics.completion_tokens < 60


@pytest.mark.starter
def test_a_greedy_column_is_the_greedy_reply_with_the_inspectors_probabilities(pinned):
    params = GREEDY.with_changes(max_tokens=24)
    reference, reference_tokens = single(pinned, params, top_logprobs=3)
    final, tokens = lab(pinned, [params, params.with_changes(temperature=1.0, seed=3)])
    assert final.columns[0].text == reference.text
    assert [t.token_id for t in tokens[0]] == [t.token_id for t in reference_tokens]
    for mine, theirs in zip(tokens[0], reference_tokens, strict=True):  # a batch's rows may round otherwise
        assert mine.prob == pytest.approx(theirs.prob, abs=1e-4)
    # where the sampled column parted from the greedy one, both tokens' probabilities are the same position's
    found = divergence(tokens[0], tokens[1])
    if found is not None:
        assert found.first.prob == pytest.approx(reference_tokens[found.position].prob, abs=1e-4)


@pytest.mark.starter
def test_past_the_sliding_window_a_column_decodes_as_a_single_reply(pinned):
    """The starter attends to its last 512 positions in most layers: a ~560-token prompt puts every column
    token past that window, over cells the columns share."""
    long = [Message("user", " ".join(f"item {n} is blue;" for n in range(110)) + " What colour is item 42?")]
    params = GREEDY.with_changes(max_tokens=16)
    reference, _ = single(pinned, params, long)
    final, _ = lab(pinned, [params, params], long)
    assert final.columns[0].metrics.prompt_tokens > 520
    assert final.columns[0].text == final.columns[1].text == reference.text
    assert final.columns[0].metrics.cached_tokens == final.columns[0].metrics.prompt_tokens - 1  # its prompt kept


@pytest.mark.starter
def test_cancelled_mid_lab_every_column_stops_and_the_chat_goes_on(pinned):
    params = GREEDY.with_changes(max_tokens=400)
    stream = pinned.compare(Request(COUNTING, LiveParams(params)), [LiveParams(params), LiveParams(params)])
    final = None
    for event in stream:
        if isinstance(event, ColumnEvent) and isinstance(event.event, Token):
            stream.cancel()
        if isinstance(event, LabDone):
            final = event
    assert final is not None and [d.stop_reason for d in final.columns] == ["cancelled", "cancelled"]
    assert all(d.metrics.completion_tokens < 50 for d in final.columns)
    after, _ = single(pinned, GREEDY.with_changes(max_tokens=8), COUNTING)
    assert after.stop_reason == "length" and after.metrics.cached_tokens == after.metrics.prompt_tokens - 1


def test_a_context_too_small_for_the_columns_is_one_line_before_anything_is_read(tiny_model):
    backend = open_lab(tiny_model, n_ctx=256)
    try:
        first, _ = single(backend, GREEDY.with_changes(max_tokens=8))
        final, tokens = lab(backend, [GREEDY.with_changes(max_tokens=120)] * 2)
        assert isinstance(final, Error) and tokens == [[], []]
        assert "2 columns of up to 120 tokens" in final.message and "\n" not in final.message
        assert "at most" in final.message and "--n-ctx" in final.message
        # nothing lost: the conversation's cache is as the reply left it
        again, _ = single(backend, GREEDY.with_changes(max_tokens=8))
        assert again.text == first.text and again.metrics.cached_tokens == first.metrics.prompt_tokens - 1
    finally:
        backend.close()


def test_after_a_lab_the_next_reply_reuses_the_prompt(tiny):
    params = GREEDY.with_changes(max_tokens=10)
    final, _ = lab(tiny, [params, params.with_changes(temperature=1.0, seed=1)])
    done, _ = single(tiny, params)
    assert done.text == final.columns[0].text
    assert done.metrics.cached_tokens == done.metrics.prompt_tokens - 1
    following = [*PROMPT, Message("assistant", done.text), Message("user", "And then?")]
    then, _ = single(tiny, params, following)
    assert then.metrics.cached_tokens >= done.metrics.prompt_tokens


def test_settings_text():
    assert parse_settings("temperature=1.0,top_p=0.9,seed=7") == {"temperature": "1.0", "top_p": "0.9", "seed": "7"}
    assert SamplingParams().with_changes(**parse_settings("sampler_order=top_k,temperature,min_p=0.1")) \
        .sampler_order == ("top_k", "temperature")
    assert parse_settings("stop=a,stop=b") == {"stop": ["a", "b"]}
    for bad in ("temperature", "warmth=1", ""):
        with pytest.raises(InvalidParameter):
            parse_settings(bad)


def test_run_compare_json_gives_each_column_and_the_prompt_once(tiny_model):
    common = ("run", "--model", str(tiny_model), "-p", "Hello there", "--max-tokens", "16", "--n-ctx", "512")
    result = run_cli(*common, "--compare", "temperature=0", "--compare", "temperature=1.0,seed=7", "--json")
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    assert turn["prompt_reads"] == 1 and turn["prompt_tokens"] > 0
    greedy, sampled = turn["columns"]
    for column in turn["columns"]:
        assert set(column) >= {"settings", "text", "tokens", "completion_tokens", "decode_tok_s", "stop_reason",
                               "diverges_at"}
        assert column["completion_tokens"] == len(column["tokens"]) == 16
    assert (greedy["settings"], sampled["params"]["seed"]) == ("temperature=0", 7)
    assert greedy["diverges_at"] is None
    single = json.loads(run_cli(*common, "--temperature", "0", "--json").stdout)["turns"][0]
    assert greedy["text"] == single["text"]
    human = run_cli(*common, "--compare", "temperature=0", "--compare", "temperature=0,max_tokens=3")
    assert human.returncode == 0, human.stderr
    assert "── column 1: temperature=0 ──" in human.stdout and "3 tokens" in human.stdout
    assert "same tokens as column 1" in human.stdout


@pytest.mark.parametrize("extra", [("--compare", "warmth=2"), ("--compare", "seed=1", "-p", "again"),
                                   ("--compare", "seed=1", "--save"), ("--compare", "a=1,b=2")])
def test_run_compare_refuses_what_it_cannot_do_in_one_line(tiny_model, extra):
    result = run_cli("run", "--model", str(tiny_model), "-p", "Hello", *extra)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr



@pytest.mark.starter
def test_an_xray_asked_mid_lab_is_answered_between_two_steps(pinned):
    """The X-ray reads its own logits in the scratch sequence, not a column's row of the batch."""
    params = GREEDY.with_changes(max_tokens=40)
    stream = pinned.compare(Request(PROMPT, LiveParams(params)), [LiveParams(params), LiveParams(params)])
    prompt: tuple[int, ...] = ()
    drawn: list[Token] = []
    xray = final = None
    for event in stream:
        if isinstance(event, PromptProgress) and event.prompt_ids:
            prompt = event.prompt_ids
        elif isinstance(event, ColumnEvent) and event.column == 0 and isinstance(event.event, Token):
            drawn.append(event.event)
            if len(drawn) == 4:  # past the first step, where every column reads the prompt's logits
                xray = pinned.xray(prompt + tuple(t.token_id for t in drawn[:3]), drawn[3].token_id, params)
        elif isinstance(event, LabDone):
            final = event
    assert isinstance(final, LabDone) and final.columns[0].text == final.columns[1].text
    answer = xray.result()
    assert isinstance(answer, XRay), answer
    assert answer.token_id == drawn[3].token_id and answer.prob == pytest.approx(drawn[3].prob, abs=1e-4)


def test_a_columns_thinking_budget_ends_its_thinking_while_the_other_thinks_on(thinker_model):
    """A column past its budget writes the end of the thinking a token a step, as a reply does; the other
    column, with no budget, goes on thinking in the same steps."""
    backend = open_lab(thinker_model, n_ctx=512)
    try:
        final, tokens = lab(backend, [GREEDY.with_changes(thinking_budget=3), GREEDY], [Message("user", "Hi")])
        single_done, single_tokens = single(backend, GREEDY.with_changes(thinking_budget=3),
                                            [Message("user", "Hi")])
    finally:
        backend.close()
    budgeted, free = final.columns
    assert [t.token_id for t in tokens[0]] == [t.token_id for t in single_tokens]
    assert [t.inserted for t in tokens[0]] == [t.inserted for t in single_tokens]
    assert (budgeted.reasoning, budgeted.text) == (single_done.reasoning, single_done.text) == ("Hmm,", "Hello world ")
    assert budgeted.metrics.completion_tokens == single_done.metrics.completion_tokens
    assert free.reasoning == "Hmm, let me" and free.text == "Hello world "
