"""`tui-chat serve`'s Ollama API as a client sees it: the official `ollama` client (and raw HTTP where the client
would refuse to send the request) against the real command on the starter model, whose replies at temperature 0
are those of `/v1/chat/completions`; in-process servers on scripted models where a test needs a tool call
(Ollama's API cannot force one: the scripted model makes it), thinking, or a key."""

from __future__ import annotations

import json
import re

import jsonschema
import ollama
import pytest

from test_serve import PERSON, WEATHER, answering, client, get, post, server, server_home  # noqa: F401 - fixtures
from test_tool_formats import QUESTION, write_family
from tui_chat.engine.base import ModelInfo
from tui_chat.engine.params import SamplingParams
from tui_chat.serve import ollama as api
from tui_chat.serve.protocol import BadRequest

MODEL = "gemma-3-270m-q4_k_m"
SYSTEM = {"role": "system", "content": "You answer in one short sentence."}
CONVERSATION = [SYSTEM, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Name a fruit and say why you like it."}]
COUNT = "Count from 1 to 100: 1, 2, 3,"
GREEDY = {"temperature": 0, "num_predict": 24}
TIME = {"type": "function", "function": {
    "name": "get_current_time", "description": "The time now in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
INFO = ModelInfo("m", "/m.gguf", "", "Q4_K_M", 0, 0, 0, 0, 4096, 4096, "plain")  # no tool template: the generic form
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


def ollama_client(url: str, **options) -> ollama.Client:
    """The client on a server's base URL (it adds `/api/…`)."""
    return ollama.Client(host=url.removesuffix("/v1"), **options)


def timed(final) -> None:
    """The last line's figures: whole nanoseconds, each above nothing, the parts within the whole."""
    durations = [getattr(final, name) for name in DURATIONS]
    assert final.done and all(isinstance(value, int) and value > 0 for value in durations), durations
    assert final.prompt_eval_duration + final.eval_duration < final.total_duration
    assert final.prompt_eval_count > 0 and final.eval_count > 0


def test_the_model_is_listed_shown_and_running(server):  # noqa: F811
    api_client = ollama_client(server)
    [model] = api_client.list().models
    assert model.model == f"{MODEL}:latest" and model.size > 100_000_000 and re.fullmatch("[0-9a-f]{64}", model.digest)
    details = model.details
    assert (details.format, details.family, details.quantization_level) == ("gguf", "gemma3", "Q4_K_M")
    assert re.fullmatch(r"\d+\.\d\dM", details.parameter_size), details.parameter_size
    shown = api_client.show(MODEL)
    assert shown.capabilities == ["completion", "tools"] and shown.details == details
    assert shown.template == json.loads(get(f"{server.removesuffix('/v1')}/props")[1])["chat_template"], \
        "the template the model is read with: here tui-chat's plain transcript (the starter's GGUF names none)"
    assert shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.modelinfo["gemma3.context_length"] > 0 and "temperature" in shown.parameters
    [running] = api_client.ps().models
    assert running.model == model.model and running.context_length > 0 and running.size >= model.size
    status, text, _ = get(f"{server.removesuffix('/v1')}/api/version")
    assert status == 200 and re.fullmatch(r"\d+\.\d+\.\d+", json.loads(text)["version"])


def test_a_chat_is_the_chat_completions_reply_whole_and_streamed(server):  # noqa: F811
    """The same conversation at temperature 0: the same text and tokens as `/v1/chat/completions`; streamed as
    NDJSON lines whose text is the whole reply's, the figures on the last."""
    # Asked twice: the second reads its prompt from the slot's cache as the chat compared with it will (on Intel
    # CPUs a batch's rows and a one-token step sum in another order: a fresh read parts at near-ties).
    for _ in range(2):
        chat = client(server).chat.completions.create(model="", messages=CONVERSATION, max_tokens=24, temperature=0)
    said = chat.choices[0]
    api_client = ollama_client(server)
    whole = api_client.chat(MODEL, messages=CONVERSATION, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content == said.message.content
    assert whole.message.content.strip() and whole.done_reason == said.finish_reason
    assert whole.model == f"{MODEL}:latest"
    assert (whole.prompt_eval_count, whole.eval_count) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    timed(whole)
    lines = list(api_client.chat(f"{MODEL}:latest", messages=CONVERSATION, options=GREEDY, stream=True))
    assert [line.done for line in lines] == [False] * (len(lines) - 1) + [True]
    assert 1 < len(lines) <= whole.eval_count + 1, "a line a token, then the last"
    assert "".join(line.message.content for line in lines) == whole.message.content
    assert lines[-1].done_reason == whole.done_reason and lines[-1].eval_count == whole.eval_count
    timed(lines[-1])


def test_a_generation_templated_or_raw_whole_and_streamed(server):  # noqa: F811
    """A prompt and a system prompt read through the model's template, as a chat's; `raw`, as it is, as a
    completion's; `num_predict` ends the reply `length`."""
    openai = client(server)
    asked = [SYSTEM, CONVERSATION[-1]]
    for _ in range(2):  # the second read from the slot's cache, as the generation below (as above)
        chat = openai.chat.completions.create(model="", messages=asked, max_tokens=24, temperature=0).choices[0]
    api_client = ollama_client(server)
    whole = api_client.generate(MODEL, CONVERSATION[-1]["content"], system=SYSTEM["content"], options=GREEDY)
    assert whole.response == chat.message.content and whole.context is None and whole.done_reason == chat.finish_reason
    timed(whole)
    lines = list(api_client.generate(MODEL, CONVERSATION[-1]["content"], system=SYSTEM["content"], options=GREEDY,
                                     stream=True))
    assert "".join(line.response for line in lines) == whole.response and lines[-1].done
    for _ in range(2):
        completion = openai.completions.create(model="", prompt=COUNT, max_tokens=8, temperature=0).choices[0].text
    raw = api_client.generate(MODEL, COUNT, raw=True, options={"temperature": 0, "num_predict": 8})
    assert raw.response == completion and (raw.done_reason, raw.eval_count) == ("length", 8)
    timed(raw)
    cut = list(api_client.chat(MODEL, messages=[{"role": "user", "content": COUNT}], stream=True,
                               options={"temperature": 0, "num_predict": 5}))
    assert (cut[-1].done_reason, cut[-1].eval_count) == ("length", 5)
    assert api_client.generate(MODEL, "").done_reason == "load", "Ollama's way to load a model: it is"


def test_embed_gives_the_vectors_of_the_openai_endpoint(server):  # noqa: F811
    """`/api/embed` (what Ollama's retrieval clients call): the same vectors as `/v1/embeddings`, as lists."""
    texts = ["The cat sat on the mat.", "Quarterly revenue grew by ten percent."]
    answer = ollama_client(server).embed(MODEL, texts)
    ours = client(server).embeddings.create(model="", input=texts, encoding_format="float")
    assert answer.model == f"{MODEL}:latest" and len(answer.embeddings) == 2
    assert answer.embeddings == [item.embedding for item in ours.data]
    assert answer.prompt_eval_count == ours.usage.prompt_tokens and answer.total_duration > 0
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client(server).embed(MODEL, [])
    assert refused.value.status_code == 400 and refused.value.error.startswith("input")
    one = ollama_client(server).embeddings(f"{MODEL}:latest", texts[0])  # the older endpoint: one text
    assert one.embedding == answer.embeddings[0]


def test_a_schema_format_gives_json_that_validates(server):  # noqa: F811
    reply = ollama_client(server).chat(MODEL, messages=[{"role": "user", "content": "A person as JSON, with a name "
                                                                                    "and age."}],
                                       format=PERSON, options={"temperature": 0, "num_predict": 200})
    jsonschema.validate(json.loads(reply.message.content), PERSON)


def test_bad_fields_are_refused_in_ollamas_shape(server):  # noqa: F811
    """`{"error": …}` naming the field, 400; an unknown model 404; managing models, 501."""
    base = server.removesuffix("/v1")
    hello = [{"role": "user", "content": "Hi"}]
    for path, body, error in [
        ("chat", {"messages": hello, "options": {"temperature": "hot"}},
         'options.temperature must be a number (got the string "hot")'),
        ("chat", {"messages": hello, "format": 5}, 'format must be "json" or a JSON schema object'),
        ("chat", {"messages": hello, "options": {"num_ctx": 10**6}}, "options.num_ctx must be a whole number"),
        ("chat", {"messages": [hello[0] | {"images": ["aGk="]}]}, "messages[0].images: images are not supported"),
        ("generate", {"prompt": "Hi", "suffix": "!"}, "suffix is not supported"),
        ("generate", {"prompt": "word " * 3000, "stream": False}, "prompt: "),
    ]:
        status, answer, _ = post(f"{base}/api/{path}", json.dumps({"model": MODEL} | body).encode())
        assert status == 400 and list(answer) == ["error"] and answer["error"].startswith(error), answer
    api_client = ollama_client(server)
    with pytest.raises(ollama.ResponseError) as unknown:
        api_client.chat("llama3:8b", messages=hello)
    assert unknown.value.status_code == 404 and "llama3:8b" in unknown.value.error
    with pytest.raises(ollama.ResponseError) as pulled:
        api_client.pull("llama3:8b")
    assert pulled.value.status_code == 501 and "one model" in pulled.value.error


def test_a_tool_call_whole_and_streamed_and_its_result_read_back(tmp_path):
    """Ollama's API cannot force a call, so a scripted Qwen model makes it (tests/test_tool_formats.py): the call
    comes as `tool_calls`, its arguments an object, never as text; sent back with its result, it is read."""
    with answering(write_family("hermes", tmp_path / "qwen.gguf")) as url:
        api_client = ollama_client(url)
        name = api_client.list().models[0].model
        asked = [{"role": "user", "content": QUESTION}]
        whole = api_client.chat(name, messages=asked, tools=[TIME])
        [call] = whole.message.tool_calls
        assert (call.function.name, call.function.arguments) == ("get_current_time", {"timezone": "Asia/Tokyo"})
        assert whole.message.content == "" and whole.done_reason == "stop"
        lines = list(api_client.chat(name, messages=asked, tools=[TIME], stream=True))
        assert not any("tool_call" in line.message.content for line in lines), "a call never goes out as text"
        assert [line.message.tool_calls for line in lines if line.message.tool_calls] == [[call]]
        follow = [*asked, whole.message, {"role": "tool", "content": "12:00 JST", "tool_name": "get_current_time"}]
        assert api_client.chat(name, messages=follow, tools=[TIME], options={"num_predict": 4}).done


def test_thinking_comes_apart_and_think_false_turns_it_off(thinker_model):
    """The scripted Qwen3 thinker (`<think>Hmm, let me</think>Hello world `): the thinking in its own field, whole
    and streamed, on a chat and a generation; `think: false`, none."""
    with answering(thinker_model) as url:
        api_client = ollama_client(url)
        name = api_client.list().models[0].model
        assert "thinking" in api_client.show(name).capabilities
        hello = [{"role": "user", "content": "Hi"}]
        whole = api_client.chat(name, messages=hello, think=True).message
        assert (whole.thinking, whole.content) == ("Hmm, let me", "Hello world ")
        lines = list(api_client.chat(name, messages=hello, stream=True))
        thought = "".join(line.message.thinking or "" for line in lines)
        assert (thought, "".join(line.message.content for line in lines)) == ("Hmm, let me", "Hello world ")
        generated = api_client.generate(name, "Hi", think="low")
        assert (generated.thinking, generated.response) == ("Hmm, let me", "Hello world ")
        off = api_client.chat(name, messages=hello, think=False).message
        assert off.thinking is None and off.content == "Hello world "


def test_a_key_is_needed_as_on_the_other_endpoints(tiny_model):
    with answering(tiny_model, api_key="sesame") as url:
        assert ollama_client(url, headers={"Authorization": "Bearer sesame"}).list().models
        with pytest.raises(ollama.ResponseError) as refused:
            ollama_client(url).list()
        assert refused.value.status_code == 401 and refused.value.error.startswith("a valid API key is needed")


def asked(path: str = "/api/chat", **body):
    answer = api.answer("POST", path, {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"} | body, INFO,
                        SamplingParams(), 2048)
    assert isinstance(answer, api.Asking)
    return answer.asked


@pytest.mark.parametrize(("path", "body", "param"), [
    ("chat", {"options": "hot"}, "options"), ("chat", {"options": {"top_k": "40"}}, "options.top_k"),
    ("chat", {"options": {"num_predict": 0}}, "options.num_predict"),
    ("chat", {"options": {"stop": 5}}, "options.stop"),
    ("chat", {"options": {"mirostat": 1}}, "options.mirostat"), ("chat", {"options": {"seed": 1.5}}, "options.seed"),
    ("chat", {"format": {"type": "nonsense"}}, "format"), ("chat", {"format": "yaml"}, "format"),
    ("chat", {"think": "max"}, "think"), ("chat", {"stream": "yes"}, "stream"),
    ("chat", {"messages": "hi"}, "messages"),
    ("chat", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}]},
     "messages[0].tool_calls[0]"),
    ("chat", {"tools": [{"type": "function"}]}, "tools[0]"), ("chat", {"tools": [TIME], "format": "json"}, "format"),
    ("chat", {"model": "llama3"}, "model"), ("generate", {"prompt": 5}, "prompt"),
    ("generate", {"system": 5}, "system"),
    ("generate", {"raw": "yes"}, "raw"), ("generate", {"template": "{{ .Prompt }}"}, "template"),
    ("generate", {"context": [1, 2]}, "context"), ("generate", {"images": ["aGk="]}, "images"),
    ("generate", {"raw": True, "options": {"temperature": -1}}, "options.temperature"),
])
def test_a_bad_field_is_named_as_the_request_sent_it(path, body, param):
    with pytest.raises(BadRequest) as caught:
        asked(f"/api/{path}", **body)
    error = caught.value
    assert error.param == param and error.status in (400, 404) and "\n" not in str(error)
    assert api.refusal(error)["error"].startswith(param) or error.status == 404


def test_options_format_think_and_an_ollama_tool_round_trip_become_the_engine_request():
    request = asked(options={"temperature": 0.2, "top_k": 7, "min_p": 0.1, "repeat_penalty": 1.2, "seed": 5,
                             "stop": ["END"], "num_predict": 9, "num_ctx": 1024, "num_thread": 3},
                    format="json", think=False, stream=False).request
    params = request.params.snapshot()[1]
    assert (params.temperature, params.top_k, params.min_p, params.repeat_penalty, params.seed) == (0.2, 7, 0.1, 1.2, 5)
    assert (params.stop, params.max_tokens) == (("END",), 9) and request.format.kind == "json" and not request.thinking
    unlimited = asked(options={"num_predict": -1})
    assert unlimited.stream and unlimited.request.params.snapshot()[1].max_tokens == 2048, "the slot's end"
    schema = asked("/api/generate", raw=True, format=PERSON).request
    assert schema.format.kind == "json_schema" and schema.text_prompt == "hi"
    conversation = asked(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}], tools=[WEATHER]).request
    assert [message.role for message in conversation.messages] == ["system", "user", "assistant", "user"]
    assert conversation.messages[2].content == ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
                                                "</tool_call>")
    assert conversation.messages[3].content == "<tool_response>\nsunny\n</tool_response>"
