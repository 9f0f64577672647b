"""`tui-chat serve`'s Anthropic Messages API as a client sees it: the official `anthropic` SDK (and raw HTTP where
the SDK would refuse to send the request) against the real command on the starter model, and in-process
servers on the tiny and the scripted thinking model where a test needs a key, a full queue or thinking."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from test_serve import answering, client, get, post, server, server_home  # noqa: F401 - fixtures used by name
from tui_chat.engine.base import ModelInfo
from tui_chat.engine.params import SamplingParams
from tui_chat.serve.anthropic import parse_messages
from tui_chat.serve.protocol import BadRequest

CONVERSATION = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Name a fruit and say why you like it."}]
SYSTEM = "You answer in one short sentence."
COUNT = [{"role": "user", "content": "Count from 1 to 100: 1, 2, 3,"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city now",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
GREEDY = {"temperature": 0}  # sampling fields are no longer the SDK's own arguments: sent as extra fields
INFO = ModelInfo("m", "/m.gguf", "", "Q4_K_M", 0, 0, 0, 0, 4096, 4096, "plain")  # no tool template: the generic form
DEFAULTS = SamplingParams()
EVENT_ORDER = ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
               "message_stop"]


def messages_client(url: str, **options) -> anthropic.Anthropic:
    """The SDK on a server's base URL (the SDK adds `/v1/messages`), no retries unless asked for."""
    options.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=options.pop("api_key", "none"), **options)


def refused_total(url: str) -> int:
    text = get(f"{url.removesuffix('/v1')}/metrics")[1]
    return int(dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))[
        "tui_chat_requests_refused_total"])


def streamed(stream_manager) -> tuple[list, anthropic.types.Message]:
    """A stream's events (text accumulated by the SDK) and its final message."""
    with stream_manager as stream:
        events = list(stream)
        return events, stream.get_final_message()


def order(events) -> list[str]:
    """The event types with each run of one type as one: the order Anthropic's stream follows."""
    kinds = [event.type for event in events if event.type in EVENT_ORDER]
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def test_a_message_is_the_chat_completions_reply_whole_streamed_and_with_a_system_list(server):  # noqa: F811
    """The same conversation at temperature 0: the same text as `/v1/chat/completions`, the same tokens counted."""
    # Asked twice: the second reads its prompt from the slot's cache as the message compared with it will (on
    # Intel CPUs a batch's rows and a one-token step sum in another order: a fresh read parts at near-ties).
    for _ in range(2):
        chat = client(server).chat.completions.create(
            model="", messages=[{"role": "system", "content": SYSTEM}, *CONVERSATION], max_tokens=24, temperature=0)
    messages = messages_client(server)
    whole = messages.messages.create(model="gemma-3-270m-q4_k_m", system=SYSTEM, messages=CONVERSATION,
                                     max_tokens=24, extra_body=GREEDY)
    [block] = whole.content
    assert block.type == "text" and block.text == chat.choices[0].message.content and block.text.strip()
    assert whole.id.startswith("msg_") and (whole.type, whole.role) == ("message", "assistant")
    assert whole.model == "gemma-3-270m-q4_k_m" and whole.stop_sequence is None
    assert whole.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    usage = whole.usage
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.cache_read_input_tokens > 0, "the same prompt again: its prefix read from the slot's cache"
    events, final = streamed(messages.messages.stream(model="", system=[{"type": "text", "text": SYSTEM}],
                                                      messages=CONVERSATION, max_tokens=24, extra_body=GREEDY))
    assert order(events) == EVENT_ORDER
    assert "".join(event.delta.text for event in events if event.type == "content_block_delta") == block.text
    assert final.content[0].text == block.text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == chat.usage.prompt_tokens


def test_stop_sequences_and_max_tokens_end_a_message_as_anthropic_says(server):  # noqa: F811
    messages = messages_client(server)
    cut = messages.messages.create(model="", messages=COUNT, max_tokens=12, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 12
    text = cut.content[0].text
    assert " 7," in text, text
    stopped = messages.messages.create(model="", messages=COUNT, max_tokens=12, extra_body=GREEDY,
                                       stop_sequences=["Z", " 7,"])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", " 7,")
    assert stopped.content[0].text == text[:text.index(" 7,")]
    events, final = streamed(messages.messages.stream(model="", messages=COUNT, max_tokens=12, extra_body=GREEDY,
                                                      stop_sequences=[" 7,"]))
    [delta] = [event for event in events if event.type == "message_delta"]
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == ("stop_sequence", " 7,")
    assert final.content[0].text == stopped.content[0].text


def test_a_tool_round_trip_whole_and_streamed(server):  # noqa: F811
    """tool_choice names the tool, so the small model must call it: a tool_use block whose input its schema
    allows (streamed as input_json_delta); its tool_result sent back, the model answers in text."""
    messages = messages_client(server)
    asked = {"model": "", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
             "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}, "max_tokens": 60,
             "extra_body": GREEDY}
    called = messages.messages.create(**asked)
    assert called.stop_reason == "tool_use"
    [use] = [block for block in called.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])
    events, final = streamed(messages.messages.stream(**asked))
    starts = [event.content_block.type for event in events if event.type == "content_block_start"]
    pieces = [event.delta for event in events if event.type == "content_block_delta"]
    assert starts[-1] == "tool_use" and pieces[-1].type == "input_json_delta"
    assert json.loads(pieces[-1].partial_json) == use.input and final.stop_reason == "tool_use"
    assert [block.input for block in final.content if block.type == "tool_use"] == [use.input]
    follow = [*asked["messages"], {"role": "assistant", "content": called.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]}]
    answer = messages.messages.create(**asked | {"messages": follow, "tool_choice": {"type": "none"},
                                                 "max_tokens": 24})
    assert answer.stop_reason in ("end_turn", "max_tokens") and [block.type for block in answer.content] == ["text"]
    assert answer.content[0].text.strip()


def test_count_tokens_is_the_prompt_a_message_reads(server):  # noqa: F811
    """Through the model's template, the tools described in the system prompt (the starter's generic form)."""
    messages = messages_client(server)
    body = {"model": "", "system": SYSTEM, "messages": CONVERSATION, "tools": [WEATHER]}
    counted = messages.messages.count_tokens(**body).input_tokens
    reply = messages.messages.create(**body, max_tokens=2, extra_body=GREEDY)
    assert counted == reply.usage.input_tokens + reply.usage.cache_read_input_tokens
    assert counted > messages.messages.count_tokens(model="", system=SYSTEM, messages=CONVERSATION).input_tokens


def test_bad_fields_are_refused_in_anthropics_shape_and_not_sent_again(server):  # noqa: F811
    base = server.removesuffix("/v1")
    status, body, _ = post(f"{base}/v1/messages", json.dumps({"messages": COUNT}).encode())
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("max_tokens is required")
    status, body, _ = post(f"{base}/v1/messages", json.dumps({"messages": "hi", "max_tokens": 4}).encode())
    assert status == 400 and body["error"]["message"].startswith("messages must be a non-empty list")
    status, body, _ = post(f"{base}/v1/messages", json.dumps({"messages": COUNT, "max_tokens": 4,
                                                              "stop_sequences": "END"}).encode())
    assert status == 400 and body["error"]["message"].startswith("stop_sequences must be a list")
    before = refused_total(server)
    patient = messages_client(server, max_retries=2)  # the SDK's own retries: none for a 400
    with pytest.raises(anthropic.BadRequestError) as image:
        patient.messages.create(model="", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert image.value.status_code == 400 and image.value.body["error"]["type"] == "invalid_request_error"
    assert image.value.body["error"]["message"] == ("messages.0.content.1: image content is not supported: this "
                                                    "model reads text only")
    assert refused_total(server) == before + 1, "sent once"
    with pytest.raises(anthropic.NotFoundError) as unknown:
        patient.messages.create(model="claude-opus-4", max_tokens=4, messages=COUNT)
    assert unknown.value.body["error"]["type"] == "not_found_error"
    status, body, _ = post(f"{base}/v1/messages", json.dumps({"messages": [{"role": "user", "content": "word " * 3000}],
                                                              "max_tokens": 4}).encode())
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and "tokens" in body["error"]["message"]


def test_a_key_in_x_api_key_or_bearer_and_a_full_queue_is_overloaded(tiny_model):
    """`x-api-key`, as Anthropic's clients send it, or `Authorization: Bearer`; a wrong key is a 401
    authentication_error; past the queue, Anthropic's 529 overloaded_error with Retry-After."""
    with answering(tiny_model, api_key="sesame", parallel=1, queue=0) as url:
        assert messages_client(url, api_key="sesame").messages.create(model="", messages=COUNT, max_tokens=2).content
        bearer = anthropic.Anthropic(base_url=url.removesuffix("/v1"), auth_token="sesame", max_retries=0)
        assert bearer.messages.count_tokens(model="", messages=COUNT).input_tokens > 5
        with pytest.raises(anthropic.AuthenticationError) as wrong:
            messages_client(url, api_key="open sesame").messages.create(model="", messages=COUNT, max_tokens=2)
        assert wrong.value.status_code == 401 and wrong.value.body["type"] == "error"
        assert wrong.value.body["error"]["type"] == "authentication_error" and "x-api-key" in str(wrong.value)
        with messages_client(url, api_key="sesame").messages.stream(model="", messages=COUNT, max_tokens=4000) as busy:
            next(iter(busy))
            status, body, headers = post(f"{url.removesuffix('/v1')}/v1/messages", json.dumps(
                {"messages": COUNT, "max_tokens": 2}).encode(), {"x-api-key": "sesame"})
        assert status == 529 and body["error"]["type"] == "overloaded_error" and headers["Retry-After"] == "1"


def test_thinking_comes_as_its_own_block_when_asked_for(thinker_model):
    """The scripted Qwen3 thinker (`<think>Hmm, let me</think>Hello world`): `thinking` enabled, a thinking block
    then the text, whole and streamed (thinking_delta); left out, as Anthropic's API, no thinking."""
    with answering(thinker_model) as url:
        messages = messages_client(url)
        asked = {"model": "", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
        thought = messages.messages.create(**asked, thinking={"type": "enabled", "budget_tokens": 32})
        assert [(block.type, getattr(block, "thinking", None) or block.text) for block in thought.content] == [
            ("thinking", "Hmm, let me"), ("text", "Hello world ")]
        events, final = streamed(messages.messages.stream(**asked, thinking={"type": "enabled", "budget_tokens": 32}))
        deltas = [event.delta.type for event in events if event.type == "content_block_delta"]
        assert deltas[0] == "thinking_delta" and deltas[-1] == "text_delta"
        assert final.content[0].thinking == "Hmm, let me" and final.content[1].text == "Hello world "
        plain = messages.messages.create(**asked)
        assert [(block.type, block.text) for block in plain.content] == [("text", "Hello world ")]


def parsed(**body):
    return parse_messages({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8} | body, DEFAULTS, INFO,
                          2048)


@pytest.mark.parametrize(("body", "param"), [
    ({"max_tokens": None}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"), ({"messages": {}}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]},
     "messages[0].content[0]"),
    ({"system": [{"type": "image"}]}, "system[0]"), ({"system": 5}, "system"),
    ({"stop_sequences": "END"}, "stop_sequences"), ({"temperature": "0.7"}, "temperature"),
    ({"thinking": {"type": "enabled"}}, "thinking"), ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0]"),
    ({"tools": [{"name": "f", "input_schema": "/etc/passwd"}]}, "tools[0].input_schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "g"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"), ({"tool_choice": "auto"}, "tool_choice"),
    ({"output_config": {"format": {"type": "json_schema", "schema": "/etc/passwd"}}}, "output_config.format"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}},
     "output_config.format.schema"),
    ({"tools": [WEATHER], "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     "output_config.format"),
])
def test_a_bad_field_is_named_as_the_request_sent_it(body, param):
    with pytest.raises(BadRequest) as caught:
        parsed(**body)
    assert caught.value.status == 400 and caught.value.param == param and "\n" not in str(caught.value)


def test_turns_of_one_role_are_one_and_a_tool_round_trip_reads_as_the_generic_form_writes_it():
    """Anthropic combines consecutive turns of one role; on a model without a tool template (the starter's
    form) the call is the model's own `<tool_call>` text and its result the user's `<tool_response>`."""
    asked = parsed(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}], messages=[
        {"role": "user", "content": "Weather?"}, {"role": "user", "content": [{"type": "text", "text": "In Paris."}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "a call", "signature": ""},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "no network"}]},
                                     {"type": "text", "text": "Try again?"}]}],
        tools=[WEATHER], tool_choice={"type": "auto"}, stop_sequences=["END"])
    request = asked.request
    assert [message.role for message in request.messages] == ["system", "user", "assistant", "user"]
    assert request.messages[0].content.startswith("Be brief.\n\nBe kind.\n\nYou can call these tools.")
    assert request.messages[1].content == "Weather?\n\nIn Paris."
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert request.messages[2].content == call
    assert request.messages[3].content == "<tool_response>\nError: no network\n</tool_response>\n\nTry again?"
    params = request.params.snapshot()[1]
    assert request.tool_choice == "auto" and params.stop == ("END",) and params.max_tokens == 8
    assert not request.thinking, "no thinking unless asked for, as Anthropic's API"
    thinking = parsed(thinking={"type": "enabled", "budget_tokens": 64}).request
    assert thinking.thinking and thinking.params.snapshot()[1].thinking_budget == 64
    counted = parse_messages({"messages": [{"role": "user", "content": "hi"}], "temperature": "ignored"}, DEFAULTS,
                             INFO, 2048, counting=True)
    assert counted.request.params.snapshot()[1].max_tokens == 1 and not counted.stream
