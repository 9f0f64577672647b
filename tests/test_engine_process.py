"""The engine in a process of its own (engine/process.py, engine/host.py), on the real starter and llama.cpp.

The app's process never loads llama.cpp; what crosses is requests one way and batches of events the other. A
reply is the same tokens with the same probabilities as in one process; settings changed mid-reply and Esc reach
it; and when the engine process dies (kill -9, an abort) the reply ends in one line, the app goes on, and the
next request loads the model again in a new process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import pytest

from conftest import GREEDY, collect
from test_ui import loaded, reply_done, send, wait_for
from tui_chat.commands.common import opener_for
from tui_chat.config import Config
from tui_chat.engine.base import (
    ColumnEvent,
    Done,
    EngineDeath,
    Error,
    LabDone,
    Loaded,
    LoadProgress,
    Message,
    Request,
    Token,
    WordProbability,
    XRay,
)
from tui_chat.engine.factory import local_backend
from tui_chat.engine.link import CAPABILITIES
from tui_chat.engine.local.settings import LlamaSettings
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.engine.process import LocalEngineProcess
from tui_chat.guard import LOG_NAME
from tui_chat.probe import position_context
from tui_chat.ui.app import ChatApp
from tui_chat.ui.widgets.messages import ReplyMessage

pytestmark = pytest.mark.starter

QUESTION = [Message("user", "Name three colours of the sea.")]
COUNTING = [Message("user", "Count from 1 to 100, separated by commas.")]  # the starter runs on to max tokens


@pytest.fixture
def engine(starter_model: Path, tmp_path: Path):
    backend = LocalEngineProcess(partial(local_backend, LlamaSettings(starter_model, n_ctx=2048), "starter",
                                         tmp_path / "logs"), tmp_path / "logs")
    assert isinstance(backend.load().result(), Loaded)
    yield backend
    backend.close()


def request(messages: list[Message], params: SamplingParams = GREEDY, **fields) -> Request:
    return Request(messages, LiveParams(params), **fields)


def first_tokens(stream, count: int) -> list[Token]:
    """Drain until `count` tokens have come (the reply goes on)."""
    tokens: list[Token] = []
    deadline = time.monotonic() + 60
    while len(tokens) < count:
        assert time.monotonic() < deadline, "no tokens came"
        for event in stream.drain(timeout=1.0):
            assert not isinstance(event, (Done, Error)), event
            if isinstance(event, Token):
                tokens.append(event)
    return tokens


def rest(stream, tokens: list[Token]) -> Done | Error:
    more, final = collect(stream)
    tokens.extend(more)
    return final


def test_a_reply_has_the_tokens_and_probabilities_of_the_engine_in_this_process(engine, starter):
    """Greedy text identical and recorded probabilities within 1e-4, on the same machine."""
    there, there_done = collect(engine.generate(request(QUESTION, top_logprobs=5)))
    here, here_done = collect(starter.generate(request(QUESTION, top_logprobs=5)))
    assert isinstance(there_done, Done) and isinstance(here_done, Done)
    assert there_done.text == here_done.text and there_done.text.strip()
    assert [t.token_id for t in there] == [t.token_id for t in here]
    for a, b in zip(there, here, strict=True):
        assert a.prob == pytest.approx(b.prob, abs=1e-4)
        assert [c.token_id for c in a.top] == [c.token_id for c in b.top]
        assert [c.prob for c in a.top] == pytest.approx([c.prob for c in b.top], abs=1e-4)
    assert engine.info is not None and engine.info.n_ctx == 2048
    assert engine.count_tokens("Hello there") == starter.count_tokens("Hello there")


def test_settings_changed_mid_reply_reach_the_engine_process(engine):
    live = LiveParams(GREEDY.with_changes(max_tokens=400))
    stream = engine.generate(Request(COUNTING, live))
    tokens = first_tokens(stream, 3)
    live.update(max_tokens=len(tokens) + 10)
    final = rest(stream, tokens)
    assert isinstance(final, Done) and final.stop_reason == "length", final
    assert len(tokens) < 60  # cut near the new limit, long before 400
    assert tokens[-1].params_version == live.version  # the last tokens were drawn under the change


def test_cancel_stops_a_reply_in_the_engine_process(engine):
    stream = engine.generate(request(COUNTING, GREEDY.with_changes(max_tokens=400)))
    tokens = first_tokens(stream, 2)
    asked = time.perf_counter()
    stream.cancel()
    final = rest(stream, tokens)
    assert isinstance(final, Done) and final.stop_reason == "cancelled", final
    assert time.perf_counter() - asked < 1.0
    assert len(tokens) < 100


def test_the_lab_and_the_inspector_cross_to_the_engine_process(engine):
    columns = [LiveParams(GREEDY), LiveParams(GREEDY.with_changes(temperature=0.8, seed=7))]
    events = list(engine.compare(request(QUESTION), columns))
    assert isinstance(events[-1], LabDone), events[-1]
    assert {e.column for e in events if isinstance(e, ColumnEvent) and isinstance(e.event, Token)} == {0, 1}
    tokens, done = collect(engine.generate(request(QUESTION, top_logprobs=5)))
    assert isinstance(done, Done)
    context = position_context(done.prompt_ids, tokens, 1)
    xray = engine.xray(context, tokens[1].token_id, GREEDY).result()
    assert isinstance(xray, XRay) and xray.token_id == tokens[1].token_id
    word = engine.word_probability(context, tokens[1].piece).result()
    assert isinstance(word, WordProbability) and word.prob == pytest.approx(tokens[1].prob, rel=0.05)


@pytest.mark.parametrize("number, said", [(signal.SIGKILL, "was killed (SIGKILL"),
                                          (signal.SIGABRT, "crashed with SIGABRT")])
def test_an_engine_that_dies_mid_reply_ends_it_in_one_line_and_the_next_request_loads_again(engine, number, said):
    stream = engine.generate(request(COUNTING, GREEDY.with_changes(max_tokens=400)))
    tokens = first_tokens(stream, 3)
    os.kill(engine.pid, number)
    final = rest(stream, tokens)
    assert isinstance(final, Error), final
    assert said in final.message and "\n" not in final.message
    assert final.died is not None and final.died.cause == final.message  # facts: what ended it, no advice
    assert "chat" not in final.message and "details in" not in final.message
    if number == signal.SIGABRT:  # Python's stack at the signal went to the log the death names
        assert "Fatal Python error: Aborted" in Path(final.died.log).read_text()
    else:
        assert final.died.log == ""  # killed: it wrote nothing
    again, done = collect(engine.generate(request(QUESTION)))
    assert isinstance(done, Done) and done.text.strip(), done
    assert engine.pid is not None


async def test_the_app_outlives_its_engine_and_keeps_the_chat(starter_model: Path):
    config = Config(sampling=GREEDY.with_changes(max_tokens=400), n_ctx=1024)
    app = ChatApp(config, opener_for(config, engine_process=True)[0], str(starter_model))
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await loaded(pilot)
        backend = screen.workspace.backend
        assert isinstance(backend, LocalEngineProcess)
        await send(pilot, COUNTING[0].content)
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.text) > 20)
        os.kill(backend.pid, signal.SIGKILL)
        reply = await reply_done(pilot)
        branch = reply.turn.reply
        assert branch.text.startswith(screen.session.turns[0].reply.text[:20]) and len(branch.text) > 20
        assert branch.footer.startswith("cut short: the engine process was killed")
        await send(pilot, "Name three colours of the sea.")
        await wait_for(pilot, lambda: len(screen.session.turns) == 2 and screen.reply is None, 60)
        await pilot.pause()
        answer = screen.session.turns[1].reply
        # The reloaded engine wrote it to its own end. Not its text: where the kill cut the first reply is timing,
        # and after some cuts the starter's greedy answer is its stop sequence at once (an empty reply).
        assert answer.tokens and answer.footer.startswith(("end of text", "stop sequence", "max tokens")), answer.footer
        assert len(pilot.app.screen.query(ReplyMessage)) == 2


def test_the_app_process_never_loads_llama_cpp(starter_model: Path, tmp_path: Path):
    """A chat with the starter in a fresh interpreter: the reply comes, and llama_cpp is not in its modules."""
    script = textwrap.dedent(f"""
        import asyncio, json, sys, time
        from tui_chat.commands.common import opener_for
        from tui_chat.config import Config
        from tui_chat.engine.params import SamplingParams
        from tui_chat.ui.app import ChatApp
        from tui_chat.ui.chat.screen import ChatScreen
        from tui_chat.ui.widgets.prompt import PromptInput

        async def main():
            config = Config(sampling=SamplingParams(temperature=0.0, max_tokens=24), n_ctx=1024)
            app = ChatApp(config, opener_for(config, engine_process=True)[0], {str(starter_model)!r})
            async with app.run_test(size=(100, 32)) as pilot:
                screen = app.screen
                deadline = time.monotonic() + 120
                while screen.workspace.backend is None and time.monotonic() < deadline:
                    await pilot.pause(0.05)
                prompt = screen.query_one(PromptInput)
                prompt.focus()
                prompt.text = "Name three colours of the sea."
                await pilot.press("enter")
                await pilot.pause(0.2)
                while (screen.reply is not None or not screen.session.turns) and time.monotonic() < deadline:
                    await pilot.pause(0.05)
                reply = screen.session.turns[0].reply
                print(json.dumps({{"reply": reply.text if reply else "", "footer": reply.footer if reply else "",
                                  "llama_cpp": sorted(m for m in sys.modules if m.startswith("llama_cpp"))}}))

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["reply"].strip(), seen
    assert seen["llama_cpp"] == [], seen


def test_an_engine_that_died_between_replies_is_loaded_again_and_the_reply_says_so(engine):
    os.kill(engine.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while engine.pid is not None and time.monotonic() < deadline:  # its link sees the socket close
        time.sleep(0.02)
    stream = engine.generate(request(QUESTION))
    first = stream.drain(timeout=5)[0]
    assert isinstance(first, LoadProgress), first
    assert first.stage.startswith("Loading the model again: the engine process was killed (SIGKILL")
    tokens, done = collect(stream)
    assert isinstance(done, Done) and done.text.strip(), done


@pytest.mark.parametrize("job", ["xray", "word_probability", "compare"])
def test_a_job_after_an_engine_death_says_the_model_loads_again_first(engine, job):
    """Not only a reply: the inspector's and the lab's jobs said "recomputing…" / "Running…" through the whole
    reload, as if nothing had happened."""
    tokens, done = collect(engine.generate(request(QUESTION, top_logprobs=5)))
    os.kill(engine.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while engine.pid is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    context = position_context(done.prompt_ids, tokens, 1)
    stream = {"xray": lambda: engine.xray(context, tokens[1].token_id, GREEDY),
              "word_probability": lambda: engine.word_probability(context, tokens[1].piece),
              "compare": lambda: engine.compare(request(QUESTION, GREEDY.with_changes(max_tokens=4)),
                                                [LiveParams(GREEDY.with_changes(max_tokens=4))])}[job]()
    first = stream.drain(timeout=5)[0]
    assert isinstance(first, LoadProgress), first
    assert first.stage.startswith("Loading the model again: the engine process was killed (SIGKILL")
    assert isinstance(stream.result(), {"xray": XRay, "word_probability": WordProbability, "compare": LabDone}[job])


async def test_the_chat_words_an_engine_death_its_own_way(starter_model: Path):
    """The engine's error is facts; the chat adds what it does (keeps the chat, loads at the next message) and
    where the log is, in its notification."""
    config = Config(sampling=GREEDY.with_changes(max_tokens=400), n_ctx=1024)
    app = ChatApp(config, opener_for(config, engine_process=True)[0], str(starter_model))
    async with app.run_test(size=(100, 32), notifications=True) as pilot:
        screen = await loaded(pilot)
        await send(pilot, COUNTING[0].content)
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.text) > 20)
        os.kill(screen.workspace.backend.pid, signal.SIGABRT)
        await reply_done(pilot)
        await wait_for(pilot, lambda: any("Reply cut short" in str(n.title) for n in app._notifications), 15)
        said = next(str(n.message) for n in app._notifications if "Reply cut short" in str(n.title))
        assert "crashed with SIGABRT" in said and "the chat is kept, and the next message loads the model again" in said
        assert said.rsplit("; details in ", 1)[1].endswith(LOG_NAME)


def test_what_the_model_takes_on_each_device_is_llama_cpps_own_accounting(engine, starter_model: Path):
    """The weights, the KV cache and the compute buffers llama.cpp logged as it allocated them (on this machine's
    CPU: every layer in host memory), carried with the model's info out of the engine process, and in the panel."""
    from tui_chat.ui.panel.metrics import memory_line

    (cpu,) = engine.info.memory
    assert cpu.device == "CPU" and cpu.free is None
    assert 0.9 < cpu.weights / starter_model.stat().st_size < 1.1
    assert cpu.kv > 0 and cpu.compute > 0
    assert memory_line(cpu).startswith("CPU ") and " weights · " in memory_line(cpu)


def test_a_job_the_backend_cannot_start_ends_in_one_line_not_a_hang(engine):
    """The engine process answers a job whose call fails before it has a stream (here: generate without its
    request) with an Error, and goes on serving."""
    final = engine._remote(CAPABILITIES["generate"]).result()
    assert isinstance(final, Error) and final.message.startswith("internal error (TypeError"), final
    _, done = collect(engine.generate(request(QUESTION)))
    assert isinstance(done, Done)


def test_the_chats_settings_reach_every_reply_in_turn(engine):
    """A chat sends the same live settings with each reply: the one that ended must not take the next one's mirror
    with it, or a slider moved during the second reply would not reach the engine."""
    live = LiveParams(GREEDY.with_changes(max_tokens=400))
    collect(engine.generate(Request(QUESTION, live)))
    stream = engine.generate(Request(COUNTING, live))
    tokens = first_tokens(stream, 3)
    live.update(max_tokens=len(tokens) + 10)
    final = rest(stream, tokens)
    assert isinstance(final, Done) and final.stop_reason == "length" and len(tokens) < 60, final


def stop_engine(engine) -> int:
    """kill -STOP: the process lives and says nothing (a wedged engine, as a saboteur makes one)."""
    pid = engine.pid
    os.kill(pid, signal.SIGSTOP)
    return pid


def test_a_stopped_engine_is_ended_by_the_watchdog_and_the_next_request_answers(engine, monkeypatch):
    """Issue 44 item 4: `kill -STOP` left "Reading prompt…" for minutes. Silent while a job is open, the engine
    process is ended with a line that says so, and the next request loads the model in a new one."""
    monkeypatch.setattr("tui_chat.engine.process.SILENCE_LIMIT_S", 3.0)
    stopped = stop_engine(engine)
    asked = time.monotonic()
    tokens, final = collect(engine.generate(request(QUESTION)))
    assert isinstance(final, Error), final
    assert "stopped answering (not a word for 3 s" in final.message and "\n" not in final.message
    assert 3.0 <= time.monotonic() - asked < 8.0
    assert not Path(f"/proc/{stopped}").exists() or "Z" in Path(f"/proc/{stopped}/stat").read_text().split()[2]
    again, done = collect(engine.generate(request(QUESTION)))
    assert isinstance(done, Done) and done.text.strip(), done


def test_esc_ends_a_reply_without_the_engines_help(engine):
    """Issue 44 item 4: with the engine stopped mid-reply, Esc did nothing until it was continued. A stop the
    engine does not answer within STOP_GRACE_S ends the reply here, with the tokens that came."""
    stream = engine.generate(request(COUNTING, GREEDY.with_changes(max_tokens=400)))
    tokens = first_tokens(stream, 3)
    stopped = stop_engine(engine)
    try:
        asked = time.monotonic()
        stream.cancel()
        final = rest(stream, tokens)
        assert time.monotonic() - asked < 2.0
        assert isinstance(final, Error) and final.message.startswith("stopped here"), final
        assert len(tokens) >= 3
    finally:
        os.kill(stopped, signal.SIGCONT)


def test_time_to_first_token_after_a_reload_leaves_the_reload_out(engine):
    """Issue 44 item 5: after an engine death the next reply's TTFT counted the model's reload (5.19 s for a
    0.57 s read). It counts from the model being there again; the reload is said apart."""
    os.kill(engine.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while engine.pid is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    sent = time.perf_counter()
    tokens, done = collect(engine.generate(request(QUESTION)))
    waited = time.perf_counter() - sent
    assert isinstance(done, Done), done
    metrics = done.metrics
    assert metrics.reload_s > 0.2  # a real load in a new process
    assert metrics.ttft_s is not None and metrics.ttft_s < waited - metrics.reload_s + 0.05
    assert metrics.ttft_s + metrics.reload_s <= waited + 0.05
    plain, again = collect(engine.generate(request(QUESTION)))
    assert isinstance(again, Done) and again.metrics.reload_s == 0.0


def test_a_death_between_replies_is_said_when_it_happens(engine):
    """Issue 44 item 11: an idle engine's crash showed nothing until the next message."""
    heard: list[EngineDeath] = []
    engine.on_idle_death = heard.append
    os.kill(engine.pid, signal.SIGABRT)
    deadline = time.monotonic() + 10
    while not heard and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(heard) == 1 and "crashed with SIGABRT" in heard[0].cause and heard[0].log, heard


def test_a_signal_from_outside_names_what_the_engine_was_doing_not_its_socket(engine):
    """Issue 44 item 10: kill -SEGV mid-reply said `in _recv (connection.py)`, the main thread's wait on the
    socket; the thread at work was decoding."""
    stream = engine.generate(request(COUNTING, GREEDY.with_changes(max_tokens=400)))
    tokens = first_tokens(stream, 3)
    os.kill(engine.pid, signal.SIGSEGV)
    final = rest(stream, tokens)
    assert isinstance(final, Error), final
    assert "crashed with SIGSEGV" in final.message
    assert "connection.py" not in final.message and "_recv" not in final.message
    assert "while decoding a token" in final.message or "while sampling a token" in final.message, final.message


async def test_the_chat_says_at_once_when_its_engine_dies_between_replies(starter_model: Path):
    """Issue 44 item 11, in the app: a notification when it happens, not a surprise at the next message."""
    config = Config(sampling=GREEDY.with_changes(max_tokens=8), n_ctx=1024)
    app = ChatApp(config, opener_for(config, engine_process=True)[0], str(starter_model))
    async with app.run_test(size=(100, 32), notifications=True) as pilot:
        screen = await loaded(pilot)
        backend = screen.workspace.backend
        assert isinstance(backend, LocalEngineProcess)
        os.kill(backend.pid, signal.SIGABRT)
        await wait_for(pilot, lambda: any("crashed with SIGABRT" in str(n.message) for n in app._notifications), 15)
