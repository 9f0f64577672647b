"""`serve`'s reading of OpenAI requests: each field checked, a bad one named as OpenAI names it; nothing in a
request can name a file."""

from __future__ import annotations

import pytest

from tui_chat.engine.base import ModelInfo
from tui_chat.engine.params import SamplingParams
from tui_chat.serve.protocol import BadRequest, parse_body, parse_chat, parse_completion

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
    ({"temperature": 9}, "temperature"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 4096}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"), ({"n": 2}, "n"), ({"stop": [1]}, "stop"), ({"stream": "yes"}, "stream"),
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
