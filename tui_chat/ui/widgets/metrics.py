"""The side panel's live view of the model: speed, tokens, KV cache and what it would have cost."""

from __future__ import annotations

from decimal import Decimal

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Sparkline, Static

from ...engine.base import ModelInfo, TurnMetrics
from ...pricing import GPT_4O, Price, format_usd
from ...safetext import terminal_safe

BAR_WIDTH = 20


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f} tok/s"


def kv_bar(used: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = 0 if total <= 0 else min(width, round(width * used / total))
    return "█" * filled + "░" * (width - filled)


class MetricsPanel(Vertical):
    """Fed by the chat screen a few times a second while a reply streams, never per token."""

    def __init__(self, price: Price = GPT_4O, **kwargs) -> None:
        super().__init__(**kwargs)
        self.price = price
        self.info: ModelInfo | None = None
        self.metrics = TurnMetrics()
        self.session_cost = Decimal(0)
        self.reply_cost = Decimal(0)
        self._last_sample: tuple[int, float] | None = None

    def compose(self) -> ComposeResult:
        yield Static(classes="panel-title", id="model-title")
        yield Static(id="model-facts")
        yield Static(id="speed")
        yield Sparkline([], id="decode-sparkline")
        yield Static(id="tokens")
        yield Static(id="cost")

    def on_mount(self) -> None:
        self.border_title = "Model"
        self.refresh_view()

    def show_model(self, info: ModelInfo | None, status: str = "") -> None:
        self.info = info
        self.metrics = TurnMetrics()
        self.refresh_view(status)

    def start_reply(self) -> None:
        self._last_sample = None
        self.query_one(Sparkline).data = []
        self.reply_cost = Decimal(0)

    def update_metrics(self, metrics: TurnMetrics) -> None:
        """A live snapshot of the reply in progress: extends the decode-rate sparkline."""
        self.metrics = metrics
        if self._last_sample is not None:
            tokens, seconds = self._last_sample
            if metrics.decode_s > seconds and metrics.completion_tokens > tokens:
                rate = (metrics.completion_tokens - tokens) / (metrics.decode_s - seconds)
                sparkline = self.query_one(Sparkline)
                sparkline.data = [*sparkline.data[-59:], rate]
        self._last_sample = (metrics.completion_tokens, metrics.decode_s)
        self.reply_cost = self._cost(metrics)
        self.refresh_view()

    def finish_reply(self, metrics: TurnMetrics) -> None:
        self.update_metrics(metrics)
        self.session_cost += self.reply_cost
        self.refresh_view()

    def _cost(self, m: TurnMetrics) -> Decimal:
        return self.price.cost(m.prompt_tokens - m.cached_tokens, m.cached_tokens, m.completion_tokens)

    def refresh_view(self, status: str = "") -> None:
        info, m = self.info, self.metrics
        title = self.query_one("#model-title", Static)
        facts = self.query_one("#model-facts", Static)
        if info is None:
            title.update(Content(status or "No model loaded"))
            facts.update("")
        else:
            title.update(Content(terminal_safe(info.name)))
            facts.update(Content(f"{info.quantization} · {info.offload} · {info.backend}\n{info.description}"))
        self.query_one("#speed", Static).update(
            Content(
                f"TTFT     {_seconds(m.ttft_s)}\n"
                f"Prefill  {_rate(m.prefill_tok_s)}\n"
                f"Decode   {_rate(m.decode_tok_s)}"
            )
        )
        n_ctx = m.n_ctx or (info.n_ctx if info else 0)
        self.query_one("#tokens", Static).update(
            Content(
                f"Tokens   in {m.prompt_tokens:,} · out {m.completion_tokens:,}\n"
                f"KV       {kv_bar(m.context_tokens, n_ctx)}\n"
                f"         {m.context_tokens:,} / {n_ctx:,}\n"
                f"Reused   {m.cached_tokens:,} tokens last turn"
            )
        )
        self.query_one("#cost", Static).update(
            Content(
                f"On {self.price.name} ({self.price.read_on})\n"
                f"Reply    {format_usd(self.reply_cost)}\n"
                f"Session  {format_usd(self.session_cost)}"
            )
        )
