"""OpenAI's chat-completions protocol, read and written: a request body becomes the engine's `Request`, the
engine's events become a response or its streamed chunks. Pure functions over untrusted input: every field a
client sends is checked, and a bad one is a `BadRequest` naming it, as OpenAI's errors do.

Besides OpenAI's fields, what llama.cpp's server takes of sampling (top_k, min_p, repeat_penalty, DRY, XTC…),
so that tui-chat's own remote backend (and any llama-server client) gets the same settings through; fields
neither knows are ignored, as llama-server ignores them. A field left out takes tui-chat's default (the
config's `[sampling]`), not OpenAI's: the server answers as `tui-chat run` would. Nothing in a request can
name a file: a schema or a grammar is text, never a path.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import BufferedIOBase
from typing import Any, Protocol

from ..engine.base import Done, EngineDeath, Error, Message, ModelInfo, PromptProgress, Request, Token, TurnMetrics
from ..engine.formats import TEXT, FormatError, OutputFormat, json_schema
from ..engine.params import MAX_TOP_LOGPROBS, SPECS, InvalidParameter, LiveParams, SamplingParams
from ..tools.calls import (
    AUTO,
    CHOICES,
    NONE,
    CallForm,
    call_form,
    call_format,
    call_text,
    cut_call,
    find_call,
    template_tools,
    with_instructions,
)
from ..tools.mcp import Tool
from .monitor import RequestRecord, read_rate

CLIENT_TOOLS = "client"  # the server a client's tools are said to be on: the client runs them, never we
# Sampling fields by the name llama.cpp's server gives them, where it is ours too (OpenAI's own among them).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "top_n_sigma", "xtc_probability",
                   "xtc_threshold", "repeat_penalty", "frequency_penalty", "presence_penalty", "dry_multiplier",
                   "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat_eta", "seed")
WIRE_NAMES = {"sampler_order": "samplers", "thinking_budget": "thinking_budget_tokens"}  # ours → the request's
FINISH = {"eos": "stop", "stop": "stop", "format": "stop", "length": "length", "context": "length", "cut": "length",
          "cancelled": "stop"}
LOCAL_PATH = re.compile(r"(?<![\w.~])(?:~|[A-Za-z]:)?[/\\](?:[^\s/\\:;,()'\"]+[/\\])+")  # a path's folders


class BadRequest(Exception):
    """A request refused: its HTTP status and OpenAI's error object (message, type, param, code)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", *, recorded: bool = False) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind
        self.recorded = recorded  # the monitor has its record already (else it is counted as turned away)

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.kind, self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def engine_failure(error: Error, chat: bool) -> BadRequest:
    """The engine's refusal of a request (a 400 naming the field) or its failure (a 500), as a client is told it."""
    if error.code:
        return BadRequest(error.message, "messages" if chat else "prompt", error.code)
    return BadRequest(client_words(error), code="engine_error", status=500, kind="server_error")


def client_words(error: Error) -> str:
    """An engine's error in the server's words: its death said as a server says it, and no local path (a server
    on another address would tell its clients its files)."""
    return died_words(error.died) if error.died is not None else LOCAL_PATH.sub("", error.message)


def died_words(death: EngineDeath) -> str:
    """The engine process's death as a client is told it: what ended it and what the server does now, never
    llama.cpp's last words (they name its source files) nor where the log is."""
    cause = death.cause.removeprefix("the engine process ").replace("(llama.cpp) ", "")
    if cause.startswith("crashed with"):
        cause = cause.split(": ", 1)[0]
    return f"the model's engine {cause}; it is being loaded again"


class Wire(Protocol):
    """What an answer's writer needs of its connection (server.py's handler): a whole JSON reply, a refusal in
    the endpoint's shape, or a stream of server-sent events opened and written."""

    wfile: BufferedIOBase

    def reply_json(self, status: int, payload: dict[str, Any]) -> None: ...

    def reply_error(self, error: BadRequest) -> None: ...

    def open_events(self) -> None: ...


class WholeAnswer:
    """An answer written once, when the reply is done (`done`, in each API's shape): the engine's events before
    it have nothing to send; a failure is the endpoint's error, a 500."""

    def __init__(self, wire: Wire, asked: Asked, record: RequestRecord, model: str) -> None:
        self.wire, self.asked, self.record, self.model = wire, asked, record, model

    def token(self, token: Token) -> None:
        pass

    def metrics(self) -> None:
        pass

    def progress(self, progress: PromptProgress) -> None:
        pass

    def flush(self) -> None:
        pass

    def failed(self, message: str) -> None:
        self.wire.reply_error(BadRequest(message, code="engine_error", status=500, kind="server_error"))


@dataclass(slots=True)
class Asked:
    """A request as the engine takes it, with what the response must carry."""

    request: Request
    stream: bool = False
    usage_in_stream: bool = False
    logprobs: bool = False
    timings_per_token: bool = False
    progress: bool = False
    tools: list[Tool] = field(default_factory=list)
    form: CallForm | None = None
    chat: bool = True
    format_field: str = "response_format"  # the field a bad output format is blamed on


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise BadRequest(f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def check_model(body: dict[str, Any], served: str) -> None:
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or model.strip() not in ("", served)):
        raise BadRequest(f"the model {str(model)[:200]!r} does not exist; this server serves {served!r}",
                         "model", "model_not_found", status=404)


@contextmanager
def renamed(names: dict[str, str]) -> Iterator[None]:
    """A refusal by the shared reader names the field as the request sent it (another API's name for chat's field:
    `text.format`, not `response_format`): its `param`, and its message where that begins with the field's name.
    `names` are looked up in order: a longer name before its prefix."""
    try:
        yield
    except BadRequest as error:
        param = error.param or ""
        if old := next((name for name in names if param.startswith(name)), ""):
            error.param = names[old] + param[len(old):]
            if str(error).startswith(old):
                error.args = (names[old] + str(error)[len(old):],)
        raise


def parse_chat(body: dict[str, Any], defaults: SamplingParams, info: ModelInfo, room: int) -> Asked:
    """A `/v1/chat/completions` body."""
    asked = common(body, defaults, room)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of messages", "messages")
    form = call_form(info)
    tools = _tools(body.get("tools"))
    choice = _choice(body.get("tool_choice", AUTO if tools else NONE), tools)
    converse(asked, [_message(entry, index, form) for index, entry in enumerate(messages)], tools, choice, form)
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("enable_thinking"), bool):
        asked.request.thinking = kwargs["enable_thinking"]
    return asked


def converse(asked: Asked, chat: list[Message], tools: list[Tool], choice: str, form: CallForm) -> None:
    """The conversation and its tools into the request, whichever API they came in: the tools go to the model's
    template (or the system prompt, in the generic form) and the reply's grammar, as the chat gives them."""
    request = asked.request
    request.messages = chat
    asked.tools, asked.form = tools, form
    if not tools:
        return
    if request.format.constrained:
        raise BadRequest("an output format cannot be combined with tools here: a reply's grammar is its calls'",
                         "response_format")
    request.format = call_format(tools, choice, form)
    request.tool_choice = choice
    asked.format_field = "tools"
    if form.templated:
        request.tools = template_tools(tools)
    else:
        request.messages = with_instructions(chat, tools)


def parse_completion(body: dict[str, Any], defaults: SamplingParams, room: int) -> Asked:
    """A `/v1/completions` body: the prompt is read as it is, no template."""
    _no_scoring(body)
    asked = common(body, defaults, room)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string (one prompt a request)", "prompt")
    asked.request.text_prompt = prompt
    asked.chat = False
    return asked


def _no_scoring(body: dict[str, Any]) -> None:
    """Prompt scoring (`echo` with logprobs, `max_tokens: 0`) and fill-in-the-middle (`suffix`) are refused, not
    ignored: the engine reads a prompt without its tokens' logprobs, and a reply written as if they were taken
    would mislead an evaluation harness."""
    if body.get("echo"):
        raise BadRequest("echo is not supported: this server does not return the prompt's tokens or their logprobs "
                         "(prompt scoring)", "echo", "unsupported_parameter")
    if body.get("suffix"):
        raise BadRequest("suffix (fill-in-the-middle) is not supported: send the prompt alone", "suffix",
                         "unsupported_parameter")
    if body.get("max_tokens") == 0 and not isinstance(body["max_tokens"], bool):
        raise BadRequest("max_tokens 0 (scoring the prompt alone) is not supported: this server does not return the "
                         "prompt's logprobs; ask for 1 token or more", "max_tokens", "unsupported_parameter")


def common(body: dict[str, Any], defaults: SamplingParams, room: int) -> Asked:
    """What chat and completion requests share: sampling, limits, format, streaming and what to report."""
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1: one choice a request (send several requests: they are decoded together)", "n")
    changes = {name: _number(name, body[name]) for name in SAMPLING_FIELDS if body.get(name) is not None}
    changes["max_tokens"] = _max_tokens(body, room)
    changes |= stops(body.get("stop")) | _mirostat(body) | _samplers(body.get("samplers"))
    changes |= _biases(body.get("logit_bias")) | _thinking_budget(body.get("thinking_budget_tokens"))
    params = _validated(defaults, changes)
    logprobs, top = _logprobs(body)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    request = Request([], LiveParams(params), top_logprobs=top, format=_format(body))
    return Asked(request, stream, isinstance(options, dict) and options.get("include_usage") is True,
                 logprobs, _flag(body, "timings_per_token"), _flag(body, "return_progress"),
                 format_field="grammar" if body.get("grammar") else "response_format")


def _max_tokens(body: dict[str, Any], room: int) -> int:
    """The reply's limit, clamped to what the request's slot can hold (as llama-server clamps it: the reply ends
    there with finish_reason length); left out, the whole slot."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    limit = body.get(name)
    most = min(room, int(SPECS["max_tokens"].maximum))
    if limit is None:
        return most
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise BadRequest(f"{name} must be a whole number, 1 or more (got {_got(limit)})", name, "invalid_value")
    return min(limit, most)


def _number(name: str, value: Any) -> float:
    """A sampling field's number, in its range: a string, even of digits, is refused as OpenAI refuses it (the
    engine's own check would read "0.7" as a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{name} must be a number (got {_got(value)})", name, "invalid_value")
    spec = SPECS[name]
    if not spec.minimum <= value <= spec.maximum:
        raise BadRequest(f"{name} must be between {_plain(spec.minimum)} and {_plain(spec.maximum)} "
                         f"(got {_plain(value)})", name, "invalid_value")
    return value


def _got(value: Any) -> str:
    """A refused value as the client sent it, its JSON type plain: `the string "8"`, not 8."""
    if isinstance(value, str):
        return f"the string {json.dumps(value)[:40]}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return _plain(value)
    return "a list" if isinstance(value, list) else "an object"


def _plain(number: float) -> str:
    """A number as the other messages write one: a whole one with its thousands separated (4,294,967,294, not
    4.29497e+09), any other as JSON would write it."""
    if isinstance(number, int) or (math.isfinite(number) and number.is_integer() and abs(number) < 1e21):
        return f"{int(number):,}"
    return repr(number)


def _validated(defaults: SamplingParams, changes: dict[str, Any]) -> SamplingParams:
    """The settings with the request's changes; a bad one is named by its field in the request."""
    for name, value in changes.items():
        try:
            defaults.with_changes(**{name: value})
        except InvalidParameter as error:
            raise BadRequest(str(error), WIRE_NAMES.get(name, name), "invalid_value") from None
    return defaults.with_changes(**changes)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false", name)
    return value


def _logprobs(body: dict[str, Any]) -> tuple[bool, int]:
    """Whether each token's logprobs go with it, and how many alternatives: chat's `logprobs` (true or false)
    and `top_logprobs`, or a completion's `logprobs` (the number of alternatives)."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if isinstance(wanted, int) and not isinstance(wanted, bool):
        wanted, top = True, wanted if top is None else top
    if wanted not in (None, True, False):
        raise BadRequest("logprobs must be true or false (a completion's: the number of alternatives)", "logprobs")
    if top is None:
        return bool(wanted), 1 if wanted else 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
    return True, max(top, 1)


def stops(value: Any, name: str = "stop") -> dict[str, Any]:
    """The stop strings, under the request's own name for them (OpenAI's `stop`, Anthropic's `stop_sequences`)."""
    if value is None:
        return {}
    listed = [value] if isinstance(value, str) and name == "stop" else value
    if not isinstance(listed, list) or not all(isinstance(stop, str) and stop for stop in listed) or len(listed) > 16:
        plain = "a string or " if name == "stop" else ""
        raise BadRequest(f"{name} must be {plain}a list of at most 16 non-empty strings", name)
    return {"stop": listed}


def _mirostat(body: dict[str, Any]) -> dict[str, Any]:
    """llama-server's mirostat 2 with its tau; 0 (or none) leaves it off."""
    mode = body.get("mirostat", 0)
    if mode in (0, None):
        return {}
    if mode != 2:
        raise BadRequest("mirostat must be 0 or 2 (Mirostat 2.0)", "mirostat")
    return {"mirostat_tau": _number("mirostat_tau", body.get("mirostat_tau", 5.0))}


def _biases(value: Any) -> dict[str, Any]:
    """llama-server's logit_bias, [[text, bias], …] (false bans the text); OpenAI's by token id is refused."""
    if not value:
        return {}
    if not isinstance(value, list) or not all(isinstance(entry, list) and len(entry) == 2 for entry in value):
        raise BadRequest("logit_bias must be [[text, bias], …] pairs (a bias of false bans the text); biases by "
                         "token id are not supported", "logit_bias", "unsupported_parameter")
    return {"logit_bias": [(text, -math.inf if bias is False else bias) for text, bias in value]}


def _thinking_budget(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"thinking_budget_tokens must be a whole number (got {_got(value)})", "thinking_budget_tokens",
                         "invalid_value")
    return {"thinking_budget": value}


def _samplers(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise BadRequest("samplers must be a list of sampler names", "samplers")
    return {"sampler_order": ["typical_p" if name == "typ_p" else name for name in value]}


def _format(body: dict[str, Any]) -> OutputFormat:
    """response_format (text, json_object, json_schema), or llama-server's `grammar` (GBNF text, never a path)."""
    grammar = body.get("grammar")
    if grammar:
        if not isinstance(grammar, str) or "::=" not in grammar:
            raise BadRequest("grammar must be GBNF text with rules such as: root ::= \"yes\" | \"no\"", "grammar")
        return OutputFormat("grammar", grammar)
    response_format = body.get("response_format")
    if response_format is None:
        return TEXT
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return TEXT
    if kind == "json_object":
        schema = response_format.get("schema")
        return _schema(schema) if isinstance(schema, dict) and schema != {"type": "object"} else OutputFormat("json")
    if kind == "json_schema":
        wrapper = response_format.get("json_schema")
        schema = wrapper.get("schema") if isinstance(wrapper, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be a JSON schema object",
                             "response_format.json_schema.schema")
        return _schema(schema)
    raise BadRequest("response_format.type must be text, json_object or json_schema", "response_format.type")


def _schema(schema: dict[str, Any], param: str = "response_format.json_schema.schema") -> OutputFormat:
    try:
        return json_schema(json.dumps(schema))  # text starting with `{`: never read as a path
    except FormatError as error:
        raise BadRequest(str(error), param) from None


def _tools(value: Any) -> list[Tool]:
    tools = []
    for index, entry in enumerate(tool_entries(value)):
        function = entry.get("function") if isinstance(entry, dict) and entry.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name or len(name) > 64:
            raise BadRequest("each tool must be {\"type\": \"function\", \"function\": {\"name\": …}}, a name of at "
                             "most 64 characters", f"tools[{index}]")
        assert isinstance(function, dict)
        tools.append(client_tool(name, function.get("description", ""),
                                 function.get("parameters", {"type": "object", "properties": {}}),
                                 f"tools[{index}].function"))
    return tools


def tool_entries(value: Any, kind: str = "function tools") -> list[Any]:
    """A request's `tools`, a list of at most 128 (left out: none); each entry is its API's to read."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 128:
        raise BadRequest(f"tools must be a list of at most 128 {kind}", "tools")
    return value


def client_tool(name: str, description: Any, schema: Any, where: str) -> Tool:
    """A tool the client runs, its schema one the grammar can hold its calls to (a bad one names `where`)."""
    if not isinstance(schema, dict) or not isinstance(description, str):
        raise BadRequest("a tool's parameters must be a JSON schema object and its description text", where)
    _schema(schema, where)
    return Tool(CLIENT_TOOLS, name, description, schema)


def _choice(value: Any, tools: Sequence[Tool]) -> str:
    """tool_choice: auto, none, required, or {"type": "function", "function": {"name": …}}."""
    if isinstance(value, dict):
        function = value.get("function")
        value = function.get("name") if isinstance(function, dict) else None
        if not any(tool.name == value for tool in tools):
            raise BadRequest("tool_choice names no tool of the request's tools", "tool_choice")
        return str(value)
    if value not in CHOICES:
        raise BadRequest("tool_choice must be auto, none, required or a function to call", "tool_choice")
    if value != NONE and not tools:
        raise BadRequest(f"tool_choice {value!r} needs tools", "tool_choice")
    return str(value)


def _message(entry: Any, index: int, form: CallForm) -> Message:
    """One message of the conversation: text content (a list of text parts too), its role's fields."""
    where = f"messages[{index}]"
    role = entry.get("role") if isinstance(entry, dict) else None
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise BadRequest("each message needs a role: system, developer, user, assistant or tool", f"{where}.role")
    assert isinstance(entry, dict)
    content = _text(entry.get("content"), where)
    if role == "tool":
        return tool_result(content, str(entry.get("tool_call_id", "")), form)
    if role == "assistant" and entry.get("tool_calls"):
        return _called(entry["tool_calls"], content, where, form)
    reasoning = entry.get("reasoning_content") if role == "assistant" else ""
    return Message("system" if role == "developer" else role, content,
                   reasoning if isinstance(reasoning, str) else "")


def tool_result(content: str, call_id: str, form: CallForm) -> Message:
    """A tool's result as the model reads it: a `tool` message its template renders, or (the generic form) the
    user's `<tool_response>`."""
    if not form.templated:
        return Message("user", f"<tool_response>\n{content}\n</tool_response>")
    return Message("tool", content, tool_call_id=call_id[:64])


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in content):
            raise BadRequest("only text content parts are supported (this model reads no images or audio)",
                             f"{where}.content")
        return "".join(part["text"] for part in content)
    raise BadRequest("content must be a string or a list of text parts", f"{where}.content")


def _called(calls: Any, content: str, where: str, form: CallForm) -> Message:
    """An assistant message that called tools, as the model's template (or the generic form) reads it."""
    if not isinstance(calls, list):
        raise BadRequest("tool_calls must be a list", f"{where}.tool_calls")
    parsed: list[tuple[str, str, dict[str, Any]]] = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        try:
            arguments = json.loads(function.get("arguments") or "{}") if isinstance(function, dict) else None
        except (TypeError, ValueError, RecursionError):
            arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise BadRequest("a tool call needs function.name and function.arguments, a JSON object as text",
                             f"{where}.tool_calls[{index}]")
        assert isinstance(call, dict)
        parsed.append((str(call.get("id", "")), name, arguments))
    return called(parsed, content, form)


def called(calls: Sequence[tuple[str, str, dict[str, Any]]], content: str, form: CallForm) -> Message:
    """An assistant message that called tools (id, name, arguments each), as the model's template reads it, or
    as the model wrote it in the generic form (its first call: the form makes one a reply)."""
    if not form.templated:
        _, name, arguments = calls[0]
        return Message("assistant", call_text(name, arguments, content, form))
    return Message("assistant", content, tool_calls=tuple(
        {"id": ident[:64], "type": "function", "function": {"name": name, "arguments": arguments}}
        for ident, name, arguments in calls))


# --- responses -------------------------------------------------------------------------------------


def completion_id(prefix: str, number: int) -> str:
    return f"{prefix}-{int(time.time())}{number:06d}"


def logprob_entry(token: Token) -> dict[str, Any]:
    """A token's logprobs in OpenAI's form; the probability of the raw distribution (before any sampler)."""
    return {"token": token.piece, "logprob": _log(token.prob), "bytes": list(token.piece.encode()),
            "top_logprobs": [{"token": c.text, "logprob": _log(c.prob), "bytes": list(c.text.encode())}
                             for c in token.top]}


def logprobs_field(entries: list[dict[str, Any]], chat: bool) -> dict[str, Any]:
    """A choice's `logprobs`: chat's list of entries, or a completion's parallel lists."""
    if chat:
        return {"content": entries}
    offsets, offset = [], 0
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    return {"tokens": [entry["token"] for entry in entries],
            "token_logprobs": [entry["logprob"] for entry in entries],
            "top_logprobs": [{top["token"]: top["logprob"] for top in entry["top_logprobs"]} for entry in entries],
            "text_offset": offsets}


def _log(prob: float | None) -> float:
    return math.log(prob) if prob else -9999.0


def usage(metrics: TurnMetrics) -> dict[str, Any]:
    return {"prompt_tokens": metrics.prompt_tokens, "completion_tokens": metrics.completion_tokens,
            "total_tokens": metrics.prompt_tokens + metrics.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": metrics.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": metrics.reasoning_tokens}}


def timings(metrics: TurnMetrics) -> dict[str, Any]:
    """llama.cpp's server's `timings`, which tui-chat's remote backend (and its panel) reads."""
    read = metrics.prompt_tokens - metrics.cached_tokens
    decode_s = metrics.decode_s
    return {"cache_n": metrics.cached_tokens, "prompt_n": read, "prompt_ms": metrics.prefill_s * 1000,
            "prompt_per_second": read_rate(metrics),
            "predicted_n": metrics.completion_tokens, "predicted_ms": decode_s * 1000,
            "predicted_per_second": (metrics.completion_tokens - 1) / decode_s if decode_s else None}


def extras(done: Done, queued_s: float) -> dict[str, Any]:
    """`x_tui_chat`: the panel's figures of this request (never in OpenAI's own fields), and the engine's own stop
    reason: OpenAI's `length` says both max tokens and a full context."""
    metrics = done.metrics
    return {"stop_reason": done.stop_reason, "ttft_s": metrics.ttft_s, "queued_s": round(queued_s, 4),
            "prefill_tok_s": metrics.prefill_tok_s, "decode_tok_s": metrics.decode_tok_s,
            "cached_tokens": metrics.cached_tokens,
            "read_tokens": metrics.prompt_tokens - metrics.cached_tokens, "kv_used": metrics.context_tokens,
            "n_ctx": metrics.n_ctx, "grammar_ms_per_token": metrics.grammar_ms_per_token}


class CallGate:
    """A streamed reply's text as it may go out while a tool call could begin in it: the text a call's head
    could start with is held back until it is clear that it is text, and nothing goes out once a call has begun
    (a call goes out as the API's call, never as text). Without tools, all text passes at once."""

    def __init__(self, asked: Asked) -> None:
        self.head = asked.form.head if asked.tools and asked.form is not None else ""
        self.held = ""
        self.calling = False
        self.sent = ""  # all that went out

    def shown(self, text: str) -> str:
        """What of `text` may go out now."""
        return self._passed(text) if self.head else self._sent(text)

    def _passed(self, text: str) -> str:
        if self.calling:
            return ""
        held = self.held + text
        start = held.find(self.head.strip() or "\0")
        if start >= 0:
            self.calling, self.held = True, ""
            return self._sent(held[:start])
        keep = next((size for size in range(min(len(held), len(self.head)), 0, -1)
                     if self.head.startswith(held[-size:])), 0)
        self.held = held[len(held) - keep:]
        return self._sent(held[: len(held) - keep])

    def _sent(self, text: str) -> str:
        self.sent += text
        return text

    def rest(self, said: Outcome) -> str:
        """What is left to send of the finished reply's text: the text before its call where that did not go out
        yet (it went out as it came, up to the call), else what was held back."""
        if not said.calls:
            rest, self.held = self.held, ""
            return self._sent(rest)
        before = said.content or ""
        sent = self.sent.strip()
        return self._sent(before[len(sent):] if before.startswith(sent) else "")


@dataclass(slots=True)
class Outcome:
    """A finished reply as the response says it: its text, calls and why it ended."""

    content: str | None
    reasoning: str
    calls: list[dict[str, Any]]
    finish_reason: str


def outcome(done: Done, asked: Asked, number: int) -> Outcome:
    """The reply's text, or the call it made (its arguments checked by the grammar and the schema); a call cut
    short at max_tokens is a call still, its arguments as far as they were written, as OpenAI sends one."""
    finish = FINISH.get(done.stop_reason, "stop")
    tools, form = asked.tools, asked.form
    if not tools or form is None:
        return Outcome(done.text, done.reasoning, [], finish)
    if call := find_call(done.text, tools, form):
        return Outcome(call.before or None, done.reasoning,
                       [_call_entry(number, call.tool.name, json.dumps(call.arguments, ensure_ascii=False))],
                       "tool_calls")
    if cut := cut_call(done, tools, asked.request.tool_choice, form):
        named = cut.tool.name if any(tool.name == cut.tool.name for tool in tools) else ""
        written = done.text[done.text.find(form.head) + len(form.head):]
        arguments = written.split(f'"{form.arguments}": ', 1)[1] if f'"{form.arguments}": ' in written else ""
        return Outcome(cut.before or None, done.reasoning, [_call_entry(number, named, arguments)], finish)
    return Outcome(done.text, done.reasoning, [], finish)


def _call_entry(number: int, name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{number:06d}", "type": "function", "function": {"name": name, "arguments": arguments}}

