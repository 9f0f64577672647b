"""Every sentence the app says of a reply, in one place: how it ended, its footer, its thinking, what came from
disk, the wait, the prompt being read, a model that does not think. The engine's events carry figures; the views,
`run` and the exports say them with these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .history import model_label
from .safetext import quoted

if TYPE_CHECKING:
    from .engine.base import EngineDeath, ModelInfo, PromptProgress, StopReason
    from .history import StoredMessage

STOP_LABELS: dict[str, str] = {  # how a reply's end is said everywhere a person reads it
    "eos": "end of text",
    "stop": "stop sequence",
    "length": "max tokens",
    "context": "context full",
    "cancelled": "stopped",
    "cut": "cut short by the server",
    "format": "the output format allowed nothing more",
}


INCOMPLETE_LABEL = "incomplete: it stopped before the output format was complete"  # footers and exports


def stop_label(reason: str, sequence: str = "") -> str:
    """How a reply's end is said, a stop sequence by name where known: `stop sequence "\\nUser:"`."""
    label = STOP_LABELS.get(reason, reason)
    return f"{label} {quoted(sequence)}" if reason == "stop" and sequence else label


def restore_note(metrics: Mapping[str, Any]) -> str:
    """`restored 3,812 tokens from disk in 40 ms (reading them would take ~6.1 s)`, or "" when nothing was.
    Takes `TurnMetrics.as_dict()` or a stored reply's figures (older ones have none of these keys)."""
    restored = metrics.get("restored_tokens") or 0
    if not restored:
        return ""
    note = f"restored {restored:,} tokens from disk in {_duration(metrics.get('restore_s') or 0.0)}"
    avoided = metrics.get("restore_avoided_s")
    return note + (f" (reading them would take ~{_duration(avoided)})" if avoided else "")


def thinking_line(metrics: Mapping[str, Any], ongoing: bool = False) -> str:
    """`thought for 4.2 s · 312 tokens` (`thinking… 2.1 s · 57 tokens` while it goes on): from
    `TurnMetrics.as_dict()` or a stored reply's figures ("" for a reply that did not think, or one stored
    before replies kept their thinking's figures)."""
    seconds = metrics.get("thinking_s")
    if seconds is None:
        return ""
    tokens = metrics.get("reasoning_tokens") or 0
    verb = "thinking…" if ongoing else "thought for"
    return f"{verb} {seconds:.1f} s · {tokens:,} token{'' if tokens == 1 else 's'}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:,.0f} s"


def reply_footer(reason: StopReason, metrics: Mapping[str, Any]) -> str:
    """Stop reason, tokens, speed, TTFT and what came from disk: from a live `TurnMetrics.as_dict()` or a
    stored reply's metrics."""
    tokens = metrics.get("completion_tokens", 0)
    withheld, unrecorded = metrics.get("withheld_tokens") or 0, metrics.get("unrecorded_tokens") or 0
    parts = [stop_label(reason, metrics.get("stop_sequence") or ""), f"{tokens} token{'' if tokens == 1 else 's'}"
             + (f", {withheld} withheld by the server (the stop sequence)" if withheld else "")
             + (f", {unrecorded} with no record of their own (the server held them back: they might have begun a "
                "stop sequence)" if unrecorded else "")]
    if metrics.get("decode_tok_s"):
        parts.append(f"{metrics['decode_tok_s']:.1f} tok/s")
    if metrics.get("ttft_s") is not None:
        parts.append(f"TTFT {metrics['ttft_s']:.2f} s")
    if metrics.get("consent_s"):  # not model time: in none of the figures above
        parts.append(f"waited {metrics['consent_s']:.1f} s for consent")
    if metrics.get("incomplete"):
        parts.append(INCOMPLETE_LABEL)
    return " · ".join(filter(None, [*parts, restore_note(metrics)]))


def wait_note(ttft_s: float | None, waited_s: float) -> str:
    """Streaming off: when the first word would have shown, against the wait for the whole reply."""
    first = "no word came" if ttft_s is None else f"first word after {ttft_s:.2f} s when streaming"
    return f"{first}; you waited {waited_s:.1f} s"


def stored_footer(message: StoredMessage, chat_model: str = "") -> str:
    """A saved reply's footer; it names its model where that is not the chat's (a chat that used two)."""
    by = f" · by {model_label(message.model)}" if message.model and message.model != chat_model else ""
    if message.state == "interrupted":
        return f"interrupted: the app stopped while it was being written{by}"
    if message.state == "error":
        return f"error: {message.error or 'unknown'}{by}"
    return reply_footer(message.stop_reason or "eos", message.metrics or {}) + by


def progress_line(event: PromptProgress) -> str:
    line = f"Reading prompt {event.done:,} / {event.total:,} tokens"
    eta = event.eta_s
    return line if eta is None else f"{line} · {eta:.0f} s left"


def no_thinking_note(info: ModelInfo) -> str | None:
    """A local model whose chat template names no thinking markers does not think: the thinking switch
    changes nothing for it, which the user is told rather than left to wonder. (A server's model cannot be
    told from here: it may send its thinking apart.)"""
    if info.thinking or info.remote_host:
        return None
    return (f"{info.name} does not think (its chat template names no thinking markers): "
            "the thinking switch changes nothing for it")


def engine_died_in_chat(death: EngineDeath) -> str:
    """The engine process's death as the chat says it: what ended it, that the chat is kept, and the log."""
    return death.said("the chat is kept, and the next message loads the model again")
