"""Conversations longer than the context: the oldest turns are left out, the reply still comes."""

from __future__ import annotations

import pytest

from conftest import GREEDY, ask, open_backend, run_cli
from tui_chat.engine.base import EngineError, Error, Message, Request
from tui_chat.engine.context import fit_context, left_out, reply_reserve, split_turns
from tui_chat.engine.params import LiveParams
from tui_chat.wording import reply_footer

LONG = "Hello world " * 30


def words(messages: list[Message]) -> int:
    return sum(len(m.content.split()) + 1 for m in messages)


def chat(*contents: str, system: str | None = "sys") -> list[Message]:
    roles = ["user", "assistant"]
    head = [Message("system", system)] if system else []
    return head + [Message(roles[i % 2], text) for i, text in enumerate(contents)]


def test_turns_start_at_each_user_message():
    system, turns = split_turns(chat("q1", "a1", "q2", "a2", "q3"))
    assert system == [Message("system", "sys")]
    assert [[m.content for m in turn] for turn in turns] == [["q1", "a1"], ["q2", "a2"], ["q3"]]
    _, greeting_first = split_turns([Message("assistant", "Hi!"), Message("user", "q")])
    assert [[m.content for m in turn] for turn in greeting_first] == [["Hi!"], ["q"]]


def test_reply_reserve_is_max_tokens_up_to_a_quarter_of_the_context():
    assert reply_reserve(100, 4096) == 100
    assert reply_reserve(100_000, 4096) == 1024


def test_nothing_is_left_out_when_it_fits():
    messages = chat("one two", "three", "four")
    fitted = fit_context(messages, words, n_ctx=100, max_tokens=10)
    assert fitted.messages == messages and fitted.dropped_turns == 0


def test_the_fewest_oldest_turns_go_and_the_system_prompt_stays():
    messages = chat("a " * 10, "b " * 10, "c " * 10, "d " * 10, "e " * 10)  # 11 words each, system 2
    fitted = fit_context(messages, words, n_ctx=40, max_tokens=5)  # room for 35: system + 3 messages
    assert fitted.dropped_turns == 1
    assert [m.content[0] for m in fitted.messages] == ["s", "c", "d", "e"]
    tight = fit_context(messages, words, n_ctx=30, max_tokens=5)
    assert tight.dropped_turns == 2 and [m.content[0] for m in tight.messages] == ["s", "e"]


def test_a_newest_turn_that_leaves_no_room_for_the_reply_is_a_clear_error():
    """28 tokens fit a 30-token context, but only 2 would be left for a reply promised 7 (max tokens 10,
    at most a quarter of the context): said, instead of a reply cut after two tokens."""
    with pytest.raises(EngineError, match="the newest message needs 28 tokens with the system prompt and the reply "
                                          "7 more .* the context holds 30: shorten the message, lower max tokens"):
        fit_context(chat("a " * 10, "b " * 10, "c " * 25), words, n_ctx=30, max_tokens=10)
    fitted = fit_context(chat("a " * 10, "b " * 10, "c " * 20), words, n_ctx=30, max_tokens=10)  # 23: just fits
    assert fitted.dropped_turns == 1 and words(fitted.messages) == 23


def test_a_message_larger_than_the_context_is_a_clear_error():
    with pytest.raises(EngineError, match="the newest message needs 33 tokens .* the context holds 30"):
        fit_context(chat("a", "b", "c " * 30), words, n_ctx=30, max_tokens=10)


def grow(backend, turns: int, max_tokens: int = 40) -> tuple[list[Message], list]:
    """A greedy conversation of long user turns; returns the messages and each reply."""
    messages = [Message("system", "You are terse.")]
    replies = []
    params = GREEDY.with_changes(max_tokens=max_tokens)
    for i in range(turns):
        messages.append(Message("user", f"Turn {i}. {LONG}"))
        done = ask(backend, messages, params)
        replies.append(done)
        messages.append(Message("assistant", done.text))
    return messages, replies


def test_the_real_model_keeps_answering_past_the_context(tiny_model):
    backend = open_backend(tiny_model, n_ctx=256)
    try:
        messages, replies = grow(backend, 5)
    finally:
        backend.close()
    assert [r.metrics.dropped_turns for r in replies][:2] == [0, 1]
    assert all(r.metrics.dropped_turns >= 1 for r in replies[1:])
    assert all(r.text and r.metrics.prompt_tokens + 40 <= 256 for r in replies)
    assert len(messages) == 11


def test_a_trimmed_prompt_answers_as_a_fresh_model_would(tiny_model):
    """Leaving turns out changes the start of the prompt, so the reused KV cache must be cut right there."""
    backend = open_backend(tiny_model, n_ctx=256)
    fresh = open_backend(tiny_model, n_ctx=256)
    try:
        messages, replies = grow(backend, 4)
        last = replies[-1]
        assert last.metrics.dropped_turns > 0 and last.metrics.cached_tokens > 0
        system, turns = split_turns(messages[:-1])
        kept = system + [m for turn in turns[last.metrics.dropped_turns :] for m in turn]
        reference = ask(fresh, kept, GREEDY.with_changes(max_tokens=40))
        assert reference.metrics.dropped_turns == 0
        assert reference.prompt_ids == last.prompt_ids
        assert reference.text == last.text
    finally:
        backend.close()
        fresh.close()


def test_one_huge_message_is_an_error_and_the_model_still_answers(tiny_model):
    backend = open_backend(tiny_model, n_ctx=256)
    try:
        huge = [Message("system", "sys"), Message("user", "Hello world " * 200)]
        result = backend.generate(Request(huge, LiveParams(GREEDY))).result()
        assert isinstance(result, Error)
        assert "the newest message needs" in result.message and "the context holds 256" in result.message
        assert ask(backend, "Hello").text
    finally:
        backend.close()


def test_a_prompt_that_fills_the_context_is_refused_not_cut_short(tiny_model):
    """The issue's case: a paste that leaves the reply a few tokens. `run` says why in one line."""
    backend = open_backend(tiny_model, n_ctx=256)
    try:
        filling = [Message("user", "Hello world " * 110)]
        result = backend.generate(Request(filling, LiveParams(GREEDY.with_changes(max_tokens=1024)))).result()
        assert isinstance(result, Error) and "and the reply 64 more" in result.message
        assert ask(backend, "Hello").text, "the backend goes on"
    finally:
        backend.close()
    cli = run_cli("run", "-m", str(tiny_model), "--n-ctx", "256", "-p", "Hello world " * 110)
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and "lower max tokens or raise n_ctx" in cli.stderr


def test_a_reply_that_fills_the_context_stops_with_its_own_reason(tiny_model):
    """Max tokens past the reserve: the reply runs until the KV cache is full, and says so."""
    backend = open_backend(tiny_model, n_ctx=256)
    try:
        done = ask(backend, "Hello", GREEDY.with_changes(max_tokens=5000, repeat_penalty=1.0))
    finally:
        backend.close()
    assert done.stop_reason == "context" and done.metrics.context_tokens == 255
    assert reply_footer(done.stop_reason, done.metrics.as_dict()).startswith("context full · ")


def test_headless_run_says_when_turns_were_left_out(tiny_model):
    result = run_cli("run", "-m", str(tiny_model), "--n-ctx", "256", "--temperature", "0", "--max-tokens", "40",
                     "-p", LONG, "-p", LONG, "-p", LONG)
    assert result.returncode == 0, result.stderr
    notes = result.stderr.splitlines()
    assert notes and all(n.startswith("tui-chat: note: ") for n in notes)
    assert notes[-1].endswith(" left out to fit the 256-token context")
    assert left_out(1) == "1 earlier turn left out" and left_out(2) == "2 earlier turns left out"
    huge = run_cli("run", "-m", str(tiny_model), "--n-ctx", "256", "-p", "Hello world " * 200)
    assert huge.returncode == 1 and "Traceback" not in huge.stderr
    assert huge.stderr.startswith("tui-chat: error: the newest message needs ") and huge.stderr.count("\n") == 1
