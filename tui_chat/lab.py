"""The sampling lab without a UI: one prompt, several sampling settings (columns), their replies as they come.
The lab screen and `tui-chat run --compare` both read a run through this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .engine.base import (
    ColumnEvent,
    Done,
    Error,
    Event,
    LabDone,
    LoadProgress,
    Message,
    Metrics,
    Request,
    Token,
    TurnMetrics,
)
from .engine.compare import Divergence, divergence, mean_surprise
from .engine.formats import TEXT, OutputFormat
from .engine.params import LiveParams, SamplingParams, parse_settings


@dataclass(slots=True)
class Column:
    """One column: its settings (`label` as the user wrote them) and its reply so far."""

    label: str
    live: LiveParams
    tokens: list[Token] = field(default_factory=list)
    text: str = ""
    metrics: TurnMetrics | None = None
    done: Done | None = None

    @classmethod
    def parsed(cls, text: str, base: SamplingParams) -> Column:
        """`temperature=1.0,seed=7` over `base`; raises InvalidParameter naming what is wrong."""
        return cls(text, LiveParams(base.with_changes(**parse_settings(text))))


class Lab:
    """A run of the lab: start it, feed it its stream's events (`take`), read the columns."""

    def __init__(self, columns: list[Column]) -> None:
        self.columns = columns
        self.ended: LabDone | Error | None = None
        self.loading = ""  # the model loading again first (its engine process had died): what the lab waits for

    def request(self, messages: list[Message], *, top_logprobs: int = 0, output: OutputFormat = TEXT,
                thinking: bool = True) -> Request:
        """What the columns answer: `Comparing.compare` of it, with the columns' settings, gives the events."""
        return Request(messages, LiveParams(self.columns[0].live.snapshot()[1]), top_logprobs=top_logprobs,
                       format=output, thinking=thinking)

    def take(self, events: list[Event]) -> set[int]:
        """Apply a batch of events; returns the columns that changed."""
        changed: set[int] = set()
        for event in events:
            if isinstance(event, ColumnEvent):
                column = self.columns[event.column]
                inner = event.event
                if isinstance(inner, Token):
                    column.tokens.append(inner)
                    column.text += inner.text
                elif isinstance(inner, Metrics):
                    column.metrics = inner.metrics
                else:
                    column.done, column.metrics, column.text = inner, inner.metrics, inner.text
                changed.add(event.column)
            elif isinstance(event, (LabDone, Error)):
                self.ended = event
            elif isinstance(event, LoadProgress):
                self.loading = event.stage
        return changed

    def divergence(self, index: int) -> Divergence | None:
        """Where column `index` first drew another token than the first column (None for the first itself)."""
        return divergence(self.columns[0].tokens, self.columns[index].tokens) if index else None

    def surprise(self, index: int) -> float | None:
        return mean_surprise(self.columns[index].tokens)

    def report(self, index: int) -> dict[str, Any]:
        """A column as `run --compare --json` gives it."""
        column = self.columns[index]
        metrics = column.metrics or TurnMetrics()
        found = self.divergence(index)
        return {"settings": column.label, "params": column.live.snapshot()[1].as_dict(), "text": column.text,
                "tokens": [{"token": token.piece or token.text, "id": token.token_id, "prob": token.prob}
                           | ({"top": [{"token": c.text, "id": c.token_id, "prob": c.prob} for c in token.top]}
                              if token.top else {}) for token in column.tokens],
                "completion_tokens": metrics.completion_tokens, "decode_tok_s": metrics.decode_tok_s,
                "decode_s": metrics.decode_s, "stop_reason": column.done.stop_reason if column.done else None,
                "stop_sequence": column.done.stop_sequence or None if column.done else None,
                "incomplete": column.done.incomplete if column.done else False,
                "diverges_at": found.as_dict() if found else None, "mean_surprise": self.surprise(index)}
