"""The server's slots (engine/local/slots.py) on the real starter: a request that arrives while others are being
written has its prompt read a chunk a step inside their batches, as llama.cpp's server does, not in a decode of
its own that stops them for the whole read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import GREEDY
from tui_chat.engine.base import Done, Loaded, Message, PromptProgress, Request, Token
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import LiveParams

pytestmark = pytest.mark.starter

ROOM = 4096
LOG = "\n".join(f"Line {n} of the log: the reading went on." for n in range(120))  # ~1,500 tokens


@pytest.fixture(scope="module")
def serving(starter_model: Path):
    backend = LlamaBackend(LlamaSettings(starter_model, n_ctx=2 * ROOM))
    assert isinstance(backend.load().result(), Loaded)
    yield backend
    backend.close()


def events_until(stream, done, timeout: float = 120.0) -> list:
    events, deadline = [], time.monotonic() + timeout
    while not done(events):
        assert time.monotonic() < deadline, "the stream stopped short"
        events += stream.drain(timeout=1.0)
    return events


def test_a_long_prompt_arriving_is_read_beside_the_replies_being_written(serving):
    counting = Request([Message("user", "Count from 1 to 500, separated by commas.")],
                       LiveParams(GREEDY.with_changes(max_tokens=200)))
    running = serving.generate_together(counting, ROOM)
    before = events_until(running, lambda events: sum(isinstance(e, Token) for e in events) >= 5)
    newcomer = serving.generate_together(Request([Message("user", f"{LOG}\nSummarise the log.")],
                                                 LiveParams(GREEDY.with_changes(max_tokens=4))), ROOM)
    arrived = time.perf_counter()
    read = events_until(newcomer, lambda events: any(isinstance(e, (Token, Done)) for e in events))
    progress = [e for e in read if isinstance(e, PromptProgress)]
    assert progress[-1].done == progress[-1].total > 1000
    assert len(progress) > 4, "read a chunk a step, each said"
    first = next(e for e in read if isinstance(e, Token))
    during = [e for e in running.drain(timeout=1.0) + before if isinstance(e, Token) and arrived < e.at < first.at]
    assert len(during) >= len(progress) - 2, "the reply in flight went on a token a chunk while the prompt was read"
    events_until(newcomer, lambda events: any(isinstance(e, Done) for e in events))
    running.cancel()
    assert isinstance(running.result(), Done)
