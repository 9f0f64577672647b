"""The conversation without any UI: `ChatSession` driven by the real engine on the tiny model, saved
in a real SQLite file."""

from __future__ import annotations

import sqlite3

import pytest

from conftest import GREEDY
from tui_chat.config import history_path
from tui_chat.engine.base import Candidate, Error, Message, Stream, Token
from tui_chat.engine.params import LiveParams
from tui_chat.history import History
from tui_chat.pricing import PRESETS
from tui_chat.recording import Saving
from tui_chat.safetext import quoted
from tui_chat.session import ChatSession, Reply, opened


def finish(session: ChatSession):
    """Feed the writing reply's events to the session until it ends; returns the Ending."""
    stream = session.writing.stream
    for event in stream:
        update = session.take([event])
        if update.ending is not None:
            return update.ending
    raise AssertionError("the stream ended without a final event")


@pytest.fixture
def history():
    with History(history_path()) as opened_history:
        yield opened_history


def new_session(history=None, **options) -> ChatSession:
    saving = Saving(history, PRESETS["GPT-4o"]) if history is not None else None
    return ChatSession(LiveParams(GREEDY.with_changes(max_tokens=8)), saving=saving, model="tiny", **options)


def test_a_turn_is_asked_answered_and_saved(tiny, history):
    session = new_session(history, system_prompt="Be brief.")
    turn = session.ask("Hello there", tiny.generate)
    assert session.messages() == [Message("system", "Be brief."), Message("user", "Hello there")]
    ending = finish(session)
    assert ending.kind == "finished" and session.writing is None
    assert turn.reply.text == ending.done.text and turn.reply.footer.startswith("max tokens · 8 tokens")
    assert len(turn.reply.tokens) == 8 and all(t.prob is None for t in turn.reply.tokens)  # top_logprobs 0
    stored = history.load(session.conversation_id)
    assert [(m.role, m.content, m.state) for m in stored.path] == [
        ("user", "Hello there", "complete"), ("assistant", turn.reply.text, "complete")]


def test_regenerate_keeps_the_first_reply_as_a_branch_and_switch_goes_back(tiny, history):
    session = new_session(history)
    session.live.update(temperature=1.0, seed=1)
    turn = session.ask("Hello there", tiny.generate)
    finish(session)
    first = turn.reply.text
    session.live.update(seed=2)
    session.regenerate(tiny.generate)
    assert session.messages()[-1] == Message("user", "Hello there"), "the reply being replaced is not in the prompt"
    finish(session)
    assert len(turn.branches) == 2 and turn.active == 1 and turn.reply.text != first
    session.switch(0)
    assert session.messages()[-1] == Message("assistant", first)
    assert history.load(session.conversation_id).path[-1].content == first


def test_a_branch_starts_with_the_kept_tokens_and_the_chosen_one(tiny):
    session = new_session(top_logprobs=5)
    turn = session.ask("Hello there", tiny.generate)
    finish(session)
    original = turn.reply.tokens
    alternative = original[3].top[1]
    session.branch(3, Candidate(alternative.token_id, alternative.text, alternative.prob), tiny.generate)
    ending = finish(session)
    branched = turn.reply
    assert len(turn.branches) == 2 and branched.cut == 3
    assert [t.token_id for t in branched.tokens[:4]] == [t.token_id for t in original[:3]] + [alternative.token_id]
    assert ending.done.metrics.prompt_tokens - ending.done.metrics.cached_tokens == 1, "one token read"


def test_a_reply_stopped_before_its_first_token_gives_the_question_back(tiny, history):
    def stopped_at_once(request):
        stream = tiny.generate(request)
        stream.cancel()  # before the worker can draw a token: it checks before every step
        return stream

    session = new_session(history)
    session.ask("Hello there", stopped_at_once)
    ending = finish(session)
    assert ending.kind == "taken_back" and ending.done.stop_reason == "cancelled" and session.turns == []
    assert history.conversations() == [] or history.load(session.conversation_id).path == ()


def test_rewinding_to_edit_leaves_the_history_off_the_active_path(tiny, history):
    session = new_session(history)
    session.ask("First", tiny.generate)
    finish(session)
    session.ask("Second", tiny.generate)
    finish(session)
    [gone] = session.rewind(session.turns[-1])
    assert gone.question == "Second"
    assert session.rewind(gone) == [] and session.delete_from(gone) == [], "a turn already gone: nothing to do"
    session.ask("Second, edited", tiny.generate)
    finish(session)
    path = history.load(session.conversation_id).path
    assert [m.content for m in path if m.role == "user"] == ["First", "Second, edited"]


def test_a_history_that_fails_is_said_once_and_the_chat_goes_on_unsaved(tiny, monkeypatch):
    monkeypatch.setattr("tui_chat.history.BUSY_TIMEOUT_S", 0.05)
    history = History(history_path())
    warnings: list[str] = []
    session = new_session(history, warn=warnings.append)
    session.ask("First", tiny.generate)
    finish(session)
    other = sqlite3.connect(history_path(), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the file: every later write fails
    session.ask("Second", tiny.generate)
    ending = finish(session)
    session.ask("Third", tiny.generate)
    finish(session)
    assert ending.kind == "finished" and session.saved is None
    assert len(warnings) == 1 and warnings[0].endswith(": the rest of this chat is not saved")
    assert [t.question for t in session.turns] == ["First", "Second", "Third"]
    other.rollback()
    other.close()
    history.close()


def test_a_saved_chat_reopens_with_its_turns_branches_and_system_prompt(tiny, history):
    session = new_session(history, system_prompt="Be brief.")
    session.ask("Hello there", tiny.generate)
    finish(session)
    session.regenerate(tiny.generate)
    finish(session)
    again = opened(history.load(session.conversation_id), LiveParams(GREEDY), Saving(history, PRESETS["GPT-4o"]))
    assert again.system_prompt == "Be brief." and again.model == "tiny"
    assert [(t.question, len(t.branches), t.active) for t in again.turns] == [("Hello there", 2, 1)]
    assert again.messages() == session.messages()



def test_a_chat_that_used_two_models_reopens_with_each_replys_model(tiny, history):
    """The history kept one model per chat, overwritten at each message: the first reply came back as the
    second model's (and its X-ray would have asked the wrong model)."""
    session = new_session(history)
    session.ask("Hello there", tiny.generate)
    finish(session)
    session.model = "/models/other.gguf"  # what the workspace does when another model has loaded
    session.ask("And again", tiny.generate)
    finish(session)
    again = opened(history.load(session.conversation_id), LiveParams(GREEDY), None)
    assert [turn.reply.model for turn in again.turns] == ["tiny", "/models/other.gguf"]
    first, second = (turn.reply.footer for turn in again.turns)
    assert first.endswith(" · by tiny") and "by" not in second  # named where it is not the chat's model


def test_each_reply_keeps_its_figures_and_a_reopened_chat_has_the_same(tiny, history):
    """A reply's figures are data on its branch: what the panel sums as the session, the same once the chat is
    reopened (issue 26). A reply being written reads as a finished one does."""
    session = new_session(history)
    session.ask("Hello there", tiny.generate)
    assert isinstance(session.writing, Reply) and session.writing.footer is None
    done = finish(session).done
    session.regenerate(tiny.generate)
    finish(session)
    first = session.turns[0].branches[0]
    assert isinstance(first, Reply) and first.metrics == done.metrics
    assert len(session.spent()) == 2
    again = opened(history.load(session.conversation_id), LiveParams(GREEDY), None)
    assert again.spent() == session.spent()


def test_a_format_and_the_xray_go_with_each_request_and_the_format_is_saved(tiny, history):
    from tui_chat.engine.formats import grammar

    yes_no = grammar('root ::= "yes" | "no"')
    session = new_session(history, output_format=yes_no, xray=True)
    turn = session.ask("Is Paris in France?", tiny.generate)
    finish(session)
    assert turn.reply.text in ("yes", "no") and all(t.stages for t in turn.reply.tokens)
    assert turn.reply.model == "tiny" and turn.reply.prompt_ids, "what the X-ray needs to recompute a position"
    stored = history.load(session.conversation_id)
    assert stored.output_format == yes_no
    again = opened(stored, LiveParams(GREEDY), None)
    assert again.output_format == yes_no


def test_streaming_off_compares_the_wait_and_an_unfinished_format_is_incomplete(tiny, history):
    from tui_chat.engine.formats import grammar

    session = new_session(history, output_format=grammar('root ::= "a"{30}'), streaming=False)
    turn = session.ask("Hello", tiny.generate)
    ending = finish(session)
    assert turn.reply.text == "a" * 8
    footer = turn.reply.footer
    assert footer.startswith("max tokens · 8 tokens") and "incomplete: it stopped before the output format" in footer
    assert f"first word after {ending.done.metrics.ttft_s:.2f} s when streaming; you waited " in footer
    assert ending.waited_s >= ending.done.metrics.ttft_s
    stored = history.load(session.conversation_id).path[-1]
    assert stored.metrics["incomplete"] is True


def test_the_probe_says_why_a_reply_cannot_be_recomputed(tiny):
    from tui_chat.probe import TokenProbe
    from tui_chat.session import Branch

    session = new_session(top_logprobs=2)
    turn = session.ask("Hello there", tiny.generate)
    finish(session)
    live = session.live
    assert TokenProbe(None, live, turn.reply, "tiny").why_not() == "No model is loaded."
    assert "another model" in TokenProbe(tiny, live, turn.reply, "other.gguf").why_not()
    assert "without its prompt recorded" in TokenProbe(tiny, live, Branch("x", "", model="tiny"), "tiny").why_not()
    probe = TokenProbe(tiny, live, turn.reply, "tiny")
    assert probe.why_not() is None
    assert probe.context(3) == turn.reply.prompt_ids + tuple(t.token_id for t in turn.reply.tokens[:3])
    live.update(temperature=0.5)
    assert probe.settings(turn.reply.tokens[0]) == (GREEDY.with_changes(max_tokens=8), "")


def test_a_reply_cut_short_while_thinking_stays_on_the_saved_path(history):
    """A server's stream that breaks mid-thought: the thinking is kept on screen, so the history keeps it
    on the chat's path too, and the model sees the same conversation after a reopen."""

    def cut_while_thinking(request):
        stream = Stream()
        for index, thought in enumerate(("Hmm", ", let me")):
            stream.put(Token(-1, "", float(index), 0, reasoning=thought, thinking=True))
        stream.put(Error("the server closed the connection"))
        return stream

    session = new_session(history)
    session.ask("Q1", cut_while_thinking)
    assert finish(session).kind == "failed"
    session.ask("Q2", cut_while_thinking)
    finish(session)
    stored = history.load(session.conversation_id)
    assert [(m.role, m.reasoning) for m in stored.path] == [("user", ""), ("assistant", "Hmm, let me"),
                                                            ("user", ""), ("assistant", "Hmm, let me")]
    assert [m.role for m in opened(stored, LiveParams(GREEDY), None).messages()] == ["user", "assistant"] * 2


def test_the_context_the_conversation_holds_follows_its_latest_reply_and_comes_back_reopened(tiny, history):
    """What the draft meter bills with the next message: a reply stopped before its first token (taken back)
    changes nothing, and a reopened chat knows it from the saved figures."""
    session = new_session(history)
    session.ask("Hello there", tiny.generate)
    held = finish(session).done.metrics.context_tokens
    assert held > 0 and session.context_tokens == held

    def stopped_at_once(request):  # as Esc pressed before the first token
        stream = tiny.generate(request)
        stream.cancel()
        return stream

    session.ask("And then?", stopped_at_once)
    assert finish(session).kind == "taken_back"
    assert session.context_tokens == held
    again = opened(history.load(session.conversation_id), LiveParams(GREEDY), None)
    assert again.context_tokens == held


@pytest.mark.starter
def test_the_footer_names_the_stop_sequence_a_reply_ended_on(starter):
    """The base-model transcript ends a turn at `\\nUser:`: the footer says which stop sequence, escaped."""
    session = ChatSession(LiveParams(GREEDY.with_changes(max_tokens=40)), model="starter")
    session.ask("Tell me a story about a cat.", starter.generate)
    ending = finish(session)
    assert ending.done.stop_reason == "stop" and ending.done.stop_sequence == "\nUser:"
    assert session.turns[-1].reply.footer.startswith('stop sequence "\\nUser:" · ')


def test_a_branch_from_a_token_that_completes_a_stop_sequence_says_why_it_ends_at_once(tiny):
    """Picking, in the inspector, a token that is itself the stop sequence ends the branch with no new token
    (issue 25, item 16): the footer names the sequence and the ending says it was the chosen token."""
    session = new_session(top_logprobs=5)
    turn = session.ask("Hello there", tiny.generate)
    finish(session)
    index, chosen = next((i, c) for i, t in enumerate(turn.reply.tokens) for c in t.top[1:]
                         if c.text.strip() and c.text not in "".join(t.piece for t in turn.reply.tokens[:i + 1]))
    session.live.update(stop=(chosen.text,))
    session.branch(index, Candidate(chosen.token_id, chosen.text, chosen.prob), tiny.generate)
    ending = finish(session)
    assert ending.done.stop_reason == "stop" and ending.done.metrics.completion_tokens == 0
    assert turn.reply.footer.startswith(f"stop sequence {quoted(chosen.text)} · 0 tokens")
    assert ending.message == (f"The token you chose, {quoted(chosen.text)}, completes the stop sequence "
                              f"{quoted(chosen.text)}: the reply ends there.")
