"""Engine events into the real chat screen at rates a GPU reaches: every reply finishes, every event is
applied once, and a lost batch is posted again."""

from __future__ import annotations

import asyncio
import threading

import pytest
from textual.app import App

from conftest import GREEDY
from scripted import INFO, ScriptedBackend
from test_ui import loaded, reply_done, send, wait_for
from tui_chat.config import Config
from tui_chat.engine.base import Done, Request, Stream, Token, TurnMetrics
from tui_chat.ui import bridge
from tui_chat.ui.app import ChatApp
from tui_chat.ui.bridge import EngineBatch, forward_events
from tui_chat.ui.widgets.messages import FREEZE_AFTER_CHARS

PARAGRAPH = "Word " * 60 + "end.\n\n"


class FloodBackend(ScriptedBackend):
    """Writes `tokens` pieces as fast as it can, or all of them at once before the UI looks (`at_once`):
    then one batch holds the whole reply and its end, the case that froze the screen."""

    def __init__(self, tokens: int, at_once: bool = False) -> None:
        self.tokens, self.at_once = tokens, at_once

    def generate(self, request: Request) -> Stream:
        stream = Stream()
        pieces = [PARAGRAPH[i % len(PARAGRAPH)] for i in range(self.tokens)]
        version = request.params.snapshot()[0]
        metrics = TurnMetrics(prompt_tokens=5, completion_tokens=self.tokens, context_tokens=5 + self.tokens,
                              n_ctx=INFO.n_ctx)

        def write() -> None:
            for index, piece in enumerate(pieces):
                stream.put(Token(index, piece, 0.0, version))
            stream.put(Done("length", "".join(pieces), metrics))

        if self.at_once:
            write()
        else:
            threading.Thread(target=write, daemon=True).start()
        return stream


@pytest.mark.parametrize("at_once", [True, False])
async def test_a_flood_of_tokens_always_finishes(at_once):
    """Ten replies of 12,000 tokens each, far beyond 5,000 tok/s: each ends with all its text shown."""
    tokens = 12_000
    assert tokens > FREEZE_AFTER_CHARS  # chunks freeze on the way, and in the last batch too

    async def chat() -> None:
        app = ChatApp(Config(sampling=GREEDY), lambda _name: FloodBackend(tokens, at_once), "flood")
        async with app.run_test(size=(100, 32)) as pilot:
            await loaded(pilot)
            for turn in range(10):
                await send(pilot, f"Go on ({turn})")
                reply = await reply_done(pilot, timeout=60)
                assert reply.finished and len(reply.text) == tokens

    await asyncio.wait_for(chat(), 300)  # a frozen screen fails here instead of hanging the suite


class Dropping(App):
    """A UI whose handler loses one batch (never applies it nor says so), as a dead handler would."""

    def __init__(self, drop: int) -> None:
        super().__init__()
        self.drop = drop
        self.batches = 0
        self.applied: list[int] = []

    def on_engine_batch(self, message: EngineBatch) -> None:
        self.batches += 1
        if self.batches == self.drop:
            return
        self.applied += [event.token_id for event in message.events if isinstance(event, Token)]
        message.done()


async def test_a_lost_batch_is_posted_again_and_nothing_is_applied_twice(monkeypatch):
    monkeypatch.setattr(bridge, "RESEND_AFTER_S", 0.3)
    app = Dropping(drop=2)
    stream = Stream()
    async with app.run_test() as pilot:
        forwarder = threading.Thread(target=forward_events, args=(stream, app, "job"))
        forwarder.start()
        for index in range(200):
            stream.put(Token(index, "x", 0.0, 0))
            await asyncio.sleep(0.001 if index % 50 else 0.05)
        stream.put(Done("length", "x" * 200, TurnMetrics()))
        await wait_for(pilot, lambda: not forwarder.is_alive(), timeout=10)
    assert app.batches > 2
    assert app.applied == list(range(200))


async def test_the_forwarder_ends_when_the_screen_is_gone(monkeypatch):
    """Waiting for a batch the UI never acknowledges, it ends with the UI, not after the reply."""
    monkeypatch.setattr(bridge, "RESEND_AFTER_S", 100.0)
    app = Dropping(drop=1)
    stream = Stream()
    async with app.run_test():
        forwarder = threading.Thread(target=forward_events, args=(stream, app, "job"), daemon=True)
        forwarder.start()
        stream.put(Token(0, "x", 0.0, 0))
        await asyncio.sleep(0.3)
    forwarder.join(timeout=3)
    assert not forwarder.is_alive()


def test_a_slow_copy_and_its_repeat_apply_each_event_once():
    receipts = bridge.Receipts()
    events = [Token(i, "x", 0.0, 0) for i in range(10)]
    first = EngineBatch("job", events[:6], receipts, 0)
    repeat = EngineBatch("job", events, receipts, 0)  # posted again while the first was still being handled
    assert [e.token_id for e in first.events] == list(range(6))
    first.done()
    assert [e.token_id for e in repeat.events] == list(range(6, 10))
    repeat.done()
    assert receipts.applied == 10
