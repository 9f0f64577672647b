"""`tui-chat serve`'s OpenAI Responses API as a client sees it: the official `openai` SDK (`responses.create`,
`responses.stream`), raw HTTP where its events are checked against the SDK's own types, and OpenAI's Agents SDK
in its default mode, against the real command on the starter model; in-process servers on the scripted thinking
model where a test needs thinking."""

from __future__ import annotations

import io
import json
import urllib.request

import agents
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from test_serve import PERSON, answering, client, get, post, server, server_home  # noqa: F401 - fixtures by name
from tui_chat.engine.base import Done, Message, ModelInfo, Token, TurnMetrics
from tui_chat.engine.params import SamplingParams
from tui_chat.serve.monitor import RequestRecord
from tui_chat.serve.protocol import BadRequest
from tui_chat.serve.responses import Memory, StreamedResponse, parse_responses

SYSTEM = "You answer in one short sentence."
CONVERSATION = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Name a fruit and say why you like it."}]
COUNT = "Count from 1 to 100: 1, 2, 3,"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}, "strict": True}
FORCED = {"type": "function", "name": "get_weather"}
INFO = ModelInfo("m", "/m.gguf", "", "Q4_K_M", 0, 0, 0, 0, 4096, 4096, "plain")  # no tool template: the generic form
DEFAULTS = SamplingParams()
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done"]
EVENTS = TypeAdapter(ResponseStreamEvent)


def refused_total(url: str) -> int:
    text = get(f"{url.removesuffix('/v1')}/metrics")[1]
    return int(dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))[
        "tui_chat_requests_refused_total"])


def order(events) -> list[str]:
    """The event types with each run of one type as one."""
    kinds = [event.type for event in events]
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def whole(chat: openai.OpenAI, **asked) -> Response:
    """`responses.create`, its JSON checked against the SDK's `Response` (the SDK itself builds it unchecked)."""
    raw = chat.responses.with_raw_response.create(**asked)
    Response.model_validate(raw.http_response.json())
    return raw.parse()


def streamed(url: str, body: dict) -> list:
    """A streamed response read raw: each event's `event:` name its type, its data one of the SDK's event types
    (checked, not just constructed), their sequence numbers 0, 1, 2…"""
    request = urllib.request.Request(f"{url}/responses", data=json.dumps(body | {"stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.headers["Content-Type"] == "text/event-stream"
        for block in answer.read().decode().split("\n\n"):
            if block.strip():
                name, data = block.split("\n")
                event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")))
                assert name == f"event: {event.type}"
                events.append(event)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    return events


def test_a_response_is_the_chat_completions_reply_whole_and_streamed(server):  # noqa: F811
    """The same conversation at temperature 0 (the instructions its system prompt): the same text as
    `/v1/chat/completions`, the same tokens counted; streamed, in the Responses API's order of events."""
    chat = client(server)
    # Asked twice: the second reads its prompt from the slot's cache as the response compared with it will (on
    # Intel CPUs a batch's rows and a one-token step sum in another order: a fresh read parts at near-ties).
    for _ in range(2):
        reply = chat.chat.completions.create(model="", max_tokens=60, temperature=0,
                                             messages=[{"role": "system", "content": SYSTEM}, *CONVERSATION])
    assert reply.choices[0].finish_reason == "stop"
    answer = whole(chat, model="gemma-3-270m-q4_k_m", instructions=SYSTEM, input=CONVERSATION, max_output_tokens=60,
                   temperature=0)
    assert answer.output_text == reply.choices[0].message.content and answer.output_text.strip()
    [message] = answer.output
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "completed"
    assert answer.id.startswith("resp_") and answer.object == "response" and answer.status == "completed"
    assert answer.model == "gemma-3-270m-q4_k_m" and answer.instructions == SYSTEM and answer.temperature == 0
    assert answer.max_output_tokens == 60 and answer.incomplete_details is None and answer.error is None
    usage = answer.usage
    assert usage.output_tokens == reply.usage.completion_tokens and usage.input_tokens == reply.usage.prompt_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens > 0, "the same prompt again: its prefix read from the cache"
    extras = answer.model_extra["x_tui_chat"]
    assert extras["stop_reason"] in ("eos", "stop") and extras["ttft_s"] > 0 and extras["decode_tok_s"] > 0
    with chat.responses.stream(model="", instructions=SYSTEM, input=CONVERSATION, max_output_tokens=60,
                               temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert order(events) == [*TEXT_EVENTS, "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == \
        answer.output_text == final.output_text
    assert final.id == events[0].response.id and final.usage.output_tokens == usage.output_tokens
    raw = streamed(server, {"instructions": SYSTEM, "input": CONVERSATION, "max_output_tokens": 60, "temperature": 0})
    assert [event.type for event in raw] == [event.type for event in events]


def test_max_output_tokens_ends_a_response_incomplete(server):  # noqa: F811
    chat = client(server)
    cut = whole(chat, model="", input=COUNT, max_output_tokens=12, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 12 and cut.output[-1].status == "incomplete" and " 7," in cut.output_text
    events = streamed(server, {"input": COUNT, "max_output_tokens": 12, "temperature": 0})
    assert order(events) == [*TEXT_EVENTS, "response.incomplete"]
    last = events[-1].response
    assert last.status == "incomplete" and last.incomplete_details.reason == "max_output_tokens"
    assert last.output_text == cut.output_text and last.output[0].status == "incomplete"


def test_a_function_tool_round_trip_whole_streamed_and_by_previous_response_id(server):  # noqa: F811
    """tool_choice names the function, so the small model must call it: a function_call item whose arguments its
    schema allows (streamed as function_call_arguments events); its output fed back, the model answers in text,
    the same whether the conversation is sent whole or continued from the call's response."""
    chat = client(server)
    asked = {"model": "", "input": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER],
             "tool_choice": FORCED, "max_output_tokens": 60, "temperature": 0}
    called = whole(chat, **asked)
    [call] = called.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_") and called.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert called.tools[0].name == "get_weather" and called.tool_choice.name == "get_weather"
    events = streamed(server, {name: value for name, value in asked.items() if name != "model"})
    assert order(events) == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.function_call_arguments.delta", "response.function_call_arguments.done",
                             "response.output_item.done", "response.completed"]
    assert events[-1].response.output[0].arguments == call.arguments and events[-1].response.output[0].name == call.name
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    for _ in range(2):  # the second read from the slot's cache, as the continuation below (as above)
        follow = whole(chat, **asked | {"input": [*asked["input"], call.model_dump(exclude_none=True), result],
                                        "tool_choice": "none", "max_output_tokens": 24})
    assert [item.type for item in follow.output] == ["message"] and follow.output_text.strip()
    continued = whole(chat, **asked | {"input": [result], "previous_response_id": called.id, "tool_choice": "none",
                                       "max_output_tokens": 24})
    assert continued.output_text == follow.output_text and continued.previous_response_id == called.id


def test_previous_response_id_continues_a_conversation_and_an_unknown_one_is_refused_once(server):  # noqa: F811
    """Only the new input is sent: the reply is the one the whole conversation gets; an id the server does not
    keep (unknown, or a response sent with store false) is a 400 naming previous_response_id, not retried."""
    chat = client(server)
    first = whole(chat, model="", input="My name is Ada. Say hello to me.", max_output_tokens=24, temperature=0)
    conversation = [{"role": "user", "content": "My name is Ada. Say hello to me."},
                    {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
                    {"role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}]
    whole(chat, model="", max_output_tokens=24, temperature=0, input=conversation)  # then both read it from the cache
    second = whole(chat, model="", previous_response_id=first.id, input="What is my name?", max_output_tokens=24,
                   temperature=0)
    again = whole(chat, model="", max_output_tokens=24, temperature=0, input=conversation)
    assert second.output_text == again.output_text and second.output_text.strip()
    assert second.usage.input_tokens == again.usage.input_tokens
    unstored = whole(chat, model="", input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    patient = client(server).with_options(max_retries=2)  # the SDK's own retries: none for a 400
    for unknown in ("resp_nonesuch", unstored.id):
        before = refused_total(server)
        with pytest.raises(openai.BadRequestError) as refused:
            patient.responses.create(model="", previous_response_id=unknown, input="And now?")
        error = refused.value.body
        assert (error["code"], error["param"], error["type"]) == ("previous_response_not_found",
                                                                  "previous_response_id", "invalid_request_error")
        assert refused_total(server) == before + 1, "sent once"


def test_text_format_json_schema_gives_json_that_validates(server):  # noqa: F811
    chat = client(server)
    answer = whole(chat, model="", input="A person as JSON, with a name and age.", max_output_tokens=200,
                   temperature=0, text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                   "strict": True}})
    jsonschema.validate(json.loads(answer.output_text), PERSON)
    assert answer.text.format.type == "json_schema" and answer.text.format.name == "person"
    loose = whole(chat, model="", input="A person as a JSON object.", max_output_tokens=100, temperature=0,
                  text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(loose.output_text), dict)


def test_bad_fields_are_refused_in_openais_shape_naming_the_field(server):  # noqa: F811
    base = server.removesuffix("/v1")
    for body, param in [({"input": []}, "input"), ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
                        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
                        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                         "input[0].content[0]"),
                        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
                         "text.format.schema")]:
        status, answer, _ = post(f"{base}/v1/responses", json.dumps(body).encode())
        assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
        assert answer["error"]["param"] == param, answer
    status, answer, _ = post(f"{base}/v1/responses", json.dumps({"input": "word " * 3000}).encode())
    assert status == 400 and answer["error"]["param"] == "input" and "tokens" in answer["error"]["message"]
    status, answer, _ = post(f"{base}/v1/responses", json.dumps({"input": "hi", "model": "gpt-5"}).encode())
    assert status == 404 and answer["error"]["code"] == "model_not_found"


def test_the_agents_sdk_runs_a_function_tool_against_it(server):  # noqa: F811
    """OpenAI's Agents SDK in its default mode (the Responses API): the agent must call its tool (tool_choice
    required: the small model would call it again and again after, so the run ends at the tool's output), then
    a second run sends the first one's items back (the call and its output, as the SDK writes them) and the
    agent answers in text."""
    ran: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        ran.append(city)
        return f"sunny, 21 C in {city}"

    agents.set_default_openai_client(openai.AsyncOpenAI(base_url=server, api_key="none", max_retries=0),
                                     use_for_tracing=False)
    agents.set_default_openai_api("responses")
    agents.set_tracing_disabled(True)
    agent = agents.Agent(name="Forecaster", instructions="You answer questions about the weather with your tool.",
                         model="gemma-3-270m-q4_k_m", tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=60))
    called = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    assert ran and ran[0] and called.final_output == f"sunny, 21 C in {ran[0]}", "the tool ran"
    assert [item.type for item in called.new_items] == ["tool_call_item", "tool_call_output_item"]
    assert called.last_response_id.startswith("resp_")
    talker = agent.clone(tool_use_behavior="run_llm_again",
                            model_settings=agents.ModelSettings(tool_choice="none", temperature=0, max_tokens=200))
    answered = agents.Runner.run_sync(talker, [*called.to_input_list(), {
        "role": "user", "content": "Say it in one sentence."}], max_turns=2)
    assert isinstance(answered.final_output, str) and answered.final_output.strip()
    assert [item.type for item in answered.new_items] == ["message_output_item"] and len(ran) == 1


def test_reasoning_comes_as_its_own_item_and_effort_none_switches_it_off(thinker_model):
    """The scripted Qwen3 thinker (`<think>Hmm, let me</think>Hello world`): a reasoning item then the message,
    whole and streamed (reasoning_text events); `reasoning.effort` none, no thinking."""
    with answering(thinker_model) as url:
        chat = client(url)
        thought = whole(chat, model="", input="Hi", max_output_tokens=64)
        reasoning, message = thought.output
        assert reasoning.type == "reasoning" and reasoning.content[0].text == "Hmm, let me"
        assert message.type == "message" and thought.output_text == "Hello world "
        assert thought.usage.output_tokens_details.reasoning_tokens == 6
        events = streamed(url, {"input": "Hi", "max_output_tokens": 64})
        assert order(events) == ["response.created", "response.in_progress", "response.output_item.added",
                                 "response.content_part.added", "response.reasoning_text.delta",
                                 "response.reasoning_text.done", "response.content_part.done",
                                 "response.output_item.done", *TEXT_EVENTS[2:], "response.completed"]
        assert "".join(event.delta for event in events if event.type == "response.reasoning_text.delta") == \
            "Hmm, let me"
        assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]
        plain = whole(chat, model="", input="Hi", max_output_tokens=64, reasoning={"effort": "none"})
        assert [item.type for item in plain.output] == ["message"] and plain.output_text == "Hello world "
        later = whole(chat, model="", input=[{"role": "user", "content": "Hi"}, *thought.output,
                                             {"role": "user", "content": "Again"}], max_output_tokens=64)
        assert later.output_text == "Hello world ", "the output fed back, its reasoning item with it"


def parsed(memory: Memory | None = None, **body):
    return parse_responses({"input": "hi"} | body, DEFAULTS, INFO, 2048, memory or Memory())


@pytest.mark.parametrize(("body", "param"), [
    ({"input": None}, "input"), ({"input": ""}, "input"), ({"input": {}}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[]"}]}, "input[0]"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
    ({"input": [{"type": "reasoning", "summary": "x"}]}, "input[0]"),
    ({"instructions": ["x"]}, "instructions"), ({"max_output_tokens": "8"}, "max_output_tokens"),
    ({"temperature": "0.7"}, "temperature"), ({"top_p": 3}, "top_p"), ({"store": "yes"}, "store"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"), ({"reasoning": "high"}, "reasoning"),
    ({"tools": {}}, "tools"), ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "/etc/passwd"}]}, "tools[0].parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"), ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"text": "json"}, "text"), ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
     "text.format.schema"),
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"), ({"previous_response_id": 5}, "previous_response_id"),
    ({"background": True}, "background"), ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
])
def test_a_bad_field_is_named_as_the_request_sent_it(body, param):
    with pytest.raises(BadRequest) as caught:
        parsed(**body)
    assert caught.value.status == 400 and caught.value.param == param and "\n" not in str(caught.value)
    assert "response_format" not in str(caught.value) and "max_tokens must" not in str(caught.value)


def test_items_read_as_the_generic_form_writes_them_and_a_continuation_adds_to_the_kept_conversation():
    """On a model without a tool template (the starter's form): the assistant's message, reasoning and call are
    one turn, the call the model's own `<tool_call>` text and its output the user's `<tool_response>`; the
    instructions and the input's leading system messages one system prompt; `previous_response_id` continues
    what `Memory` kept, without the earlier instructions."""
    asked = parsed(instructions="Be brief.", tools=[WEATHER], tool_choice="auto", input=[
        {"role": "developer", "content": "Be kind."}, {"type": "message", "role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "a call"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "sunny"}]}])
    request = asked.request
    assert [message.role for message in request.messages] == ["system", "user", "assistant", "user"]
    assert request.messages[0].content.startswith("Be brief.\n\nBe kind.\n\nYou can call these tools.")
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert request.messages[2].content == f"Let me look.\n{call}"
    assert request.messages[3].content == "<tool_response>\nsunny\n</tool_response>"
    assert request.tool_choice == "auto" and request.thinking and not asked.stream
    assert asked.echo["tools"][0]["name"] == "get_weather" and asked.echo["instructions"] == "Be brief."
    assert [message.role for message in asked.history] == ["system", "user", "assistant", "user"]
    thought = parsed(input=[{"role": "user", "content": "Hi"},
                            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "greet"}]},
                            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}])
    assert [(message.role, message.reasoning) for message in thought.request.messages] == [
        ("user", ""), ("assistant", "greet"), ("user", "")], "a reasoning item is its turn's thinking"
    memory = Memory(size=2)
    memory.keep("resp_1", [Message("user", "Hi"), Message("assistant", "Hello")])
    follow = parsed(memory, previous_response_id="resp_1", instructions="Be terse.", input="Again",
                    reasoning={"effort": "none"}, max_output_tokens=8)
    assert [(message.role, message.content) for message in follow.request.messages] == [
        ("system", "Be terse."), ("user", "Hi"), ("assistant", "Hello"), ("user", "Again")]
    assert not follow.request.thinking and follow.request.params.snapshot()[1].max_tokens == 8
    assert follow.memory is memory and parsed(store=False).memory is None
    memory.keep("resp_2", [])
    memory.recall("resp_1")  # used: the least recently used is now resp_2
    memory.keep("resp_3", [])
    with pytest.raises(BadRequest):
        memory.recall("resp_2")
    assert memory.recall("resp_1")


class Wire:
    """A connection as a writer sees it, its events kept."""

    def __init__(self) -> None:
        self.wfile = io.BytesIO()

    def open_events(self) -> None:
        pass

    def events(self) -> list:
        blocks = [block.split("\n") for block in self.wfile.getvalue().decode().split("\n\n") if block]
        events = [EVENTS.validate_python(json.loads(data.removeprefix("data: "))) for _, data in blocks]
        assert [name for name, _ in blocks] == [f"event: {event.type}" for event in events]
        assert [event.sequence_number for event in events] == list(range(len(events)))
        return events


def test_a_streamed_call_goes_out_as_its_item_and_a_failure_mid_stream_as_response_failed():
    """The generic form's `<tool_call>` text is held back and goes out as a function_call item, the text before
    it as the message; an engine that fails mid-stream ends the stream with `response.failed`, its error said."""
    memory = Memory()
    asked = parsed(memory, tools=[WEATHER], stream=True)
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    wire, record = Wire(), RequestRecord(7, "127.0.0.1", "responses", True, ident="resp_00000007")
    writer = StreamedResponse(wire, asked, record, "m")
    for piece in ("Sure.", " <tool", "_call>", call.removeprefix("<tool_call>")):
        writer.token(Token(1, piece, 0.0, 0))
    writer.done(Done("stop", f"Sure. {call}", TurnMetrics(prompt_tokens=30, completion_tokens=20)))
    events = wire.events()
    said = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert said.strip() == "Sure." and final.output_text == said
    assert events[-1].type == "response.completed" and [item.type for item in final.output] == [
        "message", "function_call"]
    assert json.loads(final.output[1].arguments) == {"city": "Paris"} and final.output[1].call_id == "call_000007"
    assert final.usage.total_tokens == 50 and [message.role for message in memory.recall("resp_00000007")] == [
        "user", "assistant"]
    wire = Wire()
    writer = StreamedResponse(wire, parsed(memory, stream=True), record, "m")
    writer.token(Token(1, "Hello", 0.0, 0))
    writer.failed("the model's engine crashed; it is being loaded again")
    events = wire.events()
    assert events[-1].type == "response.failed" and events[-1].response.status == "failed"
    assert events[-1].response.error.message.startswith("the model's engine crashed")
    assert events[-1].response.output[0].content[0].text == "Hello"
