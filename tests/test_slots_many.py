"""Many serving slots at once (`tui-chat serve --parallel` up to 16, engine/local/slots.py) on the real starter:
replies decoded eight together are the replies each request gets alone; sixteen slots share a small context,
each in its room; a step's batch never holds more rows than it has; a real server answers eight streamed
clients together."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from conftest import GREEDY, collect
from test_serve import client, get, serving
from test_starter import assert_alike_until_a_near_tie
from tui_chat.engine.base import Done, Error, Loaded, Message, Request, Token
from tui_chat.engine.compare import MAX_SLOTS
from tui_chat.engine.local.llama import LlamaBackend
from tui_chat.engine.local.llamacpp import N_SEQ_MAX
from tui_chat.engine.local.settings import LlamaSettings
from tui_chat.engine.params import LiveParams

pytestmark = pytest.mark.starter

TOPICS = ("owls", "rivers", "bread", "comets", "violins", "glaciers", "bees", "lighthouses", "tides", "maps",
          "volcanoes", "clocks", "moss", "kites", "salt", "bridges")


def request(topic: str, max_tokens: int, top_logprobs: int = 0) -> Request:
    return Request([Message("user", f"Write two sentences about {topic}.")],
                   LiveParams(GREEDY.with_changes(max_tokens=max_tokens)), top_logprobs=top_logprobs)


def loaded(model: Path, n_ctx: int) -> LlamaBackend:
    """A serving backend on one pinned thread: a thread count that follows the machine's load between the two
    sides of a comparison would change the last digits of a logit too."""
    backend = LlamaBackend(LlamaSettings(model, n_ctx=n_ctx, threads=1, threads_batch=1))
    assert isinstance(backend.load().result(), Loaded)
    return backend


def together(backend: LlamaBackend, requests: list[Request], room: int) -> list[tuple[list[Token], Done | Error]]:
    """Every request sent at once, then each one's tokens and end."""
    streams = [backend.generate_together(asked, room) for asked in requests]
    return [collect(stream) for stream in streams]


def all_at_once(replies: list[tuple[list[Token], Done | Error]]) -> bool:
    """Every reply had drawn its first token before any drew its last: all were written at the same time."""
    return max(tokens[0].at for tokens, _ in replies) < min(tokens[-1].at for tokens, _ in replies)


def step_sizes(backend: LlamaBackend, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Each step's (generating rows, rows in all) from here on."""
    session = backend.session
    assert session is not None
    sizes: list[tuple[int, int]] = []
    step_rows = session.step_rows

    def counted(rows, reading=()):
        sizes.append((len(rows), len(rows) + sum(len(chunk.tokens) for chunk in reading)))
        return step_rows(rows, reading)

    monkeypatch.setattr(session, "step_rows", counted)
    return sizes


def test_the_context_holds_a_sequence_for_each_slot_beside_the_labs_and_the_scratch():
    assert MAX_SLOTS == 16 and N_SEQ_MAX == 2 + MAX_SLOTS


def test_eight_replies_decoded_together_are_each_the_reply_it_gets_alone(starter_model):
    """Greedy, different prompts: each row of the eight-row steps draws what a step of its sequence alone draws
    (they may part only at a near tie: a batch's rows and a one-token step use other kernels, README)."""
    requests = [request(topic, 24, top_logprobs=5) for topic in TOPICS[:8]]
    room = 512
    alone_backend = loaded(starter_model, 8 * room)
    try:
        alone = [collect(alone_backend.generate_together(asked, room)) for asked in requests]
    finally:
        alone_backend.close()
    backend = loaded(starter_model, 8 * room)
    try:
        replies = together(backend, requests, room)
    finally:
        backend.close()
    assert all(isinstance(done, Done) and len(tokens) == done.metrics.completion_tokens > 0
               for tokens, done in alone + replies), [done for _, done in alone + replies]
    assert all_at_once(replies)
    assert len({done.text for _, done in replies}) == 8, "each prompt its own reply"
    for (ours, _), (theirs, _) in zip(replies, alone, strict=True):
        assert_alike_until_a_near_tie(ours, theirs)


def test_a_slots_reply_does_not_depend_on_what_the_other_slots_hold(starter_model):
    """The same request beside seven of one prompt, then beside seven of another as long (in tokens): each slot
    attends to its own cells only, so its reply is the same to rounding far below a near tie's."""
    replies = []
    for other in ("bread", "maps"):
        backend = loaded(starter_model, 4096)
        try:
            replies.append(together(backend, [request(other, 24, 2)] * 7 + [request("owls", 24, 2)], 512)[-1][0])
        finally:
            backend.close()
    first, second = replies
    assert [token.token_id for token in first] == [token.token_id for token in second]
    assert all(a.prob == pytest.approx(b.prob, abs=1e-4) for a, b in zip(first, second, strict=True))


@pytest.fixture(scope="module")
def sixteen(starter_model: Path):
    """A context of 1,024 tokens: 64 a slot with all sixteen in use."""
    backend = loaded(starter_model, 1024)
    yield backend
    backend.close()


def test_sixteen_slots_at_once_each_in_its_room_and_a_prompt_past_it_refused(sixteen, monkeypatch):
    room = sixteen.loaded().session.n_ctx // MAX_SLOTS
    assert room == 64
    sizes = step_sizes(sixteen, monkeypatch)
    replies = together(sixteen, [request(topic, 12) for topic in TOPICS], room)
    assert all(isinstance(done, Done) and done.metrics.completion_tokens > 0 and done.metrics.n_ctx == room
               for _, done in replies), [done for _, done in replies]
    assert all_at_once(replies)
    assert max(generating for generating, _ in sizes) == 16, "all sixteen drew in the same steps"
    assert max(rows for _, rows in sizes) <= sixteen.loaded().session.n_batch
    long = Request([Message("user", "Repeat these words: " + "owl river bread comet " * 20)],
                   LiveParams(GREEDY.with_changes(max_tokens=4)))
    _, refused = collect(sixteen.generate_together(long, room))
    assert isinstance(refused, Error) and refused.code == "context_length_exceeded", refused
    assert f"may use {room:,}" in refused.message


def test_no_step_holds_more_rows_than_the_batch_has(sixteen, monkeypatch):
    """With a batch of 6 rows, ten requests: at most six take a slot at once (each draws a row a step), the
    others wait for a free one; the newcomers' prompts are read in what the generating rows leave."""
    session = sixteen.loaded().session
    monkeypatch.setattr(session, "n_batch", 6)
    sizes = step_sizes(sixteen, monkeypatch)
    replies = together(sixteen, [request(topic, 6) for topic in TOPICS[:10]], 64)
    assert all(isinstance(done, Done) and done.metrics.completion_tokens > 0 for _, done in replies)
    assert max(rows for _, rows in sizes) <= 6 and max(generating for generating, _ in sizes) == 6, sizes


def test_a_real_server_with_eight_slots_streams_eight_clients_together(starter_model, tmp_path):
    with serving(starter_model, tmp_path, "--parallel", "8", "--n-ctx", "4096") as url:
        status, text, _ = get(f"{url.removesuffix('/v1')}/props")
        props = json.loads(text)
        assert status == 200 and props["total_slots"] == 8 and props["default_generation_settings"]["n_ctx"] == 512
        streams: dict[str, tuple[list[float], str, str | None]] = {}
        gate = threading.Barrier(8)

        def stream(topic: str) -> None:
            chat = client(url, timeout=300)
            times, pieces, finish = [], [], None
            gate.wait()
            for chunk in chat.chat.completions.create(
                    model="", messages=[{"role": "user", "content": f"Write two sentences about {topic}."}],
                    max_tokens=24, temperature=0, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    times.append(time.perf_counter())
                    pieces.append(chunk.choices[0].delta.content)
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            streams[topic] = (times, "".join(pieces), finish)

        threads = [threading.Thread(target=stream, args=(topic,)) for topic in TOPICS[:8]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert set(streams) == set(TOPICS[:8])
    assert all(text.strip() and finish in ("length", "stop") for _, text, finish in streams.values()), streams
    assert max(times[0] for times, _, _ in streams.values()) < min(times[-1] for times, _, _ in streams.values()), \
        "the eight streams were written at the same time"
