"""What one streamed `chat.completion.chunk` says, parsed as the untrusted input it is.

Pure functions: a server can send anything, so every field is checked and every text that may reach
the user is made one short line with its control characters visible.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ...safetext import terminal_safe
from ..base import Candidate, EngineError

SERVER_TEXT_LIMIT = 200


class RemoteError(EngineError):
    """A server or network failure, already phrased for the user."""


class MalformedEvent(RemoteError):
    """A streamed event that is not the JSON chunk the protocol promises."""


@dataclass(frozen=True, slots=True)
class TokenProb:
    """One token with its probabilities; `token_id` -1 where the server does not say it (llama-server does)."""

    token_id: int
    text: str
    prob: float
    top: tuple[Candidate, ...]


@dataclass(frozen=True, slots=True)
class CallPiece:
    """One streamed `tool_calls` delta: the call at `index`, and the parts of it this chunk adds (the id and
    name come once, the arguments' JSON text in fragments)."""

    index: int
    ident: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    """The parts of one `chat.completion.chunk` we use; absent parts are empty or None."""

    content: str = ""
    reasoning: str = ""  # the thinking, sent apart: `reasoning_content` (llama-server, DeepSeek) or `reasoning` (vLLM)
    finish_reason: str | None = None
    tokens: tuple[TokenProb, ...] = ()
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None  # llama-server's prompt_progress: total, cache, processed, time_ms
    extras: dict[str, Any] | None = None  # `tui-chat serve`'s x_tui_chat: its own stop reason and cache figures
    error: str | None = None
    calls: tuple[CallPiece, ...] = ()


def parse_chunk(data: str) -> Chunk:
    """One event's data as a Chunk; raises MalformedEvent when it is not a chunk."""
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):  # ValueError: bad JSON, or a number past Python's 4300 digits
        raise MalformedEvent(f"the server sent a malformed event: {excerpt(data)}") from None
    if not isinstance(payload, dict):
        raise MalformedEvent(f"the server sent a malformed event: {excerpt(data)}")
    if "error" in payload:
        return Chunk(error=error_text(payload) or "unknown error")
    choices = payload.get("choices") or []
    if not isinstance(choices, list):
        raise MalformedEvent("the server sent a malformed event: 'choices' is not a list")
    choice = choices[0] if choices else {}
    if not isinstance(choice, dict):
        raise MalformedEvent("the server sent a malformed event: a choice is not an object")
    delta = choice.get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    if content is not None and not isinstance(content, str):
        raise MalformedEvent("the server sent a malformed event: 'content' is not text")
    finish = choice.get("finish_reason")
    return Chunk(
        content=content or "",
        reasoning=_reasoning(delta),
        finish_reason=finish if isinstance(finish, str) else None,
        tokens=_token_probs(choice.get("logprobs")),
        usage=_table(payload.get("usage")),
        timings=_table(payload.get("timings")),
        progress=_table(payload.get("prompt_progress")),
        extras=_table(payload.get("x_tui_chat")),
        calls=_call_pieces(delta.get("tool_calls") if isinstance(delta, dict) else None),
    )


def _call_pieces(deltas: Any) -> tuple[CallPiece, ...]:
    """`delta.tool_calls`: a list of {index, id, function: {name, arguments}}, each part optional."""
    if deltas is None:
        return ()
    if not isinstance(deltas, list) or not all(isinstance(delta, dict) for delta in deltas):
        raise MalformedEvent("the server sent a malformed event: 'tool_calls' is not a list of objects")
    pieces = []
    for position, delta in enumerate(deltas):
        function = delta.get("function") or {}
        index = delta.get("index", position)
        parts = (delta.get("id") or "", function.get("name") or "", function.get("arguments") or "") \
            if isinstance(function, dict) else None
        if parts is None or isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 2**16 \
                or not all(isinstance(part, str) for part in parts):
            raise MalformedEvent("the server sent a malformed event: a 'tool_calls' delta is not a call's part")
        pieces.append(CallPiece(index, *parts))
    return tuple(pieces)


def _reasoning(delta: Any) -> str:
    if not isinstance(delta, dict):
        return ""
    text = delta.get("reasoning_content", delta.get("reasoning"))
    if text is not None and not isinstance(text, str):
        raise MalformedEvent("the server sent a malformed event: 'reasoning_content' is not text")
    return text or ""


def _token_probs(logprobs: Any) -> tuple[TokenProb, ...]:
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list):
        return ()
    return tuple(
        TokenProb(_token_id(entry), str(entry.get("token", "")), _prob(entry.get("logprob")),
                  _candidates(entry.get("top_logprobs")))
        for entry in entries
        if isinstance(entry, dict)
    )


def _candidates(tops: Any) -> tuple[Candidate, ...]:
    """The likeliest tokens, with their ids where the server says them (-1 where not)."""
    if not isinstance(tops, list):
        return ()
    return tuple(Candidate(_token_id(top), str(top.get("token", "")), _prob(top.get("logprob")))
                 for top in tops if isinstance(top, dict))


def _token_id(entry: dict[str, Any]) -> int:
    """llama-server's `id`; -1 for none, or for anything that is not a token id."""
    value = entry.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else -1


def _prob(logprob: Any) -> float:
    if isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
        return 0.0
    logprob = max(min(logprob, 0), -1e9)  # a JSON integer of any size becomes a float math.exp takes
    return 0.0 if math.isnan(logprob) else math.exp(logprob)


def _table(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def count(table: dict[str, Any] | None, *path: str) -> int | None:
    """A non-negative whole number at `path` in a reported table, or None when absent or nonsense."""
    value: Any = table
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**53:
        return None
    return int(value)


def rate(table: dict[str, Any] | None, key: str) -> float | None:
    value = table.get(key) if table else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 2**53:
        return None
    return float(value)


def error_text(payload: Any) -> str:
    """The message inside an OpenAI-style (`error.message`) or FastAPI-style (`detail`) error body."""
    if not isinstance(payload, dict):
        return ""
    error = payload.get("error", payload.get("detail"))
    if isinstance(error, dict):
        error = error.get("message", "")
    if isinstance(error, list):
        error = "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in error)
    return excerpt(str(error or ""))


def excerpt(text: str) -> str:
    """Server text made one short line, its control characters made visible: it is untrusted, and
    error messages also go to stderr."""
    line = terminal_safe(" ".join(text.split()))
    return line if len(line) <= SERVER_TEXT_LIMIT else line[: SERVER_TEXT_LIMIT - 1] + "…"
