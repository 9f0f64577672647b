"""The sampling lab on a server: a request per column, all at once, each column's events routed to it.

Against the fake OpenAI server (threaded, so two paced streams interleave: the columns ran in parallel) and a
real `llama_cpp.server` on loopback, which runs one request at a time: by default it cuts the reply streaming
when another request arrives, and with `--interrupt_requests False` it queues them. The lab says which.
"""

import json

import pytest
from textual.widgets import Static

from conftest import GREEDY, collect, run_cli
from fake_openai import PACED, fake_server
from llama_server import llama_cpp_server
from test_lab_ui import WIDE, lab_ended
from test_remote import connect
from test_ui import chat, loaded, screen_open
from tui_chat.config import Config
from tui_chat.engine.base import LabDone, Message, Request
from tui_chat.engine.openai import OpenAIBackend, RemoteSettings
from tui_chat.engine.params import LiveParams
from tui_chat.lab import Column, Lab
from tui_chat.ui.app import ChatApp
from tui_chat.ui.screens.lab import LabScreen

PROMPT = "Hello, what is the capital of France?"


def run_lab(backend, *settings: str, base=GREEDY) -> Lab:
    lab = Lab([Column.parsed(text, base) for text in settings])
    stream = backend.compare(lab.request([Message("user", PROMPT)]), [column.live for column in lab.columns])
    for event in stream:
        lab.take([event])
    return lab


@pytest.fixture(scope="module")
def queueing_server(tiny_model, tmp_path_factory):
    """A real llama_cpp.server that queues a second request instead of cutting the first."""
    log = tmp_path_factory.mktemp("server") / "queueing.log"
    with llama_cpp_server(tiny_model, "tiny", 1024, log, interrupting=False) as url:
        yield url


def test_columns_stream_in_parallel_each_with_its_settings_and_figures():
    with fake_server() as server:
        backend = connect(server.base_url, "stopping")
        lab = run_lab(backend, "temperature=0,seed=3,max_tokens=20", "temperature=1.0,top_p=0.9,seed=7,stop=User")
        backend.close()
    ended = lab.ended
    assert isinstance(ended, LabDone) and ended.parallel and ended.note == ""
    sent = sorted(server.requests, key=lambda body: body["temperature"])
    assert [(body["temperature"], body["seed"], body["max_tokens"], body.get("stop")) for body in sent] == [
        (0.0, 3, 20, None), (1.0, 7, GREEDY.max_tokens, ["User"])]
    assert all(body["logprobs"] for body in sent)  # the lab reads each token's probability
    first, second = lab.columns
    assert first.text == "".join(PACED) and first.done.stop_reason == "length"
    assert second.text == "Paris is the capital of France.\n" and second.done.stop_reason == "stop"
    assert all(token.prob is not None for column in lab.columns for token in column.tokens)
    assert lab.divergence(1) is None  # the same tokens as long as both went on
    assert first.done.metrics.completion_tokens == len(PACED) and first.done.metrics.decode_tok_s
    # the fake's cache is the previous request's prompt: one of the two read it, the other found it cached
    assert ended.prompt_reads == 1


def test_a_server_that_ends_the_columns_unasked_cuts_them_and_says_so():
    with fake_server() as server:
        backend = connect(server.base_url, "interrupted")
        lab = run_lab(backend, "temperature=0", "temperature=1.0")
        backend.close()
    assert [column.done.stop_reason for column in lab.columns] == ["cut", "cut"]
    assert lab.ended.note == "the server cut columns 1, 2 short" and not lab.ended.parallel


def test_a_failing_column_fails_the_lab_in_one_line():
    with fake_server() as server:
        backend = connect(server.base_url, "server-error")
        lab = run_lab(backend, "temperature=0", "temperature=1.0")
        backend.close()
    assert lab.ended.message == f"the server at 127.0.0.1:{server.server_port} answered 500: CUDA error: out of memory"


def test_llama_cpp_server_cuts_a_column_short_when_the_next_arrives(tiny_server):
    backend = connect(tiny_server, "tiny")
    lab = run_lab(backend, "temperature=0", "temperature=0", "temperature=0")
    backend.close()
    reasons = [column.done.stop_reason for column in lab.columns]
    assert reasons.count("cut") >= 1 and not lab.ended.parallel
    cut = ", ".join(str(index + 1) for index, reason in enumerate(reasons) if reason == "cut")
    assert lab.ended.note.startswith("the server ") and lab.ended.note.endswith(f"{cut} short")


def test_llama_cpp_server_queueing_runs_the_columns_one_after_another(queueing_server):
    backend = connect(queueing_server, "tiny")
    single, done = collect(backend.generate(Request([Message("user", PROMPT)], LiveParams(GREEDY))))
    lab = run_lab(backend, "temperature=0", "temperature=0,max_tokens=4")
    backend.close()
    assert lab.ended.note == "the server ran the columns one after another" and not lab.ended.parallel
    first, second = lab.columns
    assert first.text == done.text and first.done.stop_reason == done.stop_reason
    assert second.done.stop_reason == "length" and second.done.metrics.completion_tokens == 4
    assert first.text.startswith(second.text)
    assert lab.ended.prompt_reads is None  # llama-cpp-python's server does not say what it cached


def test_run_compare_on_a_server_says_it_ran_the_columns_one_after_another(queueing_server):
    result = run_cli("run", "--base-url", queueing_server, "--model", "tiny", "-p", PROMPT, "--max-tokens", "6",
                     "--compare", "temperature=0", "--compare", "temperature=1.0,seed=7", "--json")
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    assert turn["parallel"] is False and turn["note"] == "the server ran the columns one after another"
    assert turn["prompt_reads"] is None and [column["completion_tokens"] for column in turn["columns"]] == [6, 6]
    text = run_cli("run", "--base-url", queueing_server, "--model", "tiny", "-p", PROMPT, "--max-tokens", "4",
                   "--compare", "temperature=0", "--compare", "temperature=0")
    assert text.returncode == 0 and text.stdout.endswith("\nthe server ran the columns one after another\n")


async def test_the_lab_screen_on_a_server_says_it_ran_the_columns_one_after_another(queueing_server):
    app = ChatApp(Config(sampling=GREEDY), lambda _name: OpenAIBackend(RemoteSettings(queueing_server, "tiny")), "tiny")
    async with app.run_test(size=WIDE) as pilot:
        await loaded(pilot)
        await chat(pilot, "Hello there")
        await pilot.press("f10")
        lab = await screen_open(pilot, LabScreen)
        await pilot.press("ctrl+r")
        await lab_ended(pilot, lab)
        status = str(lab.query_one("#lab-status", Static).render())
        assert status.startswith("The server ran the columns one after another · Prompt: ")
        assert "the server did not say how often it read it for 2 columns" in status
        assert "a step of the columns took" not in status
        assert all(column.done.stop_reason == "length" for column in lab.lab.columns)
