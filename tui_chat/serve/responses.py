"""OpenAI's Responses API (`/v1/responses`) over the same engine requests as chat completions: a body is checked
here in the Responses API's names and becomes the same `Asked` through protocol.py's shared pieces (sampling,
tools, the conversation as the model's template reads it), so that a conversation gets the same reply on either
endpoint; the engine's events become a response object, or its server-sent events, and a refusal OpenAI's error
object (the chat endpoint's).

`input` is text or a list of items: messages, the model's earlier `function_call`s and `reasoning`, and the
client's `function_call_output`s. `instructions` are the system prompt. A response's conversation (its input
and output, never its instructions, as OpenAI's `previous_response_id` keeps them) is kept in memory, the last
`REMEMBERED` of them for the server's lifetime, so that a follow-up can send only what is new; `store: false`
keeps none. What this model cannot read (images, files, audio), OpenAI's built-in tools (web search, file
search, computer use…) and what lives on OpenAI's servers (`conversation`, stored `prompt`s, `background`
responses) are refused, naming the field; other fields it does not know (`metadata`, `include`, `truncation`…)
are ignored, as protocol.py ignores chat's.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import Any

from ..engine.base import Done, Message, ModelInfo, Token
from ..engine.params import SamplingParams
from ..tools.calls import AUTO, CHOICES, NONE, REQUIRED, CallForm, call_form
from ..tools.mcp import Tool
from . import protocol
from .monitor import RequestRecord
from .protocol import Asked, BadRequest, Outcome

REMEMBERED = 64  # responses whose conversation `previous_response_id` can continue: the least recently used go
# The Responses API's sampling fields (OpenAI's temperature and top_p; llama.cpp's own pass too, as on the chat).
SAMPLING = (*protocol.SAMPLING_FIELDS, "stream")
# The shared reader's names for the Responses API's fields, a longer name before its prefix; `messages` is the
# engine's refusal of the prompt (too long for the context).
NAMES = {"max_tokens": "max_output_tokens", "response_format.json_schema.schema": "text.format.schema",
         "response_format": "text.format", "messages": "input"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # `none` switches thinking off
UNREADABLE = ("input_image", "input_file", "input_audio")  # content a text model cannot read
ON_OPENAI = {"background": "background responses", "conversation": "conversations",
             "prompt": "stored prompts"}  # what lives on OpenAI's servers: refused, not ignored
IDENTS = {"reasoning": "rs", "message": "msg", "function_call": "fc"}
DELTAS = {"reasoning": "response.reasoning_text", "message": "response.output_text"}  # + .delta, .done


class Memory:
    """The last `size` responses' conversations (input and output as the engine reads them, without their
    instructions) by response id, for `previous_response_id`: in memory for the server's lifetime, the least
    recently used forgotten first; several handler threads at once."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._kept: OrderedDict[str, tuple[Message, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, ident: str, chat: list[Message]) -> None:
        with self._lock:
            self._kept[ident] = tuple(chat)
            self._kept.move_to_end(ident)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)

    def recall(self, ident: Any) -> list[Message]:
        """The conversation of response `ident` (none asked for: none); one not kept is the client's mistake."""
        if ident is None:
            return []
        with self._lock:
            chat = self._kept.get(ident) if isinstance(ident, str) else None
            if chat is not None:
                self._kept.move_to_end(ident)
        if chat is None:
            raise BadRequest(f"previous response {str(ident)[:100]!r} not found: this server keeps the last "
                             f"{self.size} responses' conversations, in memory, until it stops",
                             "previous_response_id", "previous_response_not_found")
        return list(chat)


@dataclass(slots=True)
class Responding(Asked):
    """A Responses API request as the engine takes it, with what its response object says of it (`echo`), its
    conversation without the instructions (`history`) and where it is kept (`memory`, None: `store: false`)."""

    echo: dict[str, Any] = field(default_factory=dict)
    history: list[Message] = field(default_factory=list)
    memory: Memory | None = None


def parse_responses(body: dict[str, Any], defaults: SamplingParams, info: ModelInfo, room: int,
                    memory: Memory) -> Responding:
    """A `/v1/responses` body; a `previous_response_id` continues the conversation `memory` kept."""
    for name, what in ON_OPENAI.items():
        if body.get(name):
            raise BadRequest(f"{what} are not supported: this server keeps nothing but the last responses' "
                             "conversations (previous_response_id)", name, "unsupported_parameter")
    form = call_form(info)
    tools = _tools(body.get("tools"))
    choice = _choice(body.get("tool_choice"), tools)
    thinking = _thinking(body.get("reasoning"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions must be a string (the system prompt)", "instructions")
    store = body.get("store", True)
    if not isinstance(store, bool | None):
        raise BadRequest("store must be true or false", "store")
    history = [*memory.recall(body.get("previous_response_id")), *_conversation(body.get("input"), form)]
    limit = body.get("max_output_tokens")
    text, wanted = _format(body.get("text"))
    with protocol.renamed(NAMES):
        asked = protocol.common({name: body[name] for name in SAMPLING if name in body}
                                | ({"max_tokens": limit} if limit is not None else {}) | wanted, defaults, room)
        protocol.converse(asked, _prompt(instructions or "", history), tools, choice, form)
    if thinking is not None:
        asked.request.thinking = thinking
    asked.format_field = NAMES.get(asked.format_field, asked.format_field)
    params = asked.request.params.snapshot()[1]
    echo = {"instructions": instructions or None, "max_output_tokens": limit,
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
            "store": store is not False, "temperature": params.temperature, "top_p": params.top_p, "text": text,
            "tool_choice": choice if choice in CHOICES else {"type": "function", "name": choice},
            "tools": [{"type": "function", "name": tool.name, "description": tool.description or None,
                       "parameters": tool.schema, "strict": strict}
                      for tool, strict in zip(tools, _strict(body.get("tools")), strict=True)],
            "truncation": "disabled", "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict)
            else {}}
    kept = {item.name: getattr(asked, item.name) for item in fields(Asked)}
    return Responding(**kept, echo=echo, history=history, memory=memory if store is not False else None)


def _format(value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """`text.format` (text, json_object, or json_schema with its name, schema and strict) as the response says it
    and as the shared reader's `response_format`."""
    wanted = value.get("format") if isinstance(value, dict) else None
    if value is not None and not isinstance(value, dict):
        raise BadRequest('text must be an object: {"format": {"type": "text" | "json_object" | "json_schema"}}', "text")
    kind = wanted.get("type") if isinstance(wanted, dict) else None
    if wanted is None or kind == "text":
        return {"format": {"type": "text"}}, {}
    assert isinstance(wanted, dict)
    if kind == "json_object":
        return {"format": {"type": "json_object"}}, {"response_format": {"type": "json_object"}}
    if kind != "json_schema":
        raise BadRequest("text.format.type must be text, json_object or json_schema", "text.format.type")
    schema = wanted.get("schema")
    if not isinstance(schema, dict):
        raise BadRequest("text.format.schema must be a JSON schema object", "text.format.schema")
    said = {"type": "json_schema", "name": "response"} | {name: wanted[name] for name in (
        "name", "schema", "strict", "description") if wanted.get(name) is not None}
    return {"format": said}, {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


def _thinking(value: Any) -> bool | None:
    """`reasoning.effort` as the engine's thinking switch (a reasoning model's): `none` off, any other on; left
    out, the server's default (on, as on the chat endpoint)."""
    if value is None:
        return None
    effort = value.get("effort") if isinstance(value, dict) else ""
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise BadRequest(f"reasoning.effort must be one of {', '.join(EFFORTS)} (none switches thinking off)",
                         "reasoning.effort" if isinstance(value, dict) else "reasoning")
    return effort != "none"


def _tools(value: Any) -> list[Tool]:
    """Function tools, in the Responses API's flat shape (`name`, `description`, `parameters` beside `type`); its
    built-in tools (web search, file search, computer use…) run on OpenAI's servers, so they are refused."""
    tools = []
    for index, entry in enumerate(protocol.tool_entries(value)):
        where = f"tools[{index}]"
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind != "function":
            raise BadRequest(f"only function tools are supported here; {str(kind)[:60]!r} is one of OpenAI's built-in "
                             "tools" if isinstance(kind, str) else 'each tool must be {"type": "function", "name": …, '
                             '"parameters": {…}}', where)
        assert isinstance(entry, dict)
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise BadRequest("each tool needs a name of at most 64 characters", f"{where}.name")
        schema = entry.get("parameters")
        tools.append(protocol.client_tool(name, entry.get("description") or "",
                                          {"type": "object", "properties": {}} if schema is None else schema,
                                          f"{where}.parameters"))
    return tools


def _strict(value: Any) -> list[bool]:
    """Each (checked) tool's `strict`, as its response says it: true unless sent false (its calls are held to
    the schema by the grammar either way)."""
    return [entry.get("strict") is not False for entry in value or ()]


def _choice(value: Any, tools: list[Tool]) -> str:
    """`tool_choice`: auto, none, required, or {"type": "function", "name": …}; left out, auto with tools."""
    if value is None:
        return AUTO if tools else NONE
    if isinstance(value, dict):
        if value.get("type") != "function":
            raise BadRequest('tool_choice must be auto, none, required or {"type": "function", "name": …} (only '
                             "function tools are supported here)", "tool_choice")
        name = value.get("name")
        if not any(tool.name == name for tool in tools):
            raise BadRequest("tool_choice.name names no tool of the request's tools", "tool_choice.name")
        return str(name)
    if value not in CHOICES:
        raise BadRequest('tool_choice must be auto, none, required or {"type": "function", "name": …}', "tool_choice")
    if value == REQUIRED and not tools:
        raise BadRequest("tool_choice 'required' needs tools", "tool_choice")
    return str(value) if tools else NONE


def _prompt(instructions: str, chat: list[Message]) -> list[Message]:
    """The instructions as the system prompt, the input's own system messages at its start joined to it (a
    template takes one system prompt, first)."""
    lead = next((index for index, message in enumerate(chat) if message.role != "system"), len(chat))
    system = "\n\n".join(part for part in (instructions, *(message.content for message in chat[:lead])) if part)
    return [Message("system", system), *chat[lead:]] if system else chat[lead:]


def _conversation(value: Any, form: CallForm) -> list[Message]:
    """`input` as the engine's messages: text is the user's; of a list of items, an assistant's message, its
    reasoning and its calls are one turn, as the model wrote them (and as its template reads them)."""
    if isinstance(value, str) and value:
        return [Message("user", value)]
    if not isinstance(value, list) or not value:
        raise BadRequest("input must be text or a non-empty list of input items", "input")
    chat: list[Message] = []
    turn = _Turn(form)
    for index, item in enumerate(value):
        where = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if not isinstance(item, dict) or kind not in ("message", "function_call", "function_call_output",
                                                      "reasoning"):
            raise BadRequest(f"input items of type {str(kind)[:60]!r} are not supported here: message, function_call, "
                             "function_call_output and reasoning are", where)
        if kind == "message" and item.get("role") == "assistant":
            turn.text.append(_text(item.get("content"), where))
        elif kind == "reasoning":
            turn.reasoning.append(_reasoning(item, where))
        elif kind == "function_call":
            turn.calls.append(_call(item, where))
        else:
            chat.extend(turn.said())
            chat.append(_message(item, where) if kind == "message" else _result(item, where, form))
    return chat + turn.said()


@dataclass(slots=True)
class _Turn:
    """An assistant's turn being read: its messages' text, its reasoning and its calls."""

    form: CallForm
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def said(self) -> list[Message]:
        """The turn as one message (none if it said nothing), and a new one begun."""
        text, reasoning, calls = "".join(self.text), "".join(self.reasoning), self.calls
        spoke = bool(self.text or calls)
        self.text, self.reasoning, self.calls = [], [], []
        if not spoke:
            return []
        return [protocol.called(calls, text, self.form) if calls else Message("assistant", text, reasoning)]


def _message(item: dict[str, Any], where: str) -> Message:
    role = item.get("role")
    if role not in ("user", "system", "developer"):
        raise BadRequest("each message needs a role: user, assistant, system or developer", f"{where}.role")
    return Message("user" if role == "user" else "system", _text(item.get("content"), where))


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts (`input_text`, `output_text`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest("content must be a string or a list of input_text parts", f"{where}.content")
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNREADABLE:
            raise BadRequest(f"{kind} content is not supported: this model reads text only",
                             f"{where}.content[{index}]")
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise BadRequest("content parts must be input_text or output_text, with their text",
                             f"{where}.content[{index}]")
    return "".join(part["text"] for part in content)


def _reasoning(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text (its `content`, else its `summary`): templates that show earlier thinking read it."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(isinstance(part, dict) and isinstance(part.get("text"), str)
                                              for part in parts):
        raise BadRequest("a reasoning item's content and summary must be lists of parts with their text", where)
    return "".join(part["text"] for part in parts)


def _call(item: dict[str, Any], where: str) -> tuple[str, str, dict[str, Any]]:
    ident, name = item.get("call_id"), item.get("name")
    try:
        arguments = json.loads(item.get("arguments") or "{}")
    except (TypeError, ValueError, RecursionError):
        arguments = None
    if not isinstance(ident, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise BadRequest("a function_call needs a call_id, a name and arguments, a JSON object as text", where)
    return ident, name, arguments


def _result(item: dict[str, Any], where: str, form: CallForm) -> Message:
    ident, output = item.get("call_id"), item.get("output")
    if not isinstance(ident, str) or not isinstance(output, str | list):
        raise BadRequest("a function_call_output needs a call_id and its output, text or input_text parts", where)
    return protocol.tool_result(_text(output, where) if isinstance(output, list) else output, ident, form)


# --- responses -------------------------------------------------------------------------------------


def usage(done: Done) -> dict[str, Any]:
    metrics = done.metrics
    return {"input_tokens": metrics.prompt_tokens,
            "input_tokens_details": {"cached_tokens": metrics.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": metrics.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": metrics.reasoning_tokens},
            "total_tokens": metrics.prompt_tokens + metrics.completion_tokens}


def response(turn: Responding, record: RequestRecord, model: str, status: str, output: list[dict[str, Any]],
             done: Done | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The response object: its state, its output items, what the request asked for, and once done its usage
    and the server's figures (`x_tui_chat`, as the chat's)."""
    ended = {"usage": usage(done), "x_tui_chat": protocol.extras(done, record.queued_s)} if done else {"usage": None}
    return {"id": record.ident, "object": "response", "created_at": int(record.wall_started), "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": model, "output": output, **turn.echo} | ended


def _status(said: Outcome) -> str:
    """A reply cut at max_output_tokens (or the context's end) is incomplete, as OpenAI says a reply cut short."""
    return "incomplete" if said.finish_reason == "length" else "completed"


def _ident(kind: str, number: int, index: int) -> str:
    return f"{IDENTS[kind]}_{number:08d}{index:02d}"


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _item(kind: str, ident: str, status: str, text: str | None = None) -> dict[str, Any]:
    """A reasoning or message output item; its text none yet: an item just begun, no content."""
    content = [] if text is None else [_part(kind, text)]
    if kind == "reasoning":
        return {"type": "reasoning", "id": ident, "summary": [], "content": content, "status": status}
    return {"type": "message", "id": ident, "role": "assistant", "status": status, "content": content}


def _call_item(call: dict[str, Any], ident: str, said: Outcome) -> dict[str, Any]:
    """A call as a function_call item: a call cut short at max_output_tokens, incomplete, its arguments as far
    as they were written."""
    status = "completed" if said.finish_reason == "tool_calls" else "incomplete"
    return {"type": "function_call", "id": ident, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def _turn(asked: Asked) -> Responding:
    assert isinstance(asked, Responding)
    return asked


def _remember(turn: Responding, record: RequestRecord, said: Outcome) -> None:
    """The conversation and the reply kept for `previous_response_id` (not with `store: false`)."""
    if turn.memory is None or turn.form is None:
        return
    if said.finish_reason == "tool_calls":
        reply = protocol.called([(call["id"], call["function"]["name"], json.loads(call["function"]["arguments"]))
                                 for call in said.calls], said.content or "", turn.form)
    else:
        reply = Message("assistant", said.content or "", said.reasoning)
    turn.memory.keep(record.ident, [*turn.history, reply])


class WholeResponse(protocol.WholeAnswer):
    """A response answered whole, once it is done: its reasoning, its message (unless it only called) and its
    calls as output items."""

    def done(self, done: Done) -> None:
        turn, number = _turn(self.asked), self.record.number
        said = protocol.outcome(done, self.asked, number)
        status = _status(said)
        written = [("reasoning", said.reasoning, "completed")] if said.reasoning else []
        if said.content or not said.calls:
            written.append(("message", said.content or "", "completed" if said.calls else status))
        output = [_item(kind, _ident(kind, number, index), state, text)
                  for index, (kind, text, state) in enumerate(written)]
        output += [_call_item(call, _ident("function_call", number, len(output) + index), said)
                   for index, call in enumerate(said.calls)]
        _remember(turn, self.record, said)
        self.wire.reply_json(200, response(turn, self.record, self.model, status, output, done))


class StreamedResponse(protocol.WholeAnswer):
    """A response as the Responses API's server-sent events, each with its `sequence_number`: `response.created`
    and `response.in_progress`; for each output item (reasoning, message, function_call) its
    `output_item.added`, content part, deltas and `.done` events; then `response.completed` (or
    `response.incomplete`, or `response.failed` when the engine fails). A tool call's text is held back
    (protocol.CallGate) and goes out as its function_call item."""

    def __init__(self, wire: protocol.Wire, asked: Asked, record: RequestRecord, model: str) -> None:
        super().__init__(wire, asked, record, model)
        self.turn = _turn(asked)
        self.gate = protocol.CallGate(asked)
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items finished
        self.kind, self.text = "", ""  # the item open (reasoning or message, "" none) and its text so far
        wire.open_events()
        begun = response(self.turn, record, model, "in_progress", [])
        self._event("response.created", {"response": begun})
        self._event("response.in_progress", {"response": begun})

    def token(self, token: Token) -> None:
        if token.reasoning:
            self._add("reasoning", token.reasoning)
        elif text := self.gate.shown(token.text):
            self._add("message", text)

    def flush(self) -> None:
        self.wire.wfile.flush()

    def done(self, done: Done) -> None:
        said = protocol.outcome(done, self.asked, self.record.number)
        status = _status(said)
        if rest := self.gate.rest(said):
            self._add("message", rest)
        if not said.calls and self.kind != "message" and all(item["type"] != "message" for item in self.output):
            self._add("message", "")
        self._close("completed" if said.calls else status)
        for call in said.calls:
            index = len(self.output)
            item = _call_item(call, _ident("function_call", self.record.number, index), said)
            where = {"item_id": item["id"], "output_index": index}
            self._event("response.output_item.added", {"output_index": index,
                                                       "item": item | {"arguments": "", "status": "in_progress"}})
            self._event("response.function_call_arguments.delta", where | {"delta": item["arguments"]})
            self._event("response.function_call_arguments.done", where | {"arguments": item["arguments"]})
            self._event("response.output_item.done", {"output_index": index, "item": item})
            self.output.append(item)
        _remember(self.turn, self.record, said)
        self._event(f"response.{status}", {"response": response(self.turn, self.record, self.model, status,
                                                                self.output, done)})
        self.flush()

    def failed(self, message: str) -> None:
        self._close("incomplete")
        self._event("response.failed", {"response": response(self.turn, self.record, self.model, "failed",
                                                             self.output,
                                                             error={"code": "server_error", "message": message})})
        self.flush()

    def _add(self, kind: str, text: str) -> None:
        """Text to the open item of `kind`: another kind's is closed and this one begun first."""
        if self.kind != kind:
            self._close("completed")
            self.kind, self.text = kind, ""
            where = self._where()
            self._event("response.output_item.added", {"output_index": where["output_index"],
                                                       "item": _item(kind, where["item_id"], "in_progress")})
            self._event("response.content_part.added", where | {"content_index": 0, "part": _part(kind, "")})
        if text:
            self.text += text
            self._event(f"{DELTAS[kind]}.delta", self._where() | {"content_index": 0, "delta": text}
                        | ({"logprobs": []} if kind == "message" else {}))

    def _close(self, status: str) -> None:
        kind = self.kind
        if not kind:
            return
        where = self._where()
        self._event(f"{DELTAS[kind]}.done", where | {"content_index": 0, "text": self.text}
                    | ({"logprobs": []} if kind == "message" else {}))
        self._event("response.content_part.done", where | {"content_index": 0, "part": _part(kind, self.text)})
        item = _item(kind, where["item_id"], status, self.text)
        self._event("response.output_item.done", {"output_index": where["output_index"], "item": item})
        self.output.append(item)
        self.kind = ""

    def _where(self) -> dict[str, Any]:
        """The open item's id and index, as its events name it."""
        index = len(self.output)
        return {"item_id": _ident(self.kind, self.record.number, index), "output_index": index}

    def _event(self, name: str, payload: dict[str, Any]) -> None:
        data = json.dumps({"type": name, "sequence_number": self.sequence, **payload}, ensure_ascii=False)
        self.sequence += 1
        self.wire.wfile.write(f"event: {name}\ndata: {data}\n\n".encode())
