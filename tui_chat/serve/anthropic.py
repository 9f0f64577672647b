"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over the same engine requests as
OpenAI's chat: a body is checked here in Anthropic's names and becomes the same `Asked` through protocol.py's
shared pieces (sampling, tools, the conversation as the model's template reads it), so that a conversation
gets the same reply on either endpoint; the engine's events become Anthropic's message, or its server-sent
events, and a refusal Anthropic's error object.

Where Anthropic and tui-chat differ, Anthropic's meaning is kept: `max_tokens` is required, consecutive turns
of one role are one turn, a reply thinks only when `thinking` asks it to, and `input_tokens` leaves out what
was read from the cache (`cache_read_input_tokens`). What this model cannot read (images, documents) and
Anthropic's own server tools are refused, naming the block or the tool; other fields it does not know (e.g.
`metadata`, `cache_control`) are ignored, as protocol.py ignores OpenAI's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..engine.base import Done, Message, ModelInfo, PromptProgress, Token, TurnMetrics
from ..engine.params import SPECS, SamplingParams
from ..tools.calls import AUTO, NONE, REQUIRED, CallForm, call_form
from ..tools.mcp import Tool
from . import protocol
from .monitor import RequestRecord
from .protocol import Asked, BadRequest, Outcome

# What Anthropic's sampling fields are called in the shared reader (the same, but for the stops); llama.cpp's
# own sampling fields (min_p, repeat_penalty…) pass too, as they do on the OpenAI endpoints.
SAMPLING = (*protocol.SAMPLING_FIELDS, "max_tokens", "stream")
CHOICES = {"auto": AUTO, "any": REQUIRED, "none": NONE}  # "tool" names one: the choice is its name
TEXT_ONLY = ("image", "document", "search_result", "container_upload")  # blocks a text model cannot read
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
NAMES = {"response_format.json_schema.schema": "output_config.format.schema", "response_format": "output_config.format",
         "thinking_budget_tokens": "thinking.budget_tokens"}  # the shared reader's names for Anthropic's fields
BUSY = 529  # a full queue: Anthropic's overloaded_error, which its clients wait for and send again


def parse_messages(body: dict[str, Any], defaults: SamplingParams, info: ModelInfo, room: int, *,
                   counting: bool = False) -> Asked:
    """A `/v1/messages` body; `counting`, a `count_tokens` one (no max_tokens): a one-token request whose
    prompt is the one the same body would have as a message."""
    if counting:
        body = {name: value for name, value in body.items() if name not in SAMPLING} | {"max_tokens": 1}
    elif body.get("max_tokens") is None:
        raise BadRequest("max_tokens is required: the most tokens the reply may take", "max_tokens")
    thinking, budget = _thinking(body.get("thinking"))
    form = call_form(info)
    tools = _tools(body.get("tools"))
    with protocol.renamed(NAMES):
        asked = protocol.common({name: body[name] for name in SAMPLING if name in body}
                                | protocol.stops(body.get("stop_sequences"), "stop_sequences")
                                | ({"thinking_budget_tokens": budget} if budget else {}) | _format(body),
                                defaults, room)
        protocol.converse(asked, _conversation(body, form), tools, _choice(body.get("tool_choice"), tools), form)
    asked.request.thinking = thinking
    asked.format_field = NAMES.get(asked.format_field, asked.format_field)
    return asked


def _format(body: dict[str, Any]) -> dict[str, Any]:
    """Structured output (`output_config.format`, or the older `output_format`: a JSON schema) as the shared
    reader's `response_format`."""
    config = body.get("output_config")
    wanted = config.get("format") if isinstance(config, dict) else None
    wanted = body.get("output_format") if wanted is None else wanted
    if wanted is None:
        return {}
    schema = wanted.get("schema") if isinstance(wanted, dict) else None
    if not isinstance(wanted, dict) or wanted.get("type") != "json_schema" or not isinstance(schema, dict):
        raise BadRequest('output_config.format must be {"type": "json_schema", "schema": {…}}, the schema a JSON '
                         "schema object", "output_config.format")
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


def _thinking(value: Any) -> tuple[bool, int]:
    """Anthropic's `thinking` as the engine's switch and budget: off unless asked for (an Anthropic client
    reads no thinking blocks it did not ask for); `enabled` with `budget_tokens`, `adaptive` (or `between_tools`)
    without one."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "disabled":
        return False, 0
    if kind in ("adaptive", "between_tools"):
        return True, 0
    budget = value.get("budget_tokens") if isinstance(value, dict) else None
    if kind != "enabled" or isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise BadRequest('thinking must be {"type": "enabled", "budget_tokens": N} (a whole number, 1 or more), '
                         '{"type": "adaptive"} or {"type": "disabled"}', "thinking")
    return True, min(budget, int(SPECS["thinking_budget"].maximum))  # a budget past any reply's: none


def _tools(value: Any) -> list[Tool]:
    """Anthropic's client tools (`name`, `description`, `input_schema`); its own server tools (web search, code
    execution…) run on Anthropic's servers, so they are refused, not ignored."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 128:
        raise BadRequest("tools must be a list of at most 128 tools", "tools")
    tools = []
    for index, entry in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(entry, dict):
            raise BadRequest("each tool must be an object: name, description, input_schema", where)
        if entry.get("type", "custom") != "custom":
            raise BadRequest(f"only client tools (name, description, input_schema) are supported here; "
                             f"{str(entry['type'])[:60]!r} is one of Anthropic's server tools", where)
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise BadRequest("each tool needs a name of at most 64 characters", f"{where}.name")
        if "input_schema" not in entry:
            raise BadRequest("each tool needs an input_schema, a JSON schema object", f"{where}.input_schema")
        tools.append(protocol.client_tool(name, entry.get("description", ""), entry["input_schema"],
                                          f"{where}.input_schema"))
    return tools


def _choice(value: Any, tools: list[Tool]) -> str:
    """`tool_choice` (auto, any, tool with its name, none) as the engine's: auto, required, the name, none."""
    if value is None:
        return AUTO if tools else NONE
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "tool":
        name = value.get("name") if isinstance(value, dict) else None
        if not any(tool.name == name for tool in tools):
            raise BadRequest("tool_choice.name names no tool of the request's tools", "tool_choice.name")
        return str(name)
    if kind not in CHOICES:
        raise BadRequest('tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
                         '{"type": "tool", "name": …}', "tool_choice")
    if kind == "any" and not tools:
        raise BadRequest('tool_choice {"type": "any"} needs tools', "tool_choice")
    return CHOICES[str(kind)] if tools else NONE


def _conversation(body: dict[str, Any], form: CallForm) -> list[Message]:
    """The system prompt and the turns as the engine takes them; consecutive turns of one role are one turn,
    as Anthropic reads them (a template that wants roles in turn would refuse them otherwise)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of messages", "messages")
    system = _system(body.get("system"))
    chat = [Message("system", system)] if system else []
    for index, entry in enumerate(messages):
        for message in _turn(entry, f"messages[{index}]", form):
            last = chat[-1] if chat else None
            if last is not None and last.role == message.role != "tool" and not last.tool_calls \
                    and not message.tool_calls and not last.reasoning:
                chat[-1] = Message(last.role, f"{last.content}\n\n{message.content}", message.reasoning)
            else:
                chat.append(message)
    return chat


def _system(value: Any) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):
        return _text_of(value, "system")
    raise BadRequest("system must be a string or a list of text blocks", "system")


def _text_of(blocks: list[Any], where: str) -> str:
    """The text of a list of text blocks (a system prompt, a tool's result)."""
    for index, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadRequest(_unreadable(block) or "only text blocks are supported here", f"{where}[{index}]")
    return "\n\n".join(block["text"] for block in blocks)


def _unreadable(block: Any) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in TEXT_ONLY:
        return f"{kind} content is not supported: this model reads text only"
    return ""


def _turn(entry: Any, where: str, form: CallForm) -> list[Message]:
    """One of Anthropic's turns: a user's text and tool results, or an assistant's text, thinking and calls."""
    role = entry.get("role") if isinstance(entry, dict) else None
    if role not in ("user", "assistant"):
        raise BadRequest("each message needs a role: user or assistant", f"{where}.role")
    assert isinstance(entry, dict)
    content = entry.get("content")
    if isinstance(content, str):
        return [Message(role, content)]
    if not isinstance(content, list):
        raise BadRequest("content must be a string or a list of content blocks", f"{where}.content")
    kinds = ("text", "tool_result") if role == "user" else ("text", "thinking", "redacted_thinking", "tool_use")
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in kinds:
            raise BadRequest(_unreadable(block) or f"a {role}'s content blocks are {', '.join(kinds)}",
                             f"{where}.content[{index}]")
    return _user(content, where, form) if role == "user" else [_assistant(content, where, form)]


def _user(blocks: list[dict[str, Any]], where: str, form: CallForm) -> list[Message]:
    """Tool results first (each as the model reads one), then the user's text, if any."""
    results = [_result(block, f"{where}.content[{index}]", form) for index, block in enumerate(blocks)
               if block["type"] == "tool_result"]
    text = _joined(blocks, "text", where)
    return [*results, Message("user", text)] if text or not results else results


def _result(block: dict[str, Any], where: str, form: CallForm) -> Message:
    content = block.get("content", "")
    text = content if isinstance(content, str) else _text_of(content, f"{where}.content") \
        if isinstance(content, list) else None
    ident = block.get("tool_use_id")
    if text is None or not isinstance(ident, str):
        raise BadRequest("a tool_result needs a tool_use_id and content, text or text blocks", where)
    return protocol.tool_result(f"Error: {text}" if block.get("is_error") is True else text, ident, form)


def _assistant(blocks: list[dict[str, Any]], where: str, form: CallForm) -> Message:
    """An assistant's turn: its text, its thinking (`reasoning`, which templates that show it read), its calls."""
    calls = []
    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            ident, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(ident, str) or not isinstance(name, str) or not isinstance(arguments, dict):
                raise BadRequest("a tool_use needs an id, a name and an input object", f"{where}.content[{index}]")
            calls.append((ident, name, arguments))
    text = _joined(blocks, "text", where)
    if calls:
        return protocol.called(calls, text, form)
    return Message("assistant", text, _joined(blocks, "thinking", where))


def _joined(blocks: list[dict[str, Any]], kind: str, where: str) -> str:
    """The text of the blocks of one kind (`text` or `thinking`), in order."""
    parts = [block.get(kind) for block in blocks if block["type"] == kind]
    if not all(isinstance(part, str) for part in parts):
        raise BadRequest(f"a {kind} block's {kind} must be a string", f"{where}.content")
    return "".join(str(part) for part in parts)


# --- responses -------------------------------------------------------------------------------------


def refusal(error: BadRequest) -> tuple[int, dict[str, Any]]:
    """A refusal in Anthropic's shape: its status (a full queue is Anthropic's 529) and error object."""
    status = BUSY if error.status == 429 else error.status
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, error_body(_named(str(error), error.param), kind)


def _named(message: str, param: str | None) -> str:
    """The message led by the field it is about, as Anthropic's are (`messages.0.content.1: …`), unless it
    begins with the field's name already."""
    if not param or message.startswith(param):
        return message
    return re.sub(r"\[(\d+)\]", r".\1", param) + f": {message}"


def error_body(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def usage(metrics: TurnMetrics | None, progress: PromptProgress | None = None) -> dict[str, Any]:
    """Anthropic's usage: the prompt's tokens read (`input_tokens`) and those reused from the slot's cache
    (`cache_read_input_tokens`: together, the whole prompt), and the reply's; before the reply, from the
    prompt's first progress (its tokens, and those left to read)."""
    if metrics is not None:
        whole, cached, written = metrics.prompt_tokens, metrics.cached_tokens, metrics.completion_tokens
    else:
        whole = len(progress.prompt_ids) if progress is not None else 0
        cached, written = whole - progress.total if progress is not None and whole else 0, 0
    thought = {"output_tokens_details": {"thinking_tokens": metrics.reasoning_tokens}} if metrics else {}
    return {"input_tokens": whole - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": written} | thought


def _stop(done: Done, said: Outcome, asked: Asked) -> tuple[str, str | None]:
    """Why the message ended, and the stop sequence it ended on (one of the request's, not a template's own)."""
    if said.finish_reason == "tool_calls":
        return "tool_use", None
    if said.finish_reason == "length":
        return "max_tokens", None
    if done.stop_reason == "stop" and done.stop_sequence in asked.request.params.snapshot()[1].stop:
        return "stop_sequence", done.stop_sequence
    return "end_turn", None


def _calls(said: Outcome) -> list[dict[str, Any]]:
    """The reply's calls as `tool_use` blocks: only whole ones (a call cut short at max_tokens has no input to
    run: the message ends `max_tokens` without it)."""
    if said.finish_reason != "tool_calls":
        return []
    return [{"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
             "input": json.loads(call["function"]["arguments"])} for call in said.calls]


class WholeMessage(protocol.WholeAnswer):
    """A message answered whole, once it is done."""

    def done(self, done: Done) -> None:
        said = protocol.outcome(done, self.asked, self.record.number)
        blocks = [{"type": "thinking", "thinking": said.reasoning, "signature": ""}] if said.reasoning else []
        calls = _calls(said)
        if said.content or not calls:
            blocks.append({"type": "text", "text": said.content or ""})
        stop_reason, stop_sequence = _stop(done, said, self.asked)
        self.wire.reply_json(200, {"id": self.record.ident, "type": "message", "role": "assistant",
                                   "model": self.model, "content": blocks + calls, "stop_reason": stop_reason,
                                   "stop_sequence": stop_sequence, "usage": usage(done.metrics)})


class TokenCount(protocol.WholeAnswer):
    """`count_tokens`: the prompt's tokens as the engine read them (a one-token reply to the same body)."""

    def done(self, done: Done) -> None:
        self.wire.reply_json(200, {"input_tokens": done.metrics.prompt_tokens})


class StreamedMessage(protocol.WholeAnswer):
    """A message as Anthropic's server-sent events: `message_start`; for each content block (thinking, text,
    tool_use) its `content_block_start`, deltas and `content_block_stop`; `message_delta` with the stop reason
    and usage; `message_stop`. A tool call's text is held back (protocol.CallGate) and goes out as its block."""

    def __init__(self, wire: protocol.Wire, asked: Asked, record: RequestRecord, model: str) -> None:
        super().__init__(wire, asked, record, model)
        self.gate = protocol.CallGate(asked)
        self.started = False
        self.block = ""  # the kind of the content block open ("" none)
        self.index = -1
        wire.open_events()

    def progress(self, progress: PromptProgress) -> None:
        self._start(progress)

    def token(self, token: Token) -> None:
        self._start()
        if token.reasoning:
            self._delta("thinking", {"type": "thinking_delta", "thinking": token.reasoning})
        elif text := self.gate.shown(token.text):
            self._delta("text", {"type": "text_delta", "text": text})

    def flush(self) -> None:
        self.wire.wfile.flush()

    def done(self, done: Done) -> None:
        self._start()
        said = protocol.outcome(done, self.asked, self.record.number)
        if rest := self.gate.rest(said):
            self._delta("text", {"type": "text_delta", "text": rest})
        for call in _calls(said):
            arguments = json.dumps(call["input"], ensure_ascii=False)
            self._delta("tool_use", {"type": "input_json_delta", "partial_json": arguments}, dict(call, input={}))
            self._close()
        if self.index < 0:
            self._open("text", {"type": "text", "text": ""})
        self._close()
        stop_reason, stop_sequence = _stop(done, said, self.asked)
        self._event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                      "usage": usage(done.metrics)})
        self._event("message_stop", {})
        self.flush()

    def failed(self, message: str) -> None:
        self._event("error", error_body(message))
        self.flush()

    def _start(self, progress: PromptProgress | None = None) -> None:
        """`message_start`, once, at the first event: its usage from the prompt's first progress."""
        if not self.started:
            self.started = True
            self._event("message_start", {"message": {
                "id": self.record.ident, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": usage(None, progress)}})

    def _delta(self, kind: str, delta: dict[str, Any], block: dict[str, Any] | None = None) -> None:
        """A delta to the open block of `kind`: another kind's is closed and this one opened first."""
        if self.block != kind or block is not None:
            self._close()
            self._open(kind, block or {"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {}))
        self._event("content_block_delta", {"index": self.index, "delta": delta})

    def _open(self, kind: str, block: dict[str, Any]) -> None:
        self.index += 1
        self.block = kind
        self._event("content_block_start", {"index": self.index, "content_block": block})

    def _close(self) -> None:
        if self.block:
            self._event("content_block_stop", {"index": self.index})
            self.block = ""

    def _event(self, name: str, payload: dict[str, Any]) -> None:
        data = json.dumps(payload if name == "error" else {"type": name, **payload}, ensure_ascii=False)
        self.wire.wfile.write(f"event: {name}\ndata: {data}\n\n".encode())
