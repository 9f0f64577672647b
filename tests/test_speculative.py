"""Speculative decoding with n-gram drafts: the same reply as plain decoding, faster where the reply repeats.

Batched verification computes a row's logits with other kernels than a one-token step (on this CPU build
they differ by up to ~0.7 in a logit once a batch holds 4 tokens or more), so equality is checked where the
model is sure of its tokens: a copy of its prompt, as llama.cpp's own speculative decoding would give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import GREEDY, collect, open_backend, run_cli
from tui_chat.engine.base import Done, Message, Request, Token
from tui_chat.engine.formats import choose
from tui_chat.engine.local.cpu import ThreadGovernor, Threads, Topology
from tui_chat.engine.local.draft import FIRST_PAUSE, TRIALS, DraftController, NgramDrafter
from tui_chat.engine.params import LiveParams

TEXT = ("The lighthouse stood at the edge of the cliff for more than two hundred years. Every night its keeper "
        "climbed the narrow stairs, trimmed the wick and polished the great glass lens until it shone. Ships "
        "passing in the dark saw the beam sweep across the water and knew that the rocks were near. In winter "
        "the storms came from the north, and the waves broke so high that spray reached the lamp room windows.")
COPY = TEXT + "\n\nRepeat the text above exactly."
COPY_PARAMS = GREEDY.with_changes(max_tokens=80)


@pytest.fixture(scope="module")
def backends(starter_model: Path):
    """The starter twice, drafting off and on, on one thread each (their figures then do not depend on load)."""
    plain = open_backend(starter_model, n_ctx=2048, threads=1, threads_batch=1)
    drafting = open_backend(starter_model, n_ctx=2048, threads=1, threads_batch=1, draft="ngram")
    yield plain, drafting
    plain.close()
    drafting.close()


def reply(backend, prompt=COPY, params=COPY_PARAMS, **request):
    messages = prompt if isinstance(prompt, list) else [Message("user", prompt)]
    tokens, done = collect(backend.generate(Request(messages, LiveParams(params), **request)))
    assert isinstance(done, Done), done
    return tokens, done


def test_the_drafter_proposes_what_followed_the_longest_recent_match():
    drafter = NgramDrafter([1, 2, 3, 4, 9, 2, 3, 5, 6])
    assert drafter.propose(4) == []  # "5 6" never came before
    drafter.add(2)
    drafter.add(3)
    assert drafter.propose(2) == [5, 6], "the latest occurrence of 2 3 wins"
    drafter.add(4)
    assert drafter.propose(3) == [9, 2, 3], "the longer match 2 3 4 wins over 3 4's later one"
    assert drafter.propose(0) == []


def test_the_controller_stops_drafting_that_does_not_pay_and_tries_again_later():
    control = DraftController(16, plain_ms=10.0)
    assert control.next_size() == 4
    control.verified(4, 4, 0.015)
    assert control.next_size() == 8, "every guess kept: the next draft is longer"
    control.verified(8, 2, 0.02)
    assert control.next_size() == 2, "it shrinks to what was kept"
    for _ in range(TRIALS - 2):
        control.verified(1, 0, 0.018)  # 18 ms a kept token against 10 plain: it does not pay
    assert control.next_size() == 0
    for _ in range(FIRST_PAUSE):
        control.plain(0.01)
    assert control.next_size() == 4, "after the pause it tries again"
    assert (control.drafted, control.accepted, control.verifications) == (4 + 8 + TRIALS - 2, 6, TRIALS)
    assert DraftController(0).next_size() == 0
    unmeasured = DraftController(16)
    for _ in range(TRIALS):
        unmeasured.verified(4, 4, 0.01)
    assert unmeasured.next_size() == 0, "a plain step is timed before drafting is judged"
    unmeasured.plain(0.02)
    assert unmeasured.next_size() == 8


def test_greedy_copy_is_the_same_with_drafting_and_the_counters_add_up(backends):
    plain, drafting = backends
    _, off = reply(plain)
    tokens, on = reply(drafting)
    assert on.text == off.text
    assert TEXT.startswith(on.text.strip()[:200]), "the starter copies its prompt"
    metrics = on.metrics
    assert metrics.draft_kind == "ngram" and off.metrics.draft_kind == ""
    assert 0 < metrics.draft_accepted <= metrics.drafted
    assert sum(token.drafted for token in tokens) == metrics.draft_accepted
    corrections = sum(bool(token.rejected) for token in tokens)
    assert corrections <= metrics.verifications
    drawn = [token for token in tokens if not token.drafted]
    assert len(tokens) == metrics.draft_accepted + len(drawn), "every token is a kept guess or a draw of its own"
    assert metrics.completion_tokens == len(tokens) == off.metrics.completion_tokens
    assert metrics.context_tokens == off.metrics.context_tokens, "the cache holds no rejected guess"
    assert metrics.tokens_per_verification is not None and metrics.tokens_per_verification > 1


def test_probabilities_and_the_inspector_read_the_row_of_each_token(backends):
    plain, drafting = backends
    seen_off, _ = reply(plain, top_logprobs=3)
    seen_on, done = reply(drafting, top_logprobs=3)
    assert [t.token_id for t in seen_on] == [t.token_id for t in seen_off]
    assert done.metrics.draft_accepted > 0
    for a, b in zip(seen_off, seen_on, strict=True):
        assert b.top[0].token_id == a.top[0].token_id == a.token_id
        assert b.prob == pytest.approx(a.prob, abs=0.1), "the same distribution, up to the batch's arithmetic"


def test_stop_strings_max_tokens_and_a_second_turn_behave_as_without_drafting(backends):
    plain, drafting = backends
    stopping = COPY_PARAMS.with_changes(stop=["lens"])
    for params in (stopping, GREEDY.with_changes(max_tokens=23)):
        _, off = reply(plain, params=params)
        tokens, on = reply(drafting, params=params)
        assert (on.text, on.stop_reason) == (off.text, off.stop_reason)
        assert len(tokens) == on.metrics.completion_tokens == off.metrics.completion_tokens
    assert on.stop_reason == "length" and on.metrics.completion_tokens == 23
    conversation = [Message("user", COPY), Message("assistant", off.text), Message("user", "Again, exactly.")]
    _, off = reply(plain, conversation)
    _, on = reply(drafting, conversation)
    assert on.metrics.cached_tokens == off.metrics.cached_tokens, "the cache holds what a plain reply leaves"
    # The same start; further on, a batch's rows and a one-token step may part at a near-tie (README): the
    # second reply here parted after ~190 characters on an AMD EPYC, in the old tree as in this one.
    assert on.text[:150] == off.text[:150], "the cache after a drafted reply holds what a plain one leaves"


def test_a_branch_and_an_output_format_under_drafting(backends):
    plain, drafting = backends
    tokens, first = reply(plain)
    forced = tuple(token.token_id for token in tokens[:12])
    _, off = reply(plain, forced=forced)
    _, on = reply(drafting, forced=forced)
    assert on.text == off.text and on.metrics.draft_accepted > 0
    schema = json.dumps({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    output = choose("json_schema", schema)
    prompt = TEXT + '\n\nRepeat the text above exactly, as a JSON object with the key "text".'
    _, off = reply(plain, prompt, format=output)
    _, on = reply(drafting, prompt, format=output)
    assert on.text == off.text
    assert on.text.lstrip().startswith('{"text": "The lighthouse stood')
    assert on.metrics.draft_accepted > 0


def test_seeded_sampling_is_reproducible_with_drafting(backends):
    plain, drafting = backends
    sampled = COPY_PARAMS.with_changes(temperature=0.7, seed=1234, max_tokens=60)
    _, off = reply(plain, params=sampled)
    _, first = reply(drafting, params=sampled)
    _, again = reply(drafting, params=sampled)
    assert first.text == again.text == off.text
    assert first.metrics.draft_accepted > 0


def test_run_json_reports_the_draft(starter_model: Path):
    result = run_cli("run", "--model", str(starter_model), "--draft", "ngram", "--threads", "1", "--json",
                     "--temperature", "0", "--repeat-penalty", "1", "--max-tokens", "40", "-p", COPY)
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    draft = turn["draft"]
    assert draft["kind"] == "ngram" and 0 < draft["accepted"] <= draft["drafted"]
    assert draft["acceptance"] == pytest.approx(draft["accepted"] / draft["drafted"])
    assert draft["verifications"] == turn["verifications"] > 0
    off = run_cli("run", "--model", str(starter_model), "--draft", "off", "--json", "-p", "Hi", "--max-tokens", "2")
    assert "draft" not in json.loads(off.stdout)["turns"][0]
    refused = run_cli("run", "--draft", "maybe", "-p", "Hi")
    assert refused.returncode == 2
    assert refused.stderr == ("tui-chat: error: draft must be one of ngram, off or a draft model's .gguf file "
                              "(got 'maybe')\n")


class Busy:
    """Another process keeps one of two cores busy: the governor goes down to one thread."""

    def busy_elsewhere(self) -> float:
        return 1.0


def test_the_controller_shrinks_no_shorter_than_a_draft_that_can_pay():
    control = DraftController(16, plain_ms=10.0)
    control.verified(4, 0, 0.03)
    assert control.next_size() == 1, "one guess is tried while its cost is unknown"
    control.verified(1, 1, 0.022)  # a 2-row batch in 22 ms: 2 tokens at best, against 20 ms for 2 plain steps
    control.verified(2, 0, 0.016)
    assert control.next_size() == 2, "a draft of one guess cannot pay: the floor is two"
    slow = DraftController(16, plain_ms=10.0)
    slow.batch_ms = {1: 22.0, 2: 31.0}  # a 3-row batch slower than 3 plain steps too
    slow.verified(4, 1, 0.03)
    assert slow.next_size() == 3
    assert DraftController(2, plain_ms=10.0).shortest() == 1, "unmeasured lengths are tried"


def test_a_reply_after_one_where_drafting_did_not_pay_starts_paused_and_keeps_the_costs_measured():
    losing = DraftController(16, plain_ms=10.0)
    for _ in range(TRIALS):
        losing.verified(4, 0, 0.03)  # 30 ms for one token against 10 ms plain
    assert not losing.paid and losing.next_size() == 0
    after = DraftController.after(losing)
    after.limit = 16
    assert after.plain_ms == 10.0 and after.batch_ms == losing.batch_ms
    assert after.next_size() == 0 and after.paused == FIRST_PAUSE, "short replies are not each slowed by new trials"
    winning = DraftController(16, plain_ms=10.0)
    for _ in range(TRIALS):
        winning.verified(4, 4, 0.02)  # 20 ms for five tokens
    assert winning.paid and DraftController.after(winning).paused == 0
    assert DraftController.after(None).plain_ms is None


def test_two_costly_verifications_in_a_row_are_judged_at_once():
    control = DraftController(16, plain_ms=10.0)
    control.verified(4, 0, 0.05)  # one token in 50 ms against 10 ms plain
    assert control.next_size() > 0, "one costly verification is not yet a judgement"
    control.verified(4, 0, 0.05)
    assert not control.paid and control.next_size() == 0 and control.paused == FIRST_PAUSE
    copying = DraftController(16, plain_ms=10.0)
    for kept in (4, 0, 8):  # a miss now and then between kept drafts is not a run of losses
        copying.verified(max(kept, 4), kept, 0.05)
    assert copying.losses == 0 and copying.next_size() > 0


def test_a_draft_model_sharing_the_vocabulary_drafts_and_another_is_refused(tiny_model: Path, starter_model: Path):
    plain = open_backend(tiny_model, n_ctx=1024)
    drafting = open_backend(tiny_model, n_ctx=1024, draft=str(tiny_model))
    try:
        params = GREEDY.with_changes(max_tokens=40)
        _, off = reply(plain, "hello there", params)
        tokens, on = reply(drafting, "hello there", params)
        assert on.text == off.text and on.metrics.draft_kind == "model"
        assert on.metrics.draft_accepted == sum(t.drafted for t in tokens) > 0
        assert on.metrics.draft_accepted == on.metrics.drafted, "a model drafting for itself guesses every token"
        _, again = reply(drafting, "hello there", params)
        assert again.text == off.text, "the draft model's cache follows the text across replies"
        drafting.threads = ThreadGovernor(topology=Topology(2, 2, 2), watch=Busy())
        reply(drafting, "hello there", params)
        assert drafting.session.threads == drafting.model.draft.threads == Threads(1, 1), \
            "the draft model follows the load governor with the model"
    finally:
        plain.close()
        drafting.close()
    from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings

    refused = LlamaBackend(LlamaSettings(starter_model, n_ctx=1024, draft=str(tiny_model)))
    try:
        error = refused.load().result()
        assert getattr(error, "message", "").startswith("the draft model tiny.gguf has another vocabulary (")
    finally:
        refused.close()


@pytest.fixture(scope="module")
def loopers(tmp_path_factory):
    """A scripted model that thinks "Hmm, Hmm, …" until its budget ends the thinking, drafting off and on: the
    drafter's guesses are all kept, so every budget, cancel or setting change lands inside a verification."""
    from thinking_model import template, write_scripted_model

    path = write_scripted_model(tmp_path_factory.mktemp("loop") / "loop.gguf", template("Qwen-Qwen3-0.6B"),
                                ["\n", "<think>", "Hmm", ",", "Hmm"], also=[["</think>", "Hello", " world"]],
                                words=["Hi"])
    plain, drafting = open_backend(path, n_ctx=2048), open_backend(path, n_ctx=2048, draft="ngram")
    yield plain, drafting
    plain.close()
    drafting.close()


def test_the_thinking_budget_and_cancel_act_inside_a_verification(loopers):
    plain, drafting = loopers
    budget = GREEDY.with_changes(thinking_budget=25, max_tokens=60)
    runs = [reply(backend, "Hi", budget) for backend in loopers]
    (off_tokens, off), (on_tokens, on) = runs
    assert [(t.piece, t.inserted) for t in on_tokens] == [(t.piece, t.inserted) for t in off_tokens]
    assert on.reasoning == off.reasoning and on.text == off.text and "Hello world" in on.text
    assert on.metrics.draft_accepted > 0 and on.metrics.context_tokens == off.metrics.context_tokens
    stream = drafting.generate(Request([Message("user", "Hi")], LiveParams(GREEDY.with_changes(max_tokens=1000))))
    taken, final = 0, None
    for event in stream:
        taken += isinstance(event, Token)
        if taken == 40:
            stream.cancel()
        final = event
    assert isinstance(final, Done) and final.stop_reason == "cancelled"
    _, after = reply(drafting, "Hi", budget)
    assert after.text == off.text and after.reasoning == off.reasoning, "a cancelled draft leaves a clean cache"


def test_a_setting_changed_mid_reply_applies_from_the_next_token_under_drafting(loopers):
    _, drafting = loopers
    live = LiveParams(GREEDY.with_changes(max_tokens=1500))
    stream = drafting.generate(Request([Message("user", "Hi")], live))
    tokens, done = [], None
    for event in stream:
        if isinstance(event, Token):
            tokens.append(event)
            if len(tokens) == 30:
                live.update(thinking_budget=0)
        elif isinstance(event, Done):
            done = event
    assert done is not None and done.text.startswith("Hello world") and done.stop_reason == "eos"
    changed = next(i for i, t in enumerate(tokens) if t.params_version == 1)
    assert tokens[changed].inserted, "the end of the thinking comes next"
    assert any(t.drafted for t in tokens[:changed])
