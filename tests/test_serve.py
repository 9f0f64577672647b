"""`tui-chat serve` as a client sees it: the official `openai` client (and raw HTTP where a client would refuse to
send the request) against the real command on the starter model, in a process of its own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import openai
import pytest

from conftest import run_cli

PROMPT = [{"role": "user", "content": "Count from 1 to 100: 1, 2, 3,"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
# for the scripted models, which would fill a free string to the limit: the grammar writes the city whole
CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}, "required": ["city"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}


@contextmanager
def serving(model: Path, home: Path, *flags: str) -> Iterator[str]:
    """`tui-chat serve --no-ui` on a free port, its own data dirs; yields its base URL, stops it with Ctrl+C."""
    env = os.environ | {name: str(home / name) for name in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME")}
    process = subprocess.Popen([sys.executable, "-m", "tui_chat", "serve", "--no-ui", "--port", "0", "--model",
                                str(model), *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        found = re.search(r" at (http://\S+/v1) ", line)
        assert found, (line, process.stderr.read() if process.poll() is not None else "")
        yield found.group(1)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def server_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def server(starter_model, server_home) -> Iterator[str]:
    """One server for the module: two at once, one more waiting, a JSON line per request."""
    log = server_home / "log.jsonl"
    with serving(starter_model, server_home, "--parallel", "2", "--queue", "1", "--json-log", str(log)) as url:
        yield url


def client(url: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=options.pop("api_key", "none"), max_retries=0, **options)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict]:
    """A raw GET: its status, text and headers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def health(url: str) -> tuple[int, dict]:
    status, text, _ = get(f"{url.removesuffix('/v1')}/health")
    return status, json.loads(text)


def until_idle(url: str) -> None:
    """Until the requests an earlier test left have ended: a test that counts places starts with all free."""
    deadline = time.monotonic() + 60
    while health(url)[1]["in_flight"] or health(url)[1]["waiting"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def connect(url: str) -> socket.socket:
    where = urlsplit(url)
    return socket.create_connection((where.hostname, where.port), timeout=30)


def send_raw(url: str, path: str, body: dict) -> socket.socket:
    """A POST sent on a socket of its own, its answer left unread (the client may leave)."""
    data = json.dumps(body).encode()
    connection = connect(url)
    connection.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return connection


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict, dict]:
    """A raw POST: its status, JSON body and headers."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def test_a_completion_whole_and_streamed(server):
    chat = client(server)
    [model] = chat.models.list().data
    assert model.id == "gemma-3-270m-q4_k_m" and model.owned_by == "tui-chat"
    whole = chat.chat.completions.create(model=model.id, messages=PROMPT, max_tokens=12, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.choices[0].message.content.strip()
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens > 10
    extras = whole.model_extra["x_tui_chat"]
    assert extras["ttft_s"] > 0 and extras["decode_tok_s"] > 0 and extras["kv_used"] >= whole.usage.total_tokens - 1
    pieces, finish = [], None
    for chunk in chat.chat.completions.create(model=model.id, messages=PROMPT, max_tokens=12, temperature=0,
                                              stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        else:
            assert chunk.usage.completion_tokens == 12
            assert chunk.usage.prompt_tokens_details.cached_tokens > 0, "the same prompt again: its prefix reused"
    assert finish == "length" and len([piece for piece in pieces if piece]) >= 6
    text = chat.completions.create(model=model.id, prompt="1, 2, 3, 4,", max_tokens=6, temperature=0, logprobs=2)
    assert text.choices[0].text.strip() and text.object == "text_completion"
    logprobs = text.choices[0].logprobs
    assert "".join(logprobs.tokens) == text.choices[0].text and len(logprobs.token_logprobs) == 6
    assert all(len(top) == 2 for top in logprobs.top_logprobs) and logprobs.text_offset[0] == 0


def test_top_logprobs_are_those_of_run(starter_model, tmp_path):
    """The same prompt, read fresh by `tui-chat run` and by a new server: each token's probabilities agree."""
    prompt = "Write the alphabet: A, B, C,"
    ran = run_cli("run", "-m", str(starter_model), "-p", prompt, "--temperature", "0", "--max-tokens", "4",
                  "--top-logprobs", "3", "--json")
    assert ran.returncode == 0, ran.stderr
    expected = json.loads(ran.stdout)["turns"][0]["tokens"]
    with serving(starter_model, tmp_path, "--parallel", "1") as url:
        reply = client(url).chat.completions.create(model="", messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    served = reply.choices[0].logprobs.content
    assert [entry.token for entry in served] == [token["token"] for token in expected]
    for entry, token in zip(served, expected, strict=True):
        assert abs(2.718281828 ** entry.logprob - token["prob"]) < 1e-4
        assert [top.token for top in entry.top_logprobs] == [top["token"] for top in token["top"]]
        for top, wanted in zip(entry.top_logprobs, token["top"], strict=True):
            assert abs(2.718281828 ** top.logprob - wanted["prob"]) < 1e-4


def test_a_schema_reply_validates(server):
    reply = client(server).chat.completions.create(
        model="gemma-3-270m-q4_k_m", messages=[{"role": "user", "content": "A person as JSON, with a name and age."}],
        max_tokens=200, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_validates_against_its_schema(server, stream):
    chat = client(server)
    asked = {"model": "gemma-3-270m-q4_k_m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
             "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60, "temperature": 0}
    if stream:
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in chat.chat.completions.create(**asked, stream=True):
            delta = chunk.choices[0].delta
            assert not (delta.content or "").count("<tool_call>"), "a call never goes out as text"
            for piece in delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"name": "", "arguments": ""})
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        [call] = calls.values()
        name, arguments = call["name"], call["arguments"]
    else:
        reply = chat.chat.completions.create(**asked)
        finish = reply.choices[0].finish_reason
        [called] = reply.choices[0].message.tool_calls
        name, arguments = called.function.name, called.function.arguments
    assert finish == "tool_calls" and name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_two_clients_at_once_are_answered_together_each_reusing_its_own_prefix(server):
    """Two conversations of two turns each, at the same time: the second turn of each reads only its new part."""
    results: dict[str, list] = {}

    def converse(topic: str) -> None:
        chat = client(server)
        messages = [{"role": "user", "content": f"Tell me about {topic}. Count to fifty first: 1, 2, 3,"}]
        first = chat.chat.completions.create(model="", messages=messages, max_tokens=48, temperature=0)
        spans = [first.model_extra["x_tui_chat"]]
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And then?"}]
        second = chat.chat.completions.create(model="", messages=messages, max_tokens=8, temperature=0)
        results[topic] = [first, second, spans, time.perf_counter()]

    started = time.perf_counter()
    threads = [threading.Thread(target=converse, args=(topic,)) for topic in ("owls", "rivers")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert set(results) == {"owls", "rivers"}
    for first, second, _, _ in results.values():
        assert first.model_extra["x_tui_chat"]["queued_s"] < 0.5, "both in flight at once (--parallel 2)"
        reused = second.usage.prompt_tokens_details.cached_tokens
        assert reused >= first.usage.prompt_tokens + first.usage.completion_tokens - 8, (reused, first.usage)
    alone = sum(result[0].usage.completion_tokens / result[0].model_extra["x_tui_chat"]["decode_tok_s"]
                for result in results.values())
    assert time.perf_counter() - started < alone + 30


def test_a_client_that_disconnects_frees_its_place(server):
    """--parallel 2: two long streams, one read a little and dropped; the next request starts at once."""
    stay = client(server).chat.completions.create(model="", messages=PROMPT, max_tokens=400, temperature=0,
                                                  stream=True)
    leave = client(server).chat.completions.create(model="", messages=PROMPT, max_tokens=400, temperature=0,
                                                   stream=True)
    next(iter(stay))
    for _, _ in zip(range(3), leave, strict=False):
        pass
    leave.close()
    time.sleep(0.3)
    reply = client(server).chat.completions.create(model="", messages=PROMPT, max_tokens=2, temperature=0)
    assert reply.model_extra["x_tui_chat"]["queued_s"] < 1.0, "the dropped stream's place was free"
    stay.close()


def test_past_the_queue_a_request_is_told_to_retry(server):
    """--parallel 2 --queue 1: two long streams in flight, one waiting; the fourth is answered 429."""
    streams = [client(server).chat.completions.create(model="", messages=PROMPT, max_tokens=300, stream=True)
               for _ in range(2)]
    for stream in streams:
        next(iter(stream))
    waiting = threading.Thread(target=lambda: client(server).chat.completions.create(
        model="", messages=PROMPT, max_tokens=1))
    waiting.start()
    health = f"{server.removesuffix('/v1')}/health"
    for _ in range(200):  # until the third waits for a place
        with urllib.request.urlopen(health, timeout=5) as answer:
            if json.loads(answer.read())["waiting"] == 1:
                break
        time.sleep(0.05)
    status, body, headers = post(f"{server}/chat/completions", json.dumps({"messages": PROMPT}).encode())
    assert status == 429 and headers["Retry-After"] == "1" and body["error"]["code"] == "rate_limit_exceeded"
    for stream in streams:
        stream.close()
    waiting.join(60)


def test_bad_requests_are_answered_in_openais_shape(server):
    chat = client(server)
    status, body, _ = post(f"{server}/chat/completions", b'{"messages": [')
    assert status == 400 and body["error"]["message"].startswith("the request body is not valid JSON")
    with pytest.raises(openai.NotFoundError) as unknown:
        chat.chat.completions.create(model="gpt-9", messages=PROMPT)
    assert unknown.value.body["code"] == "model_not_found" and unknown.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as negative:
        chat.chat.completions.create(model="", messages=PROMPT, max_tokens=-5)
    assert negative.value.body["param"] == "max_tokens"
    status, body, _ = post(f"{server}/chat/completions", b" " * (10 * 2**20))
    assert status == 413 and body["error"]["code"] == "request_too_large"
    with pytest.raises(openai.BadRequestError) as long:
        chat.chat.completions.create(model="", messages=[{"role": "user", "content": "word " * 3000}])
    assert long.value.body["code"] == "context_length_exceeded"
    status, body, _ = post(f"{server}/chat/completions", json.dumps({"messages": [{"role": "robot"}]}).encode())
    assert status == 400 and body["error"]["param"] == "messages[0].role"
    assert chat.chat.completions.create(model="", messages=PROMPT, max_tokens=2).choices, "the server still answers"
    status, body, _ = post(f"{server.removesuffix('/v1')}/tokenize", json.dumps({"content": "one two"}).encode())
    assert status == 200 and body["count"] == len(body["tokens"]) == 2 and body["tokens"] != [0, 1]


def test_a_grammar_that_does_not_parse_is_the_clients_mistake(server):
    """Issue 48: a bad grammar was a 500 `server_error`, so the openai client sent it three times."""
    chat = openai.OpenAI(base_url=server, api_key="none")  # the client's own retries: none for a 400
    with pytest.raises(openai.BadRequestError) as bad:
        chat.chat.completions.create(model="", messages=PROMPT, max_tokens=4, extra_body={"grammar": "root ::= foo"})
    assert bad.value.body["param"] == "grammar" and "does not parse" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as echo:
        chat.completions.create(model="", prompt="1, 2, 3", max_tokens=0, echo=True, logprobs=1)
    assert echo.value.body["param"] == "echo" and "not supported" in echo.value.body["message"]


def test_max_tokens_beyond_the_slot_ends_the_reply_at_its_end(server):
    """Issue 48: a max_tokens above a slot's share was a 400, where llama-server clamps it (clients that send a
    large fixed one failed). A prompt that nearly fills the slot: the reply ends at its end, `length`."""
    base = server.removesuffix("/v1")
    room = json.loads(get(f"{base}/props")[1])["default_generation_settings"]["n_ctx"]
    count = post(f"{base}/tokenize", json.dumps({"content": " seven" * 10}).encode())[1]["count"]
    assert count == 10, "a word a token"
    prompt = " seven" * (room - 8)
    reply = client(server).completions.create(model="", prompt=prompt, max_tokens=10**6, temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.model_extra["x_tui_chat"]["stop_reason"] == "context"
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= room


def test_metrics_in_prometheus_text_format(server):
    """Issue 48: llama-server's `/metrics` was missing: requests, tokens in and out, the queue, the decode rate."""
    client(server).chat.completions.create(model="", messages=PROMPT, max_tokens=3, temperature=0)
    status, text, headers = get(f"{server.removesuffix('/v1')}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
    assert {line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE")} == set(samples)
    assert int(samples["tui_chat_requests_total"]) >= 1 and int(samples["tui_chat_completion_tokens_total"]) >= 3
    assert int(samples["tui_chat_prompt_tokens_total"]) > 10 and float(samples["tui_chat_decode_tokens_per_second"]) > 0
    assert samples["tui_chat_requests_waiting"] == "0" and samples["tui_chat_engine_up"] == "1"


def test_a_client_that_leaves_before_its_prompt_is_taken_is_gone_not_failed(server, server_home):
    """Issue 48: a client that left while the engine was reading prompts was counted as a failure (500)."""
    until_idle(server)
    log = server_home / "log.jsonl"
    before = len(log.read_text().splitlines())
    long = f"{uuid.uuid4()}" + " seven" * 1900  # read for a while, nothing of it cached
    reading = send_raw(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}],
                                                        "max_tokens": 1})
    time.sleep(0.3)
    send_raw(server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4}).close()
    reading.settimeout(60)
    assert reading.recv(12) == b"HTTP/1.1 200"
    reading.close()
    deadline = time.monotonic() + 30
    while not (ended := [entry for line in log.read_text().splitlines()[before:]
                         if (entry := json.loads(line))["endpoint"] == "completion"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    [left] = ended
    assert (left["end"], left["status"]) == ("gone", 200), left


def test_another_address_needs_a_key_which_every_request_must_send(starter_model, tmp_path):
    refused = run_cli("serve", "--no-ui", "--host", "0.0.0.0", "--port", "0", "--model", str(starter_model))
    assert refused.returncode == 2 and "give --api-key KEY" in refused.stderr and "Traceback" not in refused.stderr
    with serving(starter_model, tmp_path, "--host", "0.0.0.0", "--api-key", "sesame") as url:
        url = url.replace("0.0.0.0", "127.0.0.1")
        with pytest.raises(openai.AuthenticationError) as missing:
            client(url).models.list()
        assert missing.value.body["code"] == "invalid_api_key"
        [model] = client(url, api_key="sesame").models.list().data
        assert health(url) == (200, {"status": "ok"}), "open to probes, without the figures"
        status, text, _ = get(f"{url}/models", {"Authorization": "bearer sesame"})
        assert status == 200 and json.loads(text)["data"][0]["id"] == model.id, "the scheme in any case"
        keyed = client(url, api_key="sesame")
        assert keyed.models.retrieve(model.id).id == model.id
        with pytest.raises(openai.NotFoundError) as unknown:
            keyed.models.retrieve("gpt-9")
        assert unknown.value.body["code"] == "model_not_found"


def test_tui_chats_own_remote_backend_chats_with_it_and_reads_its_figures(server, server_home):
    log = server_home / "log.jsonl"
    before = len(log.read_text().splitlines())
    ran = run_cli("run", "--base-url", server, "-p", "Say hello", "--max-tokens", "6", "--temperature", "0",
                  "--logit-bias", "Hello=-inf", "--xtc-probability", "0.2", "--json")
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr  # every setting sent: none it cannot take
    report = json.loads(ran.stdout)
    turn = report["turns"][0]
    [logged] = [json.loads(line) for line in log.read_text().splitlines()[before:]]
    assert turn["prompt_tokens"] == logged["prompt_tokens"]
    assert turn["cached_tokens"] == logged["cached_tokens"]
    assert turn["completion_tokens"] == logged["completion_tokens"]
    assert turn["server_decode_tok_s"] == pytest.approx(logged["decode_tok_s"], rel=1e-3)


async def test_the_app_chats_with_it_and_its_panel_shows_the_servers_figures(server, server_home):
    """Ctrl+O's `@http://HOST:PORT`: a chat on the server, whose panel reads the figures the server logged."""
    from test_ui import SIZE, loaded, make_app, reply_done, send
    from tui_chat.ui.panel.metrics import MetricsPanel

    log = server_home / "log.jsonl"
    before = len(log.read_text().splitlines())
    async with make_app(f"@{server.removesuffix('/v1')}").run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        info = screen.workspace.backend.info
        assert info.name == "gemma-3-270m-q4_k_m" and info.description.startswith("tui-chat serve · ")
        assert info.ignored_params == () and info.ignored_formats == ()
        await send(pilot, "Say hello")
        await reply_done(pilot)
        shown = screen.query_one(MetricsPanel).metrics
        [logged] = [json.loads(line) for line in log.read_text().splitlines()[before:]]
        assert (shown.prompt_tokens, shown.cached_tokens, shown.completion_tokens) == (
            logged["prompt_tokens"], logged["cached_tokens"], logged["completion_tokens"])
        assert shown.server_decode_tok_s == pytest.approx(logged["decode_tok_s"], rel=1e-3)
        assert logged["prefill_tok_s"] is None or shown.prefill_tok_s == pytest.approx(logged["prefill_tok_s"],
                                                                                       rel=1e-3)


@contextmanager
def served(backend, temperature: float = 0.0, **options) -> Iterator[tuple[object, object, str]]:
    """A real server over `backend` (loaded here), in this process: server, monitor, base URL."""
    from tui_chat.engine.base import Loaded
    from tui_chat.engine.params import SamplingParams
    from tui_chat.pricing import PRESETS
    from tui_chat.serve.monitor import Monitor
    from tui_chat.serve.server import ServeOptions, TuiChatServer

    loaded = backend.load().result()
    assert isinstance(loaded, Loaded)
    monitor = Monitor(next(iter(PRESETS.values())))
    server = TuiChatServer(ServeOptions(port=0, **options), backend, loaded.info,
                           SamplingParams(temperature=temperature), monitor)
    try:
        yield server, monitor, f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.server_close()
        backend.close()


@contextmanager
def in_process(model: Path, temperature: float = 0.0, **options) -> Iterator[tuple[object, object, str]]:
    """A real server with its engine in this process (the view's tests drive it): server, monitor, base URL."""
    from tui_chat.engine.local.llama import LlamaBackend
    from tui_chat.engine.local.settings import LlamaSettings

    with served(LlamaBackend(LlamaSettings(model, n_ctx=1024)), temperature, **options) as parts:
        yield parts


@contextmanager
def answered(server) -> Iterator[None]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()


@contextmanager
def answering(model: Path, **options) -> Iterator[str]:
    """`in_process`, its requests answered on a thread: the base URL."""
    with in_process(model, **options) as (server, _, url), answered(server):
        yield url


@contextmanager
def over_an_engine_process(model: Path, logs: Path, **options) -> Iterator[tuple[object, str]]:
    """As `tui-chat serve` runs it (the engine in a process of its own), in this process, so that a test can
    shorten the watchdog's limit: the engine and the base URL."""
    from tui_chat.engine.factory import local_backend
    from tui_chat.engine.local.settings import LlamaSettings
    from tui_chat.engine.process import LocalEngineProcess

    engine = LocalEngineProcess(partial(local_backend, LlamaSettings(model, n_ctx=2048), "starter", logs), logs)
    with served(engine, **options) as (server, _, url), answered(server):
        yield engine, url


def test_a_slow_client_is_let_go_after_the_timeout(tiny_model):
    """Issue 48: connections had no timeout, so a client that sent its headers (or body) slowly, or not at all,
    held a thread for ever before its key was even read."""
    from tui_chat.serve.server import ServeOptions

    assert ServeOptions().timeout_s <= 60
    with answering(tiny_model, timeout_s=1.0) as url:
        with connect(url) as headers:
            headers.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the headers never end
            started = time.monotonic()
            assert headers.recv(1024) == b"" and time.monotonic() - started < 5
        with connect(url) as body:
            body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            assert body.recv(1024).startswith(b"HTTP/1.1 408 ")
        assert health(url)[0] == 200, "the server still answers"


def test_connections_past_the_bound_are_turned_away_at_once_and_their_places_come_back(tiny_model):
    """Issue 48: a thread per connection without a bound: connections left open (idle keep-alives, slow clients)
    took threads without end, before their key was even read."""
    with answering(tiny_model, max_connections=4) as url:
        idle = [connect(url) for _ in range(4)]
        deadline = time.monotonic() + 10
        with connect(url) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = extra.recv(4096)
            assert time.monotonic() < deadline
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        idle.pop().close()
        while True:  # its thread sees the close and gives the place back
            try:
                assert health(url)[0] == 200
                break
            except (OSError, json.JSONDecodeError, AssertionError):
                assert time.monotonic() < deadline, "the place did not come back"
                time.sleep(0.05)
        for connection in idle:
            connection.close()


def test_clients_that_arrive_together_are_all_answered_at_once(tiny_model):
    """Found by serve_speed.py at 16 slots: with the standard library's listen queue of 5, 16 streams sent at
    once had one or two reset by the kernel (ConnectionResetError), and others waited a second for their
    connection to be made again."""
    answers: list[tuple[bytes, float]] = []
    with answering(tiny_model) as url:
        gate = threading.Barrier(64)

        def one_client() -> None:
            gate.wait()
            started = time.monotonic()
            try:
                with connect(url) as connection:
                    connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    answers.append((connection.recv(4096)[:12], time.monotonic() - started))
            except OSError as error:
                answers.append((repr(error).encode(), time.monotonic() - started))

        clients = [threading.Thread(target=one_client) for _ in range(64)]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
    assert [answer for answer, _ in answers] == [b"HTTP/1.1 200"] * 64
    assert max(took for _, took in answers) < 0.9, "a dropped handshake is sent again after a second"


def test_a_whole_reply_whose_client_leaves_frees_its_place_within_a_second(tiny_model):
    """Issue 48: a non-streamed client that left kept its slot until its reply ended: the gone-check ran only when
    a drain came back empty, and a whole reply writes nothing until it is done. The tiny model writes a token a
    millisecond once under way, so no drain is empty: `--parallel 1`, and a reply of 4,000 tokens left at 500."""
    from tui_chat.engine.local.llama import LlamaBackend
    from tui_chat.engine.local.settings import LlamaSettings

    with served(LlamaBackend(LlamaSettings(tiny_model, n_ctx=4096)), parallel=1) as (server, monitor, url), \
            answered(server):
        leaving = send_raw(url, "/v1/chat/completions", {"messages": PROMPT, "max_tokens": 4000})
        deadline = time.monotonic() + 30
        while not any(record.metrics and record.metrics.completion_tokens >= 500
                      for record in monitor.snapshot()[0]):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        leaving.close()
        reply = client(url).chat.completions.create(model="", messages=PROMPT, max_tokens=2)
        assert reply.model_extra["x_tui_chat"]["queued_s"] < 1.0, "the place of the client that left was free"


def test_a_stopped_engine_fails_its_requests_turns_health_to_error_and_the_next_request_answers(
        starter_model, tmp_path, monkeypatch):
    """Issue 48 item 5: with the engine process stopped (kill -STOP), `/health` said ok for 40 s and more and every
    client hung. The watchdog ends it; each request in flight fails in the server's words (not the chat's, no
    paths), `/health` says why until the server has the model loaded again, and the next request is answered."""
    monkeypatch.setattr("tui_chat.engine.process.SILENCE_LIMIT_S", 3.0)
    with over_an_engine_process(starter_model, tmp_path / "logs", parallel=2) as (engine, url):
        assert health(url) == (200, {"status": "ok", "in_flight": 0, "waiting": 0})
        chat = client(url)
        chunks = iter(chat.chat.completions.create(model="", messages=PROMPT, max_tokens=400, stream=True))
        next(chunks)
        stopped = engine.pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            asked = time.monotonic()
            with pytest.raises(openai.InternalServerError) as whole:  # the free second slot: it fails too
                chat.chat.completions.create(model="", messages=PROMPT, max_tokens=4)
            with pytest.raises(openai.APIError) as streamed:
                for _ in chunks:
                    pass
            assert time.monotonic() - asked < 10
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        said = "the model's engine stopped answering (not a word for 3 s: stopped or hung)"
        for message in (whole.value.body["message"], streamed.value.message):
            assert message.startswith(said) and message.endswith("it is being loaded again")
            assert "/" not in message and "chat" not in message, message
        status, down = health(url)
        assert status == 503 and down["status"] == "error" and down["error"].startswith(said), down
        back_without_a_request(url)
        again = chat.chat.completions.create(model="", messages=PROMPT, max_tokens=4, temperature=0)
        assert again.choices[0].message.content.strip()
        deadline = time.monotonic() + 10  # a handler lets its place go just after its client has the answer
        while (status := health(url)) != (200, {"status": "ok", "in_flight": 0, "waiting": 0}):
            assert time.monotonic() < deadline, status
            time.sleep(0.05)


def back_without_a_request(url: str) -> None:
    """The server starts its engine again by itself after a death: `/health` is ok again with no request sent (a
    load balancer that took it out of rotation would send none)."""
    deadline = time.monotonic() + 60
    while (status := health(url))[0] != 200:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def test_an_idle_engines_death_is_said_by_health_until_it_is_loaded_again(starter_model, tmp_path):
    """Issue 48 item 5: an engine that dies between requests (here a segfault) turns `/health` to error at once,
    until the server has started it again by itself."""
    with over_an_engine_process(starter_model, tmp_path / "logs") as (engine, url):
        os.kill(engine.pid, signal.SIGSEGV)
        deadline = time.monotonic() + 10
        while (down := health(url))[0] == 200:
            assert time.monotonic() < deadline, down
            time.sleep(0.05)
        assert down[1]["error"].startswith("the model's engine crashed with SIGSEGV") and "/" not in down[1]["error"]
        back_without_a_request(url)
        assert client(url).chat.completions.create(model="", messages=PROMPT, max_tokens=2).choices
        assert health(url)[0] == 200


def test_a_reasoning_models_thinking_comes_apart_whole_and_streamed(thinker_model):
    """The scripted Qwen3 thinker: `<think>Hmm, let me</think>Hello world`. The thinking is `reasoning_content`,
    the answer `content`; a thinking budget or the thinking switched off are the engine's, as in the chat."""
    with answering(thinker_model) as url:
        chat = client(url)
        whole = chat.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}])
        message = whole.choices[0].message
        assert (message.model_extra["reasoning_content"], message.content) == ("Hmm, let me", "Hello world ")
        assert whole.usage.completion_tokens_details.reasoning_tokens == 6
        thought, said = "", ""
        for chunk in chat.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}],
                                                  stream=True):
            delta = chunk.choices[0].delta
            thought += (delta.model_extra or {}).get("reasoning_content") or ""
            said += delta.content or ""
        assert (thought, said) == ("Hmm, let me", "Hello world ")
        budget = chat.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}],
                                              extra_body={"thinking_budget_tokens": 2}).choices[0].message
        assert (budget.model_extra["reasoning_content"], budget.content) == ("Hmm", "Hello world ")
        off = chat.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}], extra_body={
            "chat_template_kwargs": {"enable_thinking": False}}).choices[0].message
        assert not off.model_extra.get("reasoning_content") and off.content == "Hello world "


def test_a_model_with_a_tool_template_calls_in_its_own_form_and_reads_the_result_back(thinker_model):
    """Qwen3's template takes the tools and renders the call and its result; the call comes back as tool_calls."""
    with answering(thinker_model) as url:
        chat = client(url)
        asked = [{"role": "user", "content": "Weather in Paris?"}]
        cut = chat.chat.completions.create(model="", messages=asked, tools=[CITY], tool_choice="required",
                                           max_tokens=64).choices[0]
        [partial] = cut.message.tool_calls
        assert cut.finish_reason == "length" and cut.message.content is None, "the call cut short, not text"
        written = partial.function.arguments  # as far as it got: a prefix of the arguments' JSON
        assert partial.function.name == "get_weather" and written.startswith('{"c'), written
        reply = chat.chat.completions.create(model="", messages=asked, tools=[CITY], tool_choice="required",
                                             max_tokens=120)
        [call] = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), CITY["function"]["parameters"])
        follow = [*asked, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        answer = chat.chat.completions.create(model="", messages=follow, tools=[CITY], max_tokens=20)
        assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content == "Hello world "


async def test_the_live_view_shows_each_request_with_the_panels_figures(tiny_model):
    """The Textual view over a real server (the engine in this process): a request's row and the totals."""
    from textual.widgets import DataTable, Static

    from tui_chat.ui.serve import ServeApp

    with in_process(tiny_model) as (server, monitor, url):
        app = ServeApp(server, monitor, url)
        async with app.run_test(size=(140, 20)) as pilot:
            answered: list[int] = []
            asking = threading.Thread(target=lambda: answered.append(post(f"{url}/chat/completions", json.dumps(
                {"messages": PROMPT, "max_tokens": 5}).encode())[0]))
            asking.start()
            table = app.query_one(DataTable)
            for _ in range(200):
                await pilot.pause(0.05)
                if table.row_count and str(table.get_row_at(0)[3]) == "length":
                    break
            row = [str(cell) for cell in table.get_row_at(0)]
            assert row[:4] == ["1", "127.0.0.1", "chat", "length"] and row[6] == "5", row
            assert row[10].endswith("/1,024")
            assert str(app.query_one("#totals", Static).render()).startswith("1 request (0 refused, 0 failed)")
            await pilot.press("q")
        asking.join(10)
        assert answered == [200]


@pytest.mark.parametrize("size", [(120, 20), (80, 24)])
def test_the_live_views_look(snap_compare, tiny_model, size):
    """Three requests as the view shows them: one ended, one being written, one waiting for a place."""
    from scripted import METRICS
    from tui_chat.engine.base import ModelInfo
    from tui_chat.engine.local.llama import LlamaBackend
    from tui_chat.engine.local.settings import LlamaSettings
    from tui_chat.engine.params import SamplingParams
    from tui_chat.pricing import PRESETS
    from tui_chat.serve.monitor import Monitor
    from tui_chat.serve.server import ServeOptions, TuiChatServer
    from tui_chat.ui.serve import ServeApp

    info = ModelInfo("gemma-3-270m-q4_k_m", "/models/gemma.gguf", "", "Q4_K_M", 0, 0, 18, 0, 4096, 32768, "plain",
                     cpu="AVX2")
    monitor = Monitor(next(iter(PRESETS.values())))
    ended, running, _ = (monitor.new_record(number, "127.0.0.1", "chat", number != 2) for number in (1, 2, 3))
    for record in (ended, running):
        record.admitted()
        record.metrics = METRICS
    monitor.finish(ended, "eos")
    backend = LlamaBackend(LlamaSettings(tiny_model, n_ctx=1024))
    server = TuiChatServer(ServeOptions(port=0, parallel=2), backend, info, SamplingParams(), monitor)
    try:
        assert snap_compare(ServeApp(server, monitor, "http://127.0.0.1:8080/v1"), terminal_size=size)
    finally:
        server.server_close()
        backend.close()
