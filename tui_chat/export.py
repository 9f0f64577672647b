"""A conversation as a JSON document (everything, for import) or as Markdown (the active path, to read)."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from .engine.base import ToolCall
from .engine.context import left_out
from .history import (
    STATES,
    Conversation,
    HistoryError,
    StoredMessage,
    active_path,
    output_format_from,
    sampling_from,
    tool_calls_from,
    tool_switches_from,
)
from .pricing import format_usd
from .units import local_time
from .wording import INCOMPLETE_LABEL, stop_label, thinking_line

FORMAT = "tui-chat conversation"
FORMAT_VERSION = 1


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def to_json(conversation: Conversation) -> dict[str, Any]:
    on_path = {m.id for m in conversation.path}
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "id": conversation.id,
        "title": conversation.title,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "sampling": conversation.sampling.as_dict() | {"stop": list(conversation.sampling.stop)},
        "thinking": conversation.thinking,
        "output_format": conversation.output_format.as_dict(),
        "tools": conversation.tools.as_dict(),
        "created_at": _iso(conversation.created_at),
        "updated_at": _iso(conversation.updated_at),
        "messages": [
            {
                "id": m.id,
                "parent_id": m.parent_id,
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "tool_calls": [call.as_dict() for call in m.tool_calls],
                "model": m.model,
                "state": m.state,
                "stop_reason": m.stop_reason,
                "error": m.error,
                "metrics": m.metrics or {},
                "fork_of": m.fork_of,
                "fork_token": m.fork_token,
                "active": m.id in on_path,
                "created_at": _iso(m.created_at),
                "updated_at": _iso(m.updated_at),
            }
            for m in conversation.messages
        ],
    }


def from_json(data: Any) -> Conversation:
    """A conversation from `to_json`'s output, checked field by field so a bad file is a one-line error."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise HistoryError(f"not a tui-chat conversation export (no \"format\": \"{FORMAT}\")")
    if data.get("version") != FORMAT_VERSION:
        raise HistoryError(f"export version {data.get('version')!r} is not one this tui-chat reads ({FORMAT_VERSION})")
    raw_messages = _field(data, "messages", list)
    messages: list[StoredMessage] = []
    active: dict[int, int] = {}
    for index, raw in enumerate(raw_messages):
        where = f"messages[{index}]"
        if not isinstance(raw, dict):
            raise HistoryError(f"{where} must be an object")
        message_id = _field(raw, "id", int, where)
        parent_id = _field(raw, "parent_id", int, where, optional=True)
        fork_of = _field(raw, "fork_of", int, where, optional=True)
        known = {m.id for m in messages}
        if message_id in known or parent_id not in known | {None} or fork_of not in known | {None}:
            raise HistoryError(f"{where}: ids must be unique and name earlier messages")
        role = _field(raw, "role", str, where)
        state = _field(raw, "state", str, where)
        if role not in ("user", "assistant") or state not in STATES:
            raise HistoryError(f"{where}: unknown role {role!r} or state {state!r}")
        messages.append(
            StoredMessage(
                id=message_id,
                parent_id=parent_id,
                role=role,
                content=_field(raw, "content", str, where),
                state=state,
                created_at=_time(raw, where),
                updated_at=_time(raw, where, "updated_at"),
                stop_reason=_field(raw, "stop_reason", str, where, optional=True),
                error=_field(raw, "error", str, where, optional=True),
                metrics=_field(raw, "metrics", dict, where) or None,
                fork_of=fork_of,
                fork_token=_field(raw, "fork_token", int, where, optional=True),
                reasoning=_field(raw, "reasoning", str, where, optional=True) or "",
                tool_calls=tool_calls_from(raw.get("tool_calls", []), where),
                model=_field(raw, "model", str, where, optional=True) or "",
            )
        )
        active[message_id] = int(raw.get("active") is True)
    return Conversation(
        id=_field(data, "id", int),
        title=_field(data, "title", str),
        model=_field(data, "model", str),
        system_prompt=_field(data, "system_prompt", str),
        sampling=sampling_from(data.get("sampling")),
        created_at=_time(data, "the export"),
        updated_at=_time(data, "the export", "updated_at"),
        messages=tuple(messages),
        path=active_path(tuple(messages), active),
        thinking=_field(data, "thinking", bool, optional=True) is not False,
        output_format=output_format_from(data.get("output_format")),
        tools=tool_switches_from(data.get("tools")),
    )


def _field(data: dict[str, Any], name: str, kind: type, where: str = "the export", optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise HistoryError(f"{where}: {name!r} must be {'a whole number' if kind is int else kind.__name__}")
    return value


def _time(data: dict[str, Any], where: str, name: str = "created_at") -> float:
    try:
        moment = datetime.fromisoformat(_field(data, name, str, where))
    except ValueError:
        raise HistoryError(f"{where}: {name!r} must be an ISO 8601 time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def metrics_line(metrics: dict[str, Any], stop_reason: str | None) -> str:
    """`TTFT 0.21 s · 48.3 tok/s · 12 prompt + 80 reply tokens · end of text · $0.000812`: money as the
    app shows it everywhere (cents, or six decimals below a cent)."""
    parts = []
    if metrics.get("ttft_s") is not None:
        parts.append(f"TTFT {metrics['ttft_s']:.2f} s")
    if metrics.get("decode_tok_s") is not None:
        parts.append(f"{metrics['decode_tok_s']:.1f} tok/s")
    if "completion_tokens" in metrics:
        thought = f" ({metrics['reasoning_tokens']} thinking)" if metrics.get("reasoning_tokens") else ""
        parts.append(f"{metrics.get('prompt_tokens', 0)} prompt + {metrics['completion_tokens']} reply tokens{thought}")
    if metrics.get("dropped_turns"):
        parts.append(left_out(metrics["dropped_turns"]))
    if stop_reason:
        parts.append(stop_label(stop_reason, metrics.get("stop_sequence") or ""))
    if metrics.get("incomplete"):
        parts.append(INCOMPLETE_LABEL)
    if "cost_usd" in metrics:
        parts.append(format_usd(Decimal(metrics["cost_usd"])))
    return " · ".join(parts)


def to_markdown(conversation: Conversation) -> str:
    settings = conversation.sampling
    lines = [
        f"# {conversation.title or 'Untitled conversation'}",
        "",
        f"- Model: {conversation.model or 'unknown'}",
        f"- Started: {local_time(conversation.created_at)}",
        f"- Settings: temperature {settings.temperature:g}, top-p {settings.top_p:g}, top-k {settings.top_k},"
        f" min-p {settings.min_p:g}, repeat penalty {settings.repeat_penalty:g}, seed {settings.seed},"
        f" max tokens {settings.max_tokens}",
        *([f"- Output format: {conversation.output_format.label}"] if conversation.output_format.constrained else []),
        "",
    ]
    if conversation.system_prompt:
        lines += ["## System prompt", "", conversation.system_prompt.strip(), ""]
    for message in conversation.path:
        siblings = conversation.siblings(message)
        heading = "User" if message.role == "user" else "Assistant"
        if len(siblings) > 1:
            heading += f" (branch {siblings.index(message) + 1} of {len(siblings)})"
        if message.state not in ("complete", "stopped"):
            heading += f" ({message.state})"
        lines += [f"## {heading}", ""]
        if message.reasoning.strip():
            lines += _thinking_block(message), ""
        lines += [line for call in message.tool_calls for line in (_call_block(call), "")]
        lines += [message.content.strip() or "*(empty)*", ""]
        if message.error:
            lines += [f"*Error: {message.error}*", ""]
        summary = metrics_line(message.metrics or {}, message.stop_reason) if message.role == "assistant" else ""
        if summary:
            lines += [f"*{summary}*", ""]
    return "\n".join(lines)


def _thinking_block(message: StoredMessage) -> str:
    """A reply's thinking, folded as GitHub and most Markdown viewers fold HTML's details."""
    summary = thinking_line(message.metrics or {}) or "thinking"
    return f"<details><summary>{html.escape(summary)}</summary>\n\n{message.reasoning.strip()}\n\n</details>"


def _call_block(call: ToolCall) -> str:
    """A tool call, folded like the thinking: what was called and how it went; unfolded, its arguments and its
    whole result (or why there is none) as code, fenced past any backticks they hold."""
    if not call.approved:
        outcome = "not run"
    elif call.result is None:
        outcome = "failed"
    else:
        outcome = f"{call.ms or 0:,.0f} ms · {len(call.result):,} characters"
    body = call.result if call.result is not None else f"error: {call.error}"
    arguments = json.dumps(call.arguments, ensure_ascii=False, indent=2)
    return (f"<details><summary>{html.escape(f'tool {call.server}/{call.name} · {outcome}')}</summary>\n\n"
            f"{_fenced(arguments, 'json')}\n\n{_fenced(body, '')}\n\n</details>")


def _fenced(text: str, language: str) -> str:
    fence = "`" * max(3, max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence}{language}\n{text}\n{fence}"
