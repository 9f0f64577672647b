"""How a model calls tools, and how its calls are kept valid.

A model whose chat template takes no tools (a base model such as the starter) is told of them in the system
prompt and calls one in the generic form, documented in the README:

    <tool_call>{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}</tool_call>

(Hermes' and Qwen's form, on one line); the result comes back as the next user message,
`<tool_response>…</tool_response>`. The call is written under an LLGuidance grammar built from the tools'
input schemas: with `required` or a tool's name, from the reply's first token; with `auto`, text is free
until the model writes `<tool_call>`, and from there on only a call to a listed tool with arguments its
schema allows can follow (a lazy trigger). So a call always parses. What the grammar cannot enforce of a
schema it is compiled without (`lenient`), and the arguments are checked with jsonschema before the call runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.base import Message
from ..engine.formats import OutputFormat
from ..engine.params import InvalidParameter
from ..engine.schema import violation
from .mcp import Tool

AUTO, NONE, REQUIRED = "auto", "none", "required"
CHOICES = (AUTO, NONE, REQUIRED)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
# Compact JSON in calls: one space after `:` and `,`, no newlines, so a small model cannot wander in blanks.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


@dataclass(frozen=True, slots=True)
class Call:
    """A call as the model wrote it: the text before it (kept in the conversation), the tool, the arguments,
    and why they may not be used (`problem`: the schema's check failed; the call does not run)."""

    before: str
    tool: Tool
    arguments: dict[str, Any]
    problem: str = ""


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


def step_messages(reply: str, result: str) -> list[Message]:
    """A call and its result as the conversation goes on with them: the reply that made it, then the result."""
    return [Message("assistant", reply), Message("user", f"<tool_response>\n{result}\n</tool_response>")]


def call_format(tools: Sequence[Tool], choice: str) -> OutputFormat:
    """The grammar a reply is written under for `choice`; `none`: any text without a call (the model has made
    as many calls as it may, or repeats one)."""
    if choice == NONE or not tools:
        return OutputFormat("lark", f"start: TEXT\nTEXT: /(.|\\n)*/ & ~/(.|\\n)*{OPEN}(.|\\n)*/")
    bound = [tool for tool in tools if tool.name == choice] or list(tools)
    options = " | ".join(f"call_{index}" for index in range(len(bound)))
    rules = [f"call: {_literal('{' + json.dumps('name') + ': ')} ({options}) {_literal('}' + CLOSE)}"]
    for index, tool in enumerate(bound):
        head = f"{json.dumps(tool.name)}, {json.dumps('arguments')}: "
        rules.append(f"call_{index}: {_literal(head)} %json {json.dumps(_grammar_schema(tool.schema))}")
    if choice == AUTO:  # free text, until the model opens a call
        start = [f"start: TEXT | opened call\nopened[lazy]: TEXT {_literal(OPEN)}", r"TEXT: /(.|\n)*/"]
    else:
        start = [f"start: {_literal(OPEN)} call"]
    return OutputFormat("lark", "\n".join(["%llguidance {}", *start, *rules]))


def find_call(text: str, tools: Sequence[Tool]) -> Call | None:
    """The call a finished reply ends with, if it made one (a reply cut off mid-call made none)."""
    start = text.find(OPEN)
    end = text.rfind(CLOSE)
    if start < 0 or end < start:
        return None
    try:
        call = json.loads(text[start + len(OPEN) : end])
    except ValueError:
        return None
    if not isinstance(call, dict):
        return None
    tool = next((tool for tool in tools if tool.name == call.get("name")), None)
    arguments = call.get("arguments")
    if tool is None or not isinstance(arguments, dict):
        return None
    return Call(text[:start].strip(), tool, arguments, violation(tool.schema, json.dumps(arguments)))


def call_text(call: Call) -> str:
    """The call as the reply that made it reads in the conversation."""
    written = json.dumps({"name": call.tool.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{call.before}\n{OPEN}{written}{CLOSE}".lstrip()


def _grammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema the call's arguments are written under: the tool's own, compact, and at the top without
    properties it does not name (a small model adding keys can only wander; the result still validates)."""
    narrowed = {key: value for key, value in schema.items() if key != "x-guidance"}
    if "properties" in narrowed and "additionalProperties" not in narrowed:
        narrowed["additionalProperties"] = False
    return narrowed | {"x-guidance": _COMPACT}


def _literal(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text)
