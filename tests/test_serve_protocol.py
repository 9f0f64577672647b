"""`serve`'s reading of OpenAI requests: each field checked, a bad one named as OpenAI names it; nothing in a
request can name a file."""

from __future__ import annotations

import pytest

from tui_chat.engine.base import EngineDeath, Error, ModelInfo, TurnMetrics
from tui_chat.engine.params import SamplingParams
from tui_chat.engine.process import death_cause, died, silenced
from tui_chat.serve.monitor import RequestRecord, Totals, prometheus_text, request_line
from tui_chat.serve.protocol import (
    BadRequest,
    client_words,
    engine_failure,
    parse_body,
    parse_chat,
    parse_completion,
)

INFO = ModelInfo("m", "/m.gguf", "", "Q4_K_M", 0, 0, 0, 0, 4096, 4096, "plain")
DEFAULTS = SamplingParams()
USER = [{"role": "user", "content": "hi"}]


def chat(**body):
    return parse_chat({"messages": USER} | body, DEFAULTS, INFO, 2048)


def refused(**body) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        chat(**body)
    return caught.value


def test_sampling_fields_and_defaults():
    asked = chat(temperature=0.2, top_k=5, min_p=0.1, repeat_penalty=1.3, seed=7, stop="END", max_tokens=9,
                 samplers=["top_k", "typ_p", "temperature"], mirostat=2, mirostat_tau=4.0,
                 logit_bias=[["Paris", False], ["London", 2]], thinking_budget_tokens=64)
    params = asked.request.params.snapshot()[1]
    assert (params.temperature, params.top_k, params.min_p, params.repeat_penalty, params.seed) == (0.2, 5, 0.1, 1.3, 7)
    assert params.stop == ("END",) and params.max_tokens == 9 and params.mirostat_tau == 4.0
    assert params.sampler_order == ("top_k", "typical_p", "temperature") and params.thinking_budget == 64
    assert params.logit_bias == (("Paris", float("-inf")), ("London", 2.0))
    left_out = chat().request.params.snapshot()[1]
    assert left_out.top_p == DEFAULTS.top_p and left_out.max_tokens == 2048, "the app's defaults, the whole room"


@pytest.mark.parametrize(("body", "param"), [
    ({"temperature": 9}, "temperature"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "8"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"), ({"n": 2}, "n"), ({"stop": [1]}, "stop"), ({"stream": "yes"}, "stream"),
    ({"temperature": "0.7"}, "temperature"), ({"seed": 2**70}, "seed"), ({"mirostat": 2, "mirostat_tau": "5"},
                                                                          "mirostat_tau"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"), ({"thinking_budget_tokens": "64"},
                                                                "thinking_budget_tokens"),
    ({"top_logprobs": 99}, "top_logprobs"), ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"logit_bias": [["Paris", 500]]}, "logit_bias"),
    ({"messages": []}, "messages"), ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "/etc/passwd"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"grammar": "/etc/passwd"}, "grammar"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"function": {"name": "g"}}},
     "tool_choice"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
])
def test_a_bad_field_is_named(body, param):
    error = refused(**body)
    assert error.status == 400 and error.body()["error"]["param"] == param and "\n" not in str(error)


def test_bad_json_and_a_body_that_is_not_an_object():
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_body(b"{")
    with pytest.raises(BadRequest, match="a JSON object"):
        parse_body(b"[1]")


def test_content_parts_developer_role_and_a_schema():
    asked = chat(messages=[{"role": "developer", "content": "Be brief."},
                           {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
    assert [(m.role, m.content) for m in asked.request.messages] == [("system", "Be brief."), ("user", "ab")]
    assert asked.request.format.kind == "json_schema"
    assert chat(response_format={"type": "json_object"}).request.format.kind == "json"


def test_tools_on_a_model_without_a_tool_template_go_in_the_system_prompt_and_its_grammar():
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    asked = chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "get_time"}},
                 messages=[*USER, {"role": "assistant", "tool_calls": [
                     {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                           {"role": "tool", "tool_call_id": "c1", "content": "noon"}])
    request = asked.request
    assert request.tool_choice == "get_time" and request.format.kind == "lark" and "get_time" in request.format.source
    assert request.messages[0].role == "system" and "get_time" in request.messages[0].content
    assert request.messages[2].content == '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert request.messages[3] .content == "<tool_response>\nnoon\n</tool_response>"


def test_a_plain_completion_reads_its_prompt_as_it_is():
    asked = parse_completion({"prompt": ["Once upon"], "max_tokens": 3, "logprobs": 2}, DEFAULTS, 2048)
    assert asked.request.text_prompt == "Once upon" and asked.request.top_logprobs == 2 and not asked.chat
    with pytest.raises(BadRequest) as caught:
        parse_completion({"prompt": ["a", "b"]}, DEFAULTS, 2048)
    assert caught.value.param == "prompt"


def completion_refused(**body) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        parse_completion({"prompt": "Once upon"} | body, DEFAULTS, 2048)
    return caught.value


def test_a_refused_value_is_written_as_it_was_sent():
    """Issue 48: `max_tokens: "8"` was refused as `(got 8)`, a seed as `(got 1.18059e+21)`."""
    assert 'got the string "8"' in str(refused(max_tokens="8"))
    assert 'got the string "0.7"' in str(refused(temperature="0.7"))
    seed = str(refused(seed=2**70))
    assert "between -1 and 4,294,967,294 (got 1,180,591,620,717,411,303,424)" in seed, seed


def test_max_tokens_beyond_the_slot_is_clamped_to_it_as_llama_server_does():
    """Issue 48: clients that send a large fixed max_tokens were refused; the reply now ends at the slot's end."""
    assert chat(max_tokens=10**6).request.params.snapshot()[1].max_tokens == 2048
    assert chat(max_tokens=100).request.params.snapshot()[1].max_tokens == 100
    both = chat(max_completion_tokens=None, max_tokens=5).request.params.snapshot()[1]
    assert both.max_tokens == 5, "an explicit null max_completion_tokens leaves max_tokens in charge"


@pytest.mark.parametrize(("body", "param"), [
    ({"echo": True, "logprobs": 1}, "echo"), ({"max_tokens": 0, "logprobs": 1}, "max_tokens"),
    ({"suffix": "The end."}, "suffix")])
def test_prompt_scoring_and_fill_in_the_middle_are_refused_not_ignored(body, param):
    """Issue 48: `echo` and `suffix` were silently ignored; scoring a prompt cannot be done here, and says so."""
    error = completion_refused(**body)
    assert error.status == 400 and error.param == param and error.code == "unsupported_parameter"
    assert "not supported" in str(error)


def test_an_engine_death_is_told_in_the_servers_words_without_paths(tmp_path):
    """Issue 48: after an engine death, clients read the chat's wording and the server's log path. The engine says
    facts (`Error.died`); the server words them."""
    log = tmp_path / "logs" / "stderr.log"
    log.parent.mkdir()
    log.write_text("GGML_ASSERT(n > 0) failed at /home/runner/llama.cpp/ggml/src/ggml.c:123\n")
    for cause, said in ((death_cause(-11, 1234, log), "the model's engine crashed with SIGSEGV"),
                        (silenced(), "the model's engine stopped answering (not a word for"),
                        (death_cause(-9, 1234, log), "the model's engine was killed (SIGKILL")):
        told = client_words(died(EngineDeath(cause, str(log))))
        assert told.startswith(said) and told.endswith("; it is being loaded again"), told
        assert "/" not in told and "chat" not in told and "stderr.log" not in told, told
    failure = engine_failure(died(EngineDeath(silenced(), str(log))), chat=True)
    assert failure.status == 500 and failure.kind == "server_error" and "/" not in str(failure)


def test_other_engine_errors_lose_their_folders():
    said = client_words(Error("internal error (OSError: cannot read /home/ann/.local/share/tui-chat/models/m.gguf)"))
    assert said == "internal error (OSError: cannot read m.gguf)"
    refusal = engine_failure(Error("the prompt takes 5,000 tokens", code="context_length_exceeded"), chat=False)
    assert (refusal.status, refusal.param, refusal.code) == (400, "prompt", "context_length_exceeded")


def test_a_short_prompts_reading_rate_is_in_the_no_ui_line():
    """Issue 48: `--no-ui` printed `read –` for a 3-token read while `timings.prompt_per_second` said 60."""
    record = RequestRecord(1, "127.0.0.1", "chat", False)
    record.metrics = TurnMetrics(prompt_tokens=40, cached_tokens=37, completion_tokens=5, prefill_s=0.05,
                                 decode_s=0.4, context_tokens=45, n_ctx=2048)
    assert " · read 60 tok/s · " in request_line(record)


def test_metrics_are_in_prometheus_text_format():
    totals = Totals(requests=3, refused=1, prompt_tokens=120, cached_tokens=40, completion_tokens=30,
                    decoded_tokens=28, decode_s=2.0)
    text = prometheus_text(totals, in_flight=2, waiting=1, engine_up=True)
    samples = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name, value = line.split(" ")
            samples[name] = float(value)
        else:
            assert line.split(" ")[1] in ("HELP", "TYPE") and line.split(" ")[2].startswith("tui_chat_")
    assert samples["tui_chat_requests_total"] == 3 and samples["tui_chat_prompt_tokens_total"] == 120
    assert samples["tui_chat_completion_tokens_total"] == 30 and samples["tui_chat_decode_tokens_per_second"] == 14
    assert samples["tui_chat_requests_in_flight"] == 2 and samples["tui_chat_requests_waiting"] == 1
    assert samples["tui_chat_engine_up"] == 1 and text.endswith("\n")
