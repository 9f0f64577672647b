"""How a model calls tools, and how its calls are kept valid.

A model whose own chat template takes tools in a form we know (engine/prompts.py CALL_SYNTAXES: Hermes' and
Qwen's `<tool_call>`, Llama 3.x's bare JSON, Mistral's `[TOOL_CALLS]`) is given them as transformers gives
them, `tools=[…]` in JSON-schema form, calls one in its family's form, and gets the call back as the
assistant's `tool_calls` and its result as a `tool` message: the template renders both, as the model was
trained to read them. A model whose template takes no tools (a base model such as the starter) is told of
them in the system prompt and calls one in the generic form, documented in the README:

    <tool_call>{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}</tool_call>

(Hermes' and Qwen's form, on one line); the result comes back as the next user message,
`<tool_response>…</tool_response>`. A call is written under an LLGuidance grammar built from the tools'
input schemas: with `required` or a tool's name, from the reply's first token; with `auto`, text is free
until the model opens a call (a lazy trigger on a text marker; Mistral's special token, or Llama's `{`, at
the reply's start), and from there on only a call to a listed tool with arguments its schema allows can
follow. So a call always parses. What the grammar cannot enforce of a schema it is compiled without
(`lenient`), and the arguments are checked with jsonschema before the call runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.base import Done, Message, ModelInfo, ToolCall
from ..engine.formats import TEXT, OutputFormat
from ..engine.params import InvalidParameter
from ..engine.prompts import CALL_SYNTAXES
from ..engine.schema import violation, writing_schema
from ..safetext import terminal_safe
from .mcp import Tool

AUTO, NONE, REQUIRED = "auto", "none", "required"
CHOICES = (AUTO, NONE, REQUIRED)
MAX_NAME = 200  # characters of a server's call (a tool's name, arguments that do not parse) said back
OPEN, CLOSE = "<tool_call>", "</tool_call>"
# Compact JSON in calls: one space after `:` and `,`, no newlines, so a small model cannot wander in blanks.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


@dataclass(frozen=True, slots=True)
class CallForm:
    """How one model writes calls: `head`, `{"name": NAME, ARGUMENTS: {…}}`, `tail`. `templated`: its template
    takes the tools and renders calls and results (else the system prompt describes them, generic form).
    `marker` opens a call; `tokens`: the markers that are one token each, which a grammar names by id."""

    head: str
    tail: str
    marker: str
    arguments: str = "arguments"
    tokens: dict[str, int] = field(default_factory=dict)
    templated: bool = False
    served: bool = False  # a server's model: tools and calls go in the API's own fields, written without a grammar

    @property
    def opened_by_token(self) -> bool:
        return self.marker in self.tokens

    @property
    def text_rule(self) -> str:
        """Lark's TEXT: a reply that makes no call."""
        if not self.head:  # Llama 3.x: a call is the whole reply, so text is what does not start as one
            return r"TEXT: /([^{](.|\n)*)?/"
        if self.opened_by_token:  # a token LLGuidance reads as special is never text
            return r"TEXT: /(.|\n)*/"
        # nor the marker, nor a near miss of it (`<tool_call}`: a call gone wrong, which nothing would run)
        return f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{re.escape(self.marker[:-1])}(.|\\n)*/"

    def lark(self, text: str) -> str:
        """Lark for `text`: each marker that is one token by its id, the rest as literals."""
        if not self.tokens:
            return _literal(text) if text else ""
        pieces = re.split(f"({'|'.join(re.escape(marker) for marker in self.tokens)})", text)
        return " ".join(f"<[{self.tokens[piece]}]>" if piece in self.tokens else _literal(piece)
                        for piece in pieces if piece)


GENERIC = CallForm(OPEN, CLOSE, OPEN)
SERVED = CallForm("", "", "", templated=True, served=True)


def call_form(info: ModelInfo | None) -> CallForm:
    """The form `info`'s model calls tools in: its template's, or the generic one; a server's, the API's."""
    if info is not None and info.remote_host:
        return SERVED
    syntax = next((known for known in CALL_SYNTAXES if info is not None and known.family == info.tool_syntax), None)
    if info is None or syntax is None:
        return GENERIC
    return CallForm(syntax.head, syntax.tail, syntax.markers[0] if syntax.markers else "", syntax.arguments,
                    dict(info.call_tokens), templated=True)


@dataclass(frozen=True, slots=True)
class Call:
    """A call as the model wrote it: the text before it (kept in the conversation), the tool, the arguments,
    and why they may not be used (`problem`, one line: the call does not run). `ident`: a server's id for it."""

    before: str
    tool: Tool
    arguments: dict[str, Any]
    problem: str = ""
    ident: str = ""


def check_choice(choice: str, tools: Sequence[Tool]) -> str:
    """`auto`, `none`, `required` or the name of a listed tool; raises InvalidParameter (one line)."""
    if choice in CHOICES or any(tool.name == choice for tool in tools):
        return choice
    names = ", ".join(tool.name for tool in tools) or "none"
    raise InvalidParameter(f"--tool-choice {choice!r} is not auto, none, required or a tool's name "
                           f"(the tools: {names})")


def instructions(tools: Sequence[Tool]) -> str:
    """What the system prompt says of the tools in the generic form."""
    lines = ["You can call these tools. Each takes a JSON object of arguments, described by its JSON schema."]
    for tool in tools:
        lines.append(f"- {tool.name}: {tool.description.strip() or '(no description)'}\n"
                     f"  arguments: {json.dumps(tool.schema, ensure_ascii=False)}")
    lines.append(f'To call a tool, write {OPEN}{{"name": "TOOL", "arguments": {{...}}}}{CLOSE} and nothing after it. '
                 "Its result comes back in <tool_response>; then answer the user.")
    return "\n".join(lines)


def with_instructions(messages: list[Message], tools: Sequence[Tool]) -> list[Message]:
    """The conversation with the tools described in its system prompt (one is added where there is none)."""
    text = instructions(tools)
    if messages and messages[0].role == "system":
        return [Message("system", f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [Message("system", text), *messages]


def template_tools(tools: Sequence[Tool]) -> tuple[dict[str, Any], ...]:
    """The tools as transformers passes them to a chat template (`tools=[…]`, JSON-schema form)."""
    return tuple({"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                   "parameters": tool.schema}} for tool in tools)


def step_messages(calls: Sequence[tuple[ToolCall, str]], form: CallForm, number: int,
                  idents: Sequence[str] = ()) -> list[Message]:
    """A step's calls, each with its result as the model reads it, as the conversation goes on with them; the
    text and thinking the model wrote before them go with the first (`ToolCall.before`, `.reasoning`).
    Generic: the reply that made a call, then the result as the user's; a template's or a server's: the
    assistant's `tool_calls`, then a `tool` message for each. A call's id is the server's (`idents`) or made
    from its `number` (nine letters and digits: Mistral's templates refuse others)."""
    if not form.templated:
        return [message for call, result in calls for message in (
            Message("assistant", call_text(call.name, call.arguments, call.before, form), call.reasoning),
            Message("user", f"<tool_response>\n{result}\n</tool_response>"))]
    ids = [(idents[index] if index < len(idents) else "") or f"call{number + index:05d}" for index in range(len(calls))]
    called = tuple({"id": ident, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                   for ident, (call, _) in zip(ids, calls, strict=True))
    first = calls[0][0]
    return [Message("assistant", first.before, first.reasoning, tool_calls=called),
            *(Message("tool", result, tool_call_id=ident) for ident, (_, result) in zip(ids, calls, strict=True))]


def call_format(tools: Sequence[Tool], choice: str, form: CallForm = GENERIC) -> OutputFormat:
    """The grammar a reply is written under for `choice`; `none`: any text without a call (the model has made
    as many calls as it may, or repeats one). A server's model: none (the server is sent `tool_choice`)."""
    if form.served:
        return TEXT
    if choice == NONE or not tools:
        return OutputFormat("lark", f"start: TEXT\n{form.text_rule}")
    bound = [tool for tool in tools if tool.name == choice] or list(tools)
    options = " | ".join(f"call_{index}" for index in range(len(bound)))
    rules = [f"call: {_literal('{' + json.dumps('name') + ': ')} ({options}) {form.lark('}' + form.tail)}"]
    for index, tool in enumerate(bound):
        head = f"{json.dumps(tool.name)}, {json.dumps(form.arguments)}: "
        rules.append(f"call_{index}: {_literal(head)} %json {json.dumps(_grammar_schema(tool.schema))}")
    head = form.lark(form.head)
    if choice != AUTO:
        start = [f"start: {head} call"]
    elif not form.head:  # Llama 3.x: a call is the whole reply (opened by its marker or not), or it is text
        opened = f" | {form.lark(form.marker)} call" if form.opened_by_token else ""
        start = [f"start: TEXT | call{opened}", form.text_rule]
    elif not form.opened_by_token:  # free text, until the model writes the call's marker (not a near miss)
        near = f"{re.escape(form.marker[:-1])}[^{re.escape(form.marker[-1])}]"  # `<tool_call}`: a call gone wrong
        text = f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{near}(.|\\n)*/"
        start = [f"start: TEXT | opened call\nopened[lazy]: TEXT {head}", text]
    else:  # a special token opens the call: never text, so text may come before it
        start = [f"start: TEXT | TEXT {head} call", form.text_rule]
    return OutputFormat("lark", "\n".join(["%llguidance {}", *start, *rules]))


def find_call(text: str, tools: Sequence[Tool], form: CallForm = GENERIC) -> Call | None:
    """The call a finished reply makes, if it made one (a reply cut off mid-call made none)."""
    start = text.find(form.head + '{"name": ')
    if start < 0:
        return None
    try:
        call, end = json.JSONDecoder().raw_decode(text, start + len(form.head))
    except ValueError:
        return None
    if not isinstance(call, dict) or not text[end:].strip().startswith(form.tail.strip()):
        return None
    tool = next((tool for tool in tools if tool.name == call.get("name")), None)
    arguments = call.get(form.arguments)
    if tool is None or not isinstance(arguments, dict):
        return None
    before = text[:start].strip().removesuffix(form.marker).strip()  # Llama's marker opens a bare call
    return Call(before, tool, arguments, _mismatch(tool, arguments))


def step_calls(done: Done, tools: Sequence[Tool], form: CallForm = GENERIC) -> list[Call]:
    """The calls a finished step makes: the one its text writes, or those a server sent as `tool_calls`."""
    if not form.served:
        return [call] if (call := find_call(done.text, tools, form)) is not None else []
    return [_served_call(sent, done.text.strip(), tools) for sent in done.server_calls]


def cut_call(done: Done, tools: Sequence[Tool], choice: str, form: CallForm = GENERIC) -> Call | None:
    """The call a step was writing when it reached its token limit, if it was: named where its name was
    written, with the problem that it was cut short (it does not run). A server's calls come whole or not at all."""
    start = done.text.find(form.head) if form.head else -1
    if form.served or done.stop_reason != "length" or start < 0 or (not form.head and start > 0):
        return None
    named = re.search(r'"name":\s*"([^"\\]{1,200})("?)', done.text[start:])
    name = named.group(1) if named else ""
    whole = bool(named and named.group(2))
    known = [tool for tool in tools if tool.name == name or (not whole and tool.name.startswith(name))]
    tool = known[0] if name and len(known) == 1 else Tool("?", terminal_safe(name or "?"), "", {})
    name = name if whole else tool.name if tool.server != "?" else ""  # a name half written: the one it can be
    first = "the required first call" if choice != AUTO else "the call"
    called = f"{first} to {tool.name}" if name else f"{first} (its tool not named yet)"
    before = done.text[:start].strip().removesuffix(form.marker).strip()
    return Call(before, tool, {}, f"{called} was cut short at the token limit before it was complete")


def _served_call(sent: dict[str, Any], before: str, tools: Sequence[Tool]) -> Call:
    """A call a server sent, checked as the untrusted text it is: the tool must be listed, the arguments a JSON
    object its schema allows (a server does not promise either)."""
    name, text = sent["function"]["name"], sent["function"]["arguments"]
    tool = next((tool for tool in tools if tool.name == name), None)
    if tool is None:
        unknown = Tool("?", terminal_safe(name[:MAX_NAME]), "", {})
        return Call(before, unknown, {}, f"there is no tool named {unknown.name!r}", sent["id"])
    try:
        arguments = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return Call(before, tool, {}, f"the arguments are not JSON: {terminal_safe(text[:MAX_NAME])}", sent["id"])
    if not isinstance(arguments, dict):
        return Call(before, tool, {}, "the arguments are not a JSON object", sent["id"])
    return Call(before, tool, arguments, _mismatch(tool, arguments), sent["id"])


def _mismatch(tool: Tool, arguments: dict[str, Any]) -> str:
    """Why `arguments` may not be passed to `tool` ("" where its schema allows them)."""
    problem = violation(tool.schema, json.dumps(arguments))
    return f"the arguments do not match the tool's schema: {problem}" if problem else ""


def call_text(name: str, arguments: dict[str, Any], before: str, form: CallForm = GENERIC) -> str:
    """A call as the reply that made it reads in the conversation."""
    written = json.dumps({"name": name, form.arguments: arguments}, ensure_ascii=False)
    return f"{before}\n{form.head}{written}{form.tail}".lstrip()


def _grammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema the call's arguments are written under: the tool's own, compact, bounded as a JSON schema
    reply's is (a string, an array, a number cannot run to the token limit), and at the top without properties
    it does not name (a small model adding keys can only wander; the result still validates)."""
    narrowed = writing_schema({key: value for key, value in schema.items() if key != "x-guidance"})
    if "properties" in narrowed and "additionalProperties" not in narrowed:
        narrowed["additionalProperties"] = False
    return narrowed | {"x-guidance": _COMPACT}


def _literal(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text)
