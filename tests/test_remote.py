"""The OpenAI-compatible backend against real servers on 127.0.0.1.

A real `llama_cpp.server` (tiny and starter models) for what such a server really sends, and the
misbehaving server in fake_openai.py for llama-server's usage/timings format and for every fault.
"""

import json
import logging
import math
import time

import pytest

from conftest import GREEDY, ask, collect, run_cli
from fake_openai import PACED, PACED_TOKEN_S, REPLY, SLOW_TOKEN_S, fake_server, prompt_words
from llama_server import free_port
from tui_chat.config import ConfigError, load_config
from tui_chat.engine.base import Done, Error, Loaded, Message, Request
from tui_chat.engine.openai import MalformedEvent, OpenAIBackend, RemoteSettings, parse_chunk
from tui_chat.engine.openai.backend import CHARS_PER_TOKEN
from tui_chat.engine.openai.sse import SseDecoder
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.engine.server_params import ignored_settings
from tui_chat.wording import reply_footer

PROMPT = "Hello, what is the capital of France?"
KEY = "sk-test-7f3a9c1e55d2"


def connect(base_url: str, model: str | None = None, **settings) -> OpenAIBackend:
    backend = OpenAIBackend(RemoteSettings(base_url, model, **settings))
    loaded = backend.load().result()
    assert isinstance(loaded, Loaded), loaded
    return backend


def reply(backend, messages, params: SamplingParams = GREEDY, **request):
    if isinstance(messages, str):
        messages = [Message("user", messages)]
    return collect(backend.generate(Request(messages, LiveParams(params), **request)))


@pytest.fixture(scope="module")
def tiny_remote(tiny_server):
    backend = connect(tiny_server, "tiny")
    yield backend
    backend.close()


# --- against a real llama_cpp.server ---------------------------------------------------------


def test_server_is_described_as_remote(tiny_remote, tiny_server):
    info = tiny_remote.info
    assert info.backend == "openai" and info.name == "tiny"
    assert info.path == tiny_server and info.remote_host == tiny_server.split("/")[2]
    assert info.offload == f"server {info.remote_host}"
    assert not info.params_per_token and info.ignored_formats == ()
    assert set(info.ignored_params) == {"typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold",
                                        "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                                        "sampler_order", "thinking_budget"}
    assert info.description.startswith("llama-cpp-python server")


def test_the_model_info_says_what_the_server_is_not_sent_and_reads_otherwise(tiny_remote):
    assert tiny_remote.info.server_facts == (
        "Not sent: Typical-p, Top-nσ, XTC probability, XTC threshold, DRY multiplier, DRY base, DRY allowed len, "
        "DRY last n, Sampler order, Think budget",
        "Logit bias: the bias goes to every token of the text as the server tokenizes it, not only the first")


def test_run_names_the_settings_in_use_the_server_is_not_sent(tiny_server):
    result = run_cli("run", "--base-url", tiny_server, "--model", "tiny", "-p", "Hi", "--max-tokens", "4",
                     "--xtc-probability", "0.5", "--top-k", "5", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("tui-chat: note: not sent to this server, which takes no such setting: "
                             "XTC probability, XTC threshold\n")
    report = json.loads(result.stdout)
    assert "xtc_probability" in report["ignored_params"] and "top_k" not in report["ignored_params"]
    assert report["ignored_formats"] == [] and report["server_notes"] == [
        "logit bias: the bias goes to every token of the text as the server tokenizes it, not only the first"]


def test_greedy_reply_streams_token_by_token_and_repeats(tiny_remote):
    tokens, first = reply(tiny_remote, PROMPT)
    _, again = reply(tiny_remote, PROMPT)
    assert isinstance(first, Done) and first.stop_reason == "length"
    assert first.text == again.text == "".join(t.text for t in tokens)
    assert len(tokens) == first.metrics.completion_tokens == 32


def test_sampling_settings_reach_the_server(tiny_remote):
    sampled = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24)
    one = reply(tiny_remote, PROMPT, sampled.with_changes(seed=7))[1]
    two = reply(tiny_remote, PROMPT, sampled.with_changes(seed=7))[1]
    three = reply(tiny_remote, PROMPT, sampled.with_changes(seed=8))[1]
    assert one.text == two.text != three.text
    short = reply(tiny_remote, PROMPT, GREEDY.with_changes(max_tokens=5))[1]
    assert short.stop_reason == "length" and short.metrics.completion_tokens == 5
    full = reply(tiny_remote, PROMPT)[1].text
    stop = full.split()[3]
    cut = reply(tiny_remote, PROMPT, GREEDY.with_changes(stop=[stop]))[1]
    assert cut.stop_reason == "stop" and cut.text == full[: full.index(stop)]


def test_token_probabilities_from_logprobs(tiny_remote):
    tokens, done = reply(tiny_remote, PROMPT, top_logprobs=3)
    assert len(tokens) == done.metrics.completion_tokens
    for token in tokens:
        probs = [c.prob for c in token.top]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001
        assert token.piece == token.top[0].text and token.prob == pytest.approx(probs[0])
    assert "".join(t.piece for t in tokens) == done.text


def test_metrics_this_server_gives(tiny_remote, tiny):
    """llama_cpp.server sends no usage while streaming: the prompt is counted with its tokenizer once the
    reply is over (the messages without the template's own tokens: an estimate, marked so), the cache is
    unknown; the client's own clock still gives TTFT and the decode rate, near the in-process engine's."""
    remote = reply(tiny_remote, PROMPT, GREEDY.with_changes(max_tokens=200))[1].metrics
    local = ask(tiny, PROMPT, GREEDY.with_changes(max_tokens=200)).metrics
    assert remote.completion_tokens == local.completion_tokens == 200
    assert remote.prompt_tokens == tiny.count_tokens(PROMPT) < local.prompt_tokens and remote.prompt_estimated
    assert remote.cached_tokens == 0 and not local.prompt_estimated
    assert 0 < remote.ttft_s < 5
    assert remote.decode_tok_s > 0 and remote.server_decode_tok_s is None


def test_count_tokens_asks_the_server_and_matches_the_local_tokenizer(tiny_remote, tiny):
    for text in ("Hello world", "", "Paris is the capital of France, is it not?"):
        assert tiny_remote.count_tokens(text) == tiny.count_tokens(text)


def test_run_command_against_the_server(tiny_server):
    common = ("run", "--backend", "openai", "--base-url", tiny_server, "--model", "tiny",
              "-p", "Hello there", "-p", "And then?", "--temperature", "0", "--max-tokens", "12")
    report = run_cli(*common, "--json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["backend"] == "openai" and data["model"] == "tiny" and data["model_path"] == tiny_server
    assert [t["completion_tokens"] for t in data["turns"]] == [12, 12]
    streamed = run_cli(*common)
    assert streamed.returncode == 0 and streamed.stderr == ""
    assert streamed.stdout == "\n\n".join(t["text"].strip() for t in data["turns"]) + "\n"


@pytest.mark.starter
def test_starter_metrics_agree_with_the_in_process_engine(starter_server, starter):
    """Same model, same machine: decode rates and TTFT of the same order of magnitude."""
    remote = connect(starter_server)
    try:
        params = GREEDY.with_changes(max_tokens=48, stop=[])
        question = [Message("user", "Tell me about the history of Berlin.")]
        reply(remote, question, params.with_changes(max_tokens=2))  # the server's first request pays its warm-up
        over_http = reply(remote, question, params)[1].metrics
        in_process = ask(starter, question, params).metrics
    finally:
        remote.close()
    assert over_http.completion_tokens > 10 and in_process.completion_tokens > 10
    assert 0.1 < over_http.decode_tok_s / in_process.decode_tok_s < 10
    assert over_http.ttft_s < 10 * in_process.ttft_s + 0.5


@pytest.mark.starter
def test_a_reply_ending_on_a_stop_string_from_llama_cpp_server_is_timed_over_what_came(starter_server):
    """llama-cpp-python's server sends no usage while streaming: what came is what is counted and timed."""
    remote = connect(starter_server)
    try:
        question = [Message("user", "Tell me about the history of Berlin.")]
        _, whole = reply(remote, question, GREEDY.with_changes(max_tokens=40, stop=[]))
        stop = whole.text[len(whole.text) // 2 :][:6]
        tokens, done = reply(remote, question, GREEDY.with_changes(max_tokens=40, stop=[stop]))
    finally:
        remote.close()
    m = done.metrics
    assert done.stop_reason == "stop" and stop not in done.text and m.withheld_tokens == 0
    assert m.completion_tokens == len(tokens) > 2
    assert m.decode_tok_s == pytest.approx((len(tokens) - 1) / m.decode_s)


@pytest.mark.starter
@pytest.mark.parametrize("chat_format", [None, "snoozy"])
def test_an_empty_first_reply_from_a_server_says_to_check_its_chat_format(starter_model, tmp_path, chat_format):
    """llama-cpp-python's server renders a model without a chat template in llama-2's format, which the
    starter answers with nothing (issue 25, item 11): the first empty reply says what to check; the chat
    format README gives for a base model answers."""
    from llama_server import llama_cpp_server

    with llama_cpp_server(starter_model, "starter", 1024, tmp_path / "server.log", chat_format=chat_format) as url:
        result = run_cli("run", "--base-url", url, "-p", "What is the capital of France?", "-p", "And of Italy?",
                         "--temperature", "0", "--max-tokens", "24", "--json")
    assert result.returncode == 0, result.stderr
    texts = [turn["text"] for turn in json.loads(result.stdout)["turns"]]
    hints = result.stderr.count("--chat_format snoozy")
    if chat_format is None:
        assert texts == ["", ""] and hints == 1, result.stderr
        assert "the server wrote nothing" in result.stderr and "A base model behind a server" in result.stderr
    else:
        assert all(text.strip() for text in texts) and hints == 0, result.stderr


# --- llama-server's usage and timings (fake_openai "words") ------------------------------------


def test_usage_and_timings_fill_the_metrics_and_turn_two_reports_reuse(fake):
    backend = connect(fake.base_url, "words")
    try:
        assert backend.info.n_ctx == 4096 and backend.info.description.startswith("llama.cpp server")
        assert backend.count_tokens("one two three") == 3
        question = [Message("user", "What is the capital of France?")]
        tokens, first = reply(backend, question)
        conversation = [*question, Message("assistant", first.text),
                        Message("user", "And what are the capitals of Germany, Italy and Spain?")]
        _, second = reply(backend, conversation)
    finally:
        backend.close()
    turn_one = prompt_words([{"role": "user", "content": "What is the capital of France?"}])
    assert first.text == REPLY and len(tokens) == first.metrics.completion_tokens == len(REPLY.split())
    m = first.metrics
    assert (m.prompt_tokens, m.cached_tokens, m.prefill_s, m.server_decode_tok_s) == (len(turn_one), 0, 0.0125, 250.0)
    assert m.context_tokens == m.prompt_tokens + m.completion_tokens and m.n_ctx == 4096
    reused = second.metrics.cached_tokens
    assert reused == len(turn_one) + len(REPLY.split()) and second.metrics.prompt_tokens > reused
    assert second.metrics.prefill_tok_s == pytest.approx((second.metrics.prompt_tokens - reused) / 0.0125)


def test_a_reply_that_ends_on_a_stop_string_is_timed_over_the_tokens_that_came(fake):
    """llama-server counts a stop string's tokens in its usage but never sends them: the decode rate is
    counted over the tokens the client timed, and the reply says how many the server withheld (issue 25,
    item 7: the rate came out 1.4 x the server's own)."""
    backend = connect(fake.base_url, "stopping")
    try:
        tokens, done = reply(backend, PROMPT, GREEDY.with_changes(stop=["\nUser:"]))
    finally:
        backend.close()
    m = done.metrics
    assert done.stop_reason == "stop" and done.text == "".join(PACED[:7])
    assert (len(tokens), m.completion_tokens, m.withheld_tokens) == (7, 10, 3)
    assert m.server_decode_tok_s == pytest.approx(1 / PACED_TOKEN_S)
    assert abs(m.decode_tok_s / m.server_decode_tok_s - 1) < 1 / 3, (m.decode_tok_s, m.server_decode_tok_s)
    assert "3 withheld by the server (the stop sequence)" in reply_footer(done.stop_reason, m.as_dict())


def test_request_carries_the_settings_read_at_its_start(fake):
    backend = connect(fake.base_url, "slow")
    live = LiveParams(SamplingParams(temperature=0.3, top_p=0.8, top_k=12, min_p=0.2, repeat_penalty=1.3,
                                     seed=5, max_tokens=4, stop=("France",)))
    try:
        stream = backend.generate(Request([Message("user", "hi")], live, top_logprobs=2))
        tokens = []
        while len(tokens) < 4:
            tokens += [e for e in stream.drain(timeout=5) if hasattr(e, "token_id")]
            if len(tokens) == 1:
                live.update(temperature=1.5)
        stream.cancel()
        stream.result()
    finally:
        backend.close()
    assert {t.params_version for t in tokens} == {0}, "a stream in flight keeps the settings it started with"
    expected = {"temperature": 0.3, "top_p": 0.8, "top_k": 12, "min_p": 0.2, "repeat_penalty": 1.3, "seed": 5,
                "max_tokens": 4, "stop": ["France"], "stream": True, "stream_options": {"include_usage": True},
                "logprobs": True, "top_logprobs": 2}
    assert {key: fake.requests[-1][key] for key in expected} == expected


def test_plain_openai_server_gets_only_openai_fields(monkeypatch):
    with fake_server(family="openai") as server:
        backend = connect(server.base_url, "words")
        try:
            info = backend.info
            assert info.ignored_params == ignored_settings("OpenAI-compatible server")
            assert {"top_k", "min_p", "repeat_penalty", "typical_p"} <= set(info.ignored_params)
            assert "estimated" in info.description
            assert backend.count_tokens("x" * 10) == math.ceil(10 / CHARS_PER_TOKEN)
            done = reply(backend, "hi")[1]
        finally:
            backend.close()
    assert not {"top_k", "min_p", "repeat_penalty"} & set(server.requests[-1])
    assert done.metrics.prompt_tokens == len(prompt_words([{"role": "user", "content": "hi"}]))
    assert done.metrics.cached_tokens == 0 and done.metrics.server_decode_tok_s is None
    assert not done.metrics.prompt_estimated


# --- faults ------------------------------------------------------------------------------------


def test_cancel_cuts_a_slow_stream_at_once_and_keeps_the_partial_reply(fake):
    backend = connect(fake.base_url, "slow")
    try:
        stream = backend.generate(Request([Message("user", "hi")], LiveParams(GREEDY.with_changes(max_tokens=1000))))
        seen = []
        while len(seen) < 3:
            seen += [e for e in stream.drain(timeout=5) if hasattr(e, "token_id")]
        started = time.perf_counter()
        stream.cancel()
        done = stream.result()
        waited = time.perf_counter() - started
    finally:
        backend.close()
    assert waited < min(0.5, SLOW_TOKEN_S)
    assert isinstance(done, Done) and done.stop_reason == "cancelled"
    assert done.text.startswith(" word0 word1 word2") and done.metrics.completion_tokens >= 3


def test_cancel_before_the_server_answers(fake):
    backend = connect(fake.base_url, "hang")
    try:
        stream = backend.generate(Request([Message("user", "hi")], LiveParams(GREEDY)))
        time.sleep(0.3)
        started = time.perf_counter()
        stream.cancel()
        done = stream.result()
        assert time.perf_counter() - started < 0.5
    finally:
        backend.close()
    assert isinstance(done, Done) and done.stop_reason == "cancelled" and done.text == ""


@pytest.mark.parametrize(
    ("model", "message", "partial"),
    [
        ("cut", "closed the stream mid-reply", "Paris is the"),
        ("cut-chunked", "broke off the reply: peer closed connection", "Paris"),
        ("malformed", 'sent a malformed event: {"choices": [{"delta": {"content": " the', "Paris is"),
        ("error-event", "the server stopped the reply: the slot was cancelled by the server", "Paris"),
        ("server-error", "answered 500: CUDA error: out of memory", ""),
        ("hang", "did not answer in time (ReadTimeout)", ""),
    ],
)
def test_a_broken_reply_is_one_clear_line_keeps_its_text_and_the_backend_lives(fake, model, message, partial):
    backend = connect(fake.base_url, model, read_timeout_s=0.5)
    try:
        _, final = reply(backend, "hi")
        assert isinstance(final, Error) and message in final.message and "\n" not in final.message
        assert final.text == partial
        backend.settings = RemoteSettings(fake.base_url, "words")
        assert reply(backend, "hi")[1].text == REPLY
    finally:
        backend.close()


def test_a_reply_ended_without_done_marker_is_complete(fake):
    backend = connect(fake.base_url, "silent-end")
    try:
        done = reply(backend, "hi")[1]
    finally:
        backend.close()
    assert isinstance(done, Done) and done.stop_reason == "eos" and done.text == "Paris is"


def test_model_gone_at_reply_time_is_a_404_message(fake):
    backend = connect(fake.base_url, "words")
    try:
        backend.settings = RemoteSettings(fake.base_url, "retired")
        final = reply(backend, "hi")[1]
    finally:
        backend.close()
    assert final.message.startswith("model 'retired' not found at 127.0.0.1:")
    assert "(404: The model `retired` does not exist.)" in final.message


@pytest.mark.parametrize(
    ("base_url", "model", "message"),
    [
        (f"http://127.0.0.1:{free_port()}/v1", None, "cannot connect to 127.0.0.1:"),
        ("FAKE/v1", "llama-9000", "model 'llama-9000' is not served at 127.0.0.1:"),
        ("FAKE", None, "has no /models (404"),
        ("http://user:pw-secret@FAKEHOST", None, "is the base URL http://127.0.0.1:"),
    ],
)
def test_load_failures_are_clear(fake, base_url, model, message):
    host = fake.base_url.split("/")[2]
    base_url = base_url.replace("FAKEHOST", host).replace("FAKE", f"http://{host}")
    backend = OpenAIBackend(RemoteSettings(base_url, model))
    try:
        result = backend.load().result()
    finally:
        backend.close()
    assert isinstance(result, Error) and message in result.message and "\n" not in result.message
    assert "secret" not in result.message


def test_the_api_key_is_sent_but_never_shown(caplog):
    caplog.set_level(logging.DEBUG)
    with fake_server(api_key=KEY) as server:
        refused = OpenAIBackend(RemoteSettings(server.base_url, "words", api_key="sk-wrong-key-0042"))
        missing = OpenAIBackend(RemoteSettings(server.base_url, "words"))
        try:
            wrong, none = refused.load().result(), missing.load().result()
        finally:
            refused.close()
            missing.close()
        backend = connect(server.base_url, "words", api_key=KEY)
        try:
            done = reply(backend, "hi")[1]
        finally:
            backend.close()
    assert done.text == REPLY
    assert "refused the request (401: invalid api key '[api key]')" in wrong.message
    assert "sk-wrong-key-0042" not in wrong.message and "check the API key" in none.message
    assert KEY not in caplog.text and "sk-wrong-key-0042" not in caplog.text
    assert KEY not in repr(backend.settings)


def test_a_bad_base_url_is_refused_at_once():
    with pytest.raises(Exception, match="must start with http:// or https://"):
        OpenAIBackend(RemoteSettings("ftp://example.org/v1"))


# --- the stream parser -------------------------------------------------------------------------


def test_sse_decoder_joins_data_lines_and_skips_comments():
    decoder = SseDecoder()
    lines = [": ping", "event: message", "data: {\"a\":", "data:1}", "id: 7", "", "", "data: [DONE]"]
    events = [data for line in lines if (data := decoder.feed(line)) is not None]
    assert events == ['{"a":\n1}']
    assert decoder.flush() == "[DONE]" and decoder.flush() is None


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", '"text"', '{"choices": 3}',
                                  '{"choices": [{"delta": {"content": 5}}]}'])
def test_parse_chunk_refuses_what_is_not_a_chunk(data):
    with pytest.raises(MalformedEvent):
        parse_chunk(data)


def test_parse_chunk_tolerates_odd_but_valid_chunks():
    assert parse_chunk('{"choices": []}').content == ""
    odd = parse_chunk('{"choices": [{"delta": {"content": "x"}, "logprobs": {"content": '
                      '[{"token": "x", "logprob": "high", "top_logprobs": [7, {"token": "x", "logprob": 3}]}]}}]}')
    assert odd.content == "x" and odd.tokens[0].prob == 0.0 and odd.tokens[0].top[0].prob == 1.0
    assert parse_chunk('{"error": {"message": "overloaded"}}').error == "overloaded"
    assert parse_chunk('{"error": {"message": "\\u001b]52;c;aGk=\\u0007 gone"}}').error == "\\x1b]52;c;aGk=\\x07 gone"
    odd_top = parse_chunk('{"choices": [{"delta": {}, "logprobs": {"content": [{"top_logprobs": 5}]}}]}')
    assert odd_top.tokens[0].top == ()


# --- config and command line -------------------------------------------------------------------


def write_config(isolated_dirs, text: str):
    path = isolated_dirs / "config" / "tui-chat" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_remote_profiles_are_read(isolated_dirs, monkeypatch):
    path = write_config(isolated_dirs, '[remotes.lab]\nbase_url = "http://gpu:8080/v1"\nmodel = "qwen"\n'
                                       'api_key_env = "LAB_KEY"\ntimeout_s = 30\n')
    lab = load_config(path).remotes["lab"]
    assert (lab.base_url, lab.model, lab.timeout_s) == ("http://gpu:8080/v1", "qwen", 30.0)
    with pytest.raises(ConfigError,
                       match=r"the API key variable LAB_KEY \(api_key_env of \[remotes.lab\]\) is not set"):
        lab.resolved_api_key()
    monkeypatch.setenv("LAB_KEY", KEY)
    assert lab.resolved_api_key() == KEY


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("remotes = 3", r"\[remotes\] must hold tables"),
        ("[remotes.lab]\nmodel = 'x'", r"\[remotes.lab\]: base_url must be an http:// or https:// URL"),
        ("[remotes.lab]\nbase_url = 'http://h/v1'\napi_key = 'a'\napi_key_env = 'B'", "not both"),
        ("[remotes.lab]\nbase_url = 'http://h/v1'\nport = 1", r"unknown setting 'port'"),
        ("[remotes.lab]\nbase_url = 'http://h/v1'\ntimeout_s = -1", "timeout_s must be a number of seconds"),
    ],
)
def test_bad_remote_profiles_are_one_clear_line(isolated_dirs, text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(write_config(isolated_dirs, text))
    assert "\n" not in str(caught.value)


def test_run_with_a_profile_and_its_key(isolated_dirs, monkeypatch):
    with fake_server(api_key=KEY) as server:
        write_config(isolated_dirs, f'[remotes.lab]\nbase_url = "{server.base_url}"\nmodel = "words"\n'
                                    'api_key_env = "LAB_KEY"\n')
        unset = run_cli("run", "--remote", "lab", "-p", "hi")
        monkeypatch.setenv("LAB_KEY", KEY)
        answered = run_cli("run", "--remote", "lab", "-p", "hi")
    assert unset.returncode == 2 and unset.stderr == (
        "tui-chat: error: the API key variable LAB_KEY (api_key_env of [remotes.lab]) is not set\n")
    assert answered.returncode == 0 and answered.stdout == REPLY + "\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "openai"], "--backend openai needs --base-url URL or --remote PROFILE"),
        (["--backend", "local", "--base-url", "http://h/v1"], "--base-url needs --backend openai"),
        (["--remote", "lab"], "unknown remote 'lab' (configured: none"),
        (["--base-url", "http://h/v1", "--gpu-layers", "0"],
         "--gpu-layers is for local models: the server sets its own"),
        (["--base-url", "http://h/v1", "--threads", "2"], "--threads is for local models: the server sets its own"),
        (["--base-url", "http://h/v1", "--extra-buffers", "none", "--threads-batch", "2", "--n-ctx", "512"],
         "--n-ctx, --threads-batch and --extra-buffers are for local models: the server sets its own"),
        (["--model", "@lab", "--threads", "2"], "--threads is for local models: the server sets its own"),
    ],
)
def test_bad_remote_flags_are_one_line_and_exit_2(args, message):
    result = run_cli("run", "-p", "hi", *args)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1


def test_unreachable_server_from_the_command_line():
    result = run_cli("run", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "-p", "hi")
    assert result.returncode == 2 and "cannot connect to 127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_a_reply_cut_mid_stream_from_the_command_line(fake):
    result = run_cli("run", "--base-url", fake.base_url, "--model", "cut", "-p", "hi")
    assert result.returncode == 1 and result.stdout == "Paris is the\n"
    host = fake.base_url.split('/')[2]
    assert result.stderr == f"tui-chat: error: the server at {host} closed the stream mid-reply\n"


@pytest.mark.parametrize(("max_tokens", "records", "counted", "text"), [(9, 7, 9, "".join(PACED[:7])),
                                                                        (11, 8, 11, "".join(PACED))])
def test_tokens_llama_server_sends_no_record_of_are_counted_and_said(fake, max_tokens, records, counted, text):
    """Issue 38: a reply cut at its token limit came with 47 per-token entries for 48 counted tokens. llama-server
    holds back tokens that might begin a stop sequence: at max tokens it never sends them; cleared by the next
    token, it sends them merged into that token's chunk under one record. The count says why."""
    backend = connect(fake.base_url, "stopping")
    try:
        tokens, done = reply(backend, PROMPT, GREEDY.with_changes(stop=["\nUser: Hi"], max_tokens=max_tokens))
    finally:
        backend.close()
    m = done.metrics
    assert done.text == text and (len(tokens), m.completion_tokens, m.unrecorded_tokens) == (records, counted,
                                                                                              counted - records)
    assert m.withheld_tokens == 0 and f"{counted - records} with no record of their own" in reply_footer(
        done.stop_reason, m.as_dict())
