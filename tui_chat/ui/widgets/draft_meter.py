"""Beside the message box: how many tokens the draft is, what sending it would cost with the
conversation so far, and the worst case out at the current max tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual import work
from textual.content import Content
from textual.timer import Timer
from textual.widgets import Static

from ...engine.base import Backend, EngineError
from ...pricing import Price, format_usd, turn_cost

COUNT_DELAY_S = 0.15
IDLE = "Enter sends · Ctrl+J new line"


@dataclass(frozen=True, slots=True)
class DraftCosts:
    """What the cost of sending depends on, read when a count arrives."""

    price: Price
    context_tokens: int  # already in the conversation: billed again as input with the draft
    max_tokens: int


class DraftMeter(Static):
    DEFAULT_CSS = "DraftMeter { height: 1; padding: 0 2; color: $text-muted; }"

    def __init__(self, costs: Callable[[], DraftCosts], **kwargs: Any) -> None:
        super().__init__(Content(IDLE), **kwargs)
        self.costs = costs
        self.backend: Backend | None = None
        self.text = ""
        self._timer: Timer | None = None

    def draft_changed(self, text: str) -> None:
        """Counted a moment after typing stops, off the UI thread: a server counts over HTTP."""
        self.text = text
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(COUNT_DELAY_S, self.recount)

    def recount(self) -> None:
        if self.backend is None or not self.text:
            self.update(Content(IDLE))
            return
        self._count_in_background(self.backend, self.text)

    @work(thread=True, group="draft", exclusive=True)
    def _count_in_background(self, backend: Backend, text: str) -> None:
        try:
            count = backend.count_tokens(text)
        except EngineError:
            return
        self.app.call_from_thread(self._show, text, count)

    def _show(self, text: str, count: int) -> None:
        if not self.is_attached or text != self.text:
            return  # the app closed, or typing went on: a newer count is on its way
        costs = self.costs()
        sending = turn_cost(costs.price, count + costs.context_tokens, costs.context_tokens, 0).total
        self.update(Content(
            f"{count:,} token{'s' if count != 1 else ''} · sending ≈ {format_usd(sending)}"
            f" + up to {format_usd(costs.price.cost(0, 0, costs.max_tokens))} out on {costs.price.name}"
        ))
