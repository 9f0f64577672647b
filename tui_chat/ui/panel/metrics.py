"""The side panel's live view of the model: speed, tokens, KV cache and what it would have cost."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Select, Sparkline, Static

from ...engine.base import PREFILL_RATE_MIN_TOKENS, DeviceMemory, ModelInfo, TurnMetrics
from ...pricing import Price, format_usd, turn_cost
from ...safetext import terminal_safe
from ...units import format_size
from ...wording import restore_note
from ..widgets.figures import show

BAR_WIDTH = 20


def _usd(amount: Decimal) -> str:
    """One money format for the panel: its replies and its session add up as shown."""
    return format_usd(amount, fine=True)


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f} tok/s"


def _prefill(m: TurnMetrics) -> str:
    if m.prefill_tok_s is None and 0 < m.read_tokens < PREFILL_RATE_MIN_TOKENS:
        return f"{m.read_tokens} token{'' if m.read_tokens == 1 else 's'} read"
    return _rate(m.prefill_tok_s)


def _thought(m: TurnMetrics) -> str:
    return f"\n         {m.reasoning_tokens:,} thinking · {m.answer_tokens:,} answer" if m.reasoning_tokens else ""


def _thinking_cost(price: Price, m: TurnMetrics) -> str:
    """The thinking's share of the output: a paid API bills it as output too."""
    return f"  of it thinking {_usd(price.cost(0, 0, m.reasoning_tokens))}\n" if m.reasoning_tokens else ""


def _draft(m: TurnMetrics) -> str:
    """Speculative decoding's figures: `Draft    ngram · 93% kept`, the tokens per batch (`9.4 tok/batch`) and the
    speed-up against plain decoding measured with this model (`1.62× plain`), a line each so that none wraps
    in the panel's 30 columns; "" without drafting."""
    if not m.draft_kind:
        return ""
    acceptance, per_batch, speedup = m.acceptance, m.tokens_per_verification, m.draft_speedup
    kept = "no draft yet" if acceptance is None else f"{acceptance:.0%} kept"
    batch = "" if per_batch is None else f"\n         {per_batch:.1f} tok/batch"
    versus = "" if speedup is None else f"\n         {speedup:.2f}× plain"
    return f"\nDraft    {m.draft_kind} · {kept}{batch}{versus}"


def _tools(m: TurnMetrics) -> str:
    if not (m.tool_call_tokens or m.tool_result_tokens):
        return ""
    return f"\nTools    in {m.tool_result_tokens:,} · out {m.tool_call_tokens:,}"  # results read, calls written


def _calls_cost(price: Price, m: TurnMetrics) -> str:
    """The calls' share of the output (the results are in the input already: the last prompt holds them)."""
    return f"  of it calls {_usd(price.cost(0, 0, m.tool_call_tokens))}\n" if m.tool_call_tokens else ""


def memory_line(device: DeviceMemory, width: int = 0) -> str:
    """`CUDA0 290.0 MiB weights · 72.0 MiB KV · 257.3 MiB compute · 139.1 GiB free`: llama.cpp's own accounting,
    wrapped between its parts."""
    free = [f"{format_size(device.free)} free"] if device.free is not None else []
    return fitted([f"{device.device} {format_size(device.weights)} weights", f"{format_size(device.kv)} KV",
                   f"{format_size(device.compute)} compute", *free], width)


def fitted(parts: list[str], width: int) -> str:
    """Parts joined by " · ", a line broken between two parts where the next would pass `width` (0: never), so
    no part is cut in two (`1` / `thread`, `72.0` / `MiB KV`)."""
    lines = [parts[0]] if parts else []
    for part in parts[1:]:
        if width and len(lines[-1]) + 3 + len(part) > width:
            lines.append(part)
        else:
            lines[-1] += f" · {part}"
    return "\n".join(lines)


def _drawn(m: TurnMetrics) -> str:
    """Where a local reply's tokens were drawn: in llama.cpp's graph (backend sampling), or by the app's chain."""
    where = {"llama.cpp": "in llama.cpp", "python": "by the app"}.get(m.sampling_path)
    return f"\n  drawn {where}" if where else ""


def kv_bar(used: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = 0 if total <= 0 else min(width, round(width * used / total))
    return "█" * filled + "░" * (width - filled)


class MetricsPanel(Vertical):
    """Fed by the chat screen a few times a second while a reply streams, never per token. The reply's
    figures are those of the reply on screen (the one written, a branch shown, a lab column kept, the last of
    a reopened chat); the KV bar what the cache holds, which only a reply written changes. Two sums, named
    apart: the chat's (`replies`: each reply's, kept on its branch, summed when drawn: a reopened chat costs
    what it did, a deleted turn leaves it) and the session's spend (`spent`: every reply written since the
    app started, whatever became of it: deleting does not un-spend)."""

    DEFAULT_CSS = """
    MetricsPanel #model-title { text-style: bold; color: $accent; }
    MetricsPanel #model-facts { color: $text-muted; }
    MetricsPanel #decode-sparkline { height: 2; margin: 0 0 1 0; }
    MetricsPanel #price { margin: 1 0 0 0; }
    MetricsPanel #cost { color: $text; }
    """

    def __init__(self, prices: dict[str, Price], price: str, replies: Callable[[], Iterable[TurnMetrics]],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.replies = replies
        self.prices = prices
        self.price = prices[price]  # as shown: the workspace keeps the one in use (and in the config)
        self.info: ModelInfo | None = None
        self.metrics = TurnMetrics()
        self.kv_used = 0  # tokens in the cache after the last reply the engine wrote
        self.kv_size = 0  # the context that reply had (a server's own, where it says)
        self.kv_estimated = False  # that reply's prompt was counted here: the server never said
        self.spent: list[TurnMetrics] = []  # each reply written since the app started, its latest figures
        self.thinking = True  # the chat's thinking switch, shown for a model whose template names its markers
        self._last_sample: tuple[int, float] | None = None

    def compose(self) -> ComposeResult:
        yield Static(classes="panel-title", id="model-title")
        yield Static(id="model-facts")
        yield Static(id="speed")
        yield Sparkline([], id="decode-sparkline")
        yield Static(id="tokens")
        yield Select([(name, name) for name in self.prices], value=self.price.name, allow_blank=False,
                     compact=True, id="price")
        yield Static(id="cost")

    def on_mount(self) -> None:
        self.border_title = "Model"
        self.refresh_view()

    def on_resize(self) -> None:
        self.call_after_refresh(self.refresh_view)  # the facts wrap between their parts at the new width

    def show_model(self, info: ModelInfo | None, status: str = "") -> None:
        self.info = info
        self.metrics = TurnMetrics()
        self.kv_used = self.kv_size = 0
        self.kv_estimated = False
        self.refresh_view(status)

    def show_thinking(self, on: bool) -> None:
        if on != self.thinking:
            self.thinking = on
            self.refresh_view()

    def start_reply(self) -> None:
        self._last_sample = None
        self.query_one(Sparkline).data = []
        self.metrics = TurnMetrics()
        self.spent.append(self.metrics)

    def update_metrics(self, metrics: TurnMetrics) -> None:
        """A snapshot of the reply in progress, or its final figures: extends the decode-rate sparkline. The
        latest is what the reply spent, even one stopped or cut short (a server bills what it read)."""
        self.metrics = metrics
        self.spent[-1:] = [metrics]  # in the entry `start_reply` opened
        self.kv_used, self.kv_size, self.kv_estimated = metrics.context_tokens, metrics.n_ctx, metrics.prompt_estimated
        if self._last_sample is not None:
            tokens, seconds = self._last_sample
            if metrics.decode_s > seconds and metrics.completion_tokens > tokens:
                rate = (metrics.completion_tokens - tokens) / (metrics.decode_s - seconds)
                sparkline = self.query_one(Sparkline)
                sparkline.data = [*(sparkline.data or ())[-59:], rate]
        self._last_sample = (metrics.completion_tokens, metrics.decode_s)
        self.refresh_view()

    def show_reply(self, metrics: TurnMetrics | None) -> None:
        """Another reply on screen (a branch, a kept lab column, another chat's last): its figures, with
        the cache as it is; its decode rates are not kept, so the sparkline empties."""
        self.metrics = metrics or TurnMetrics()
        self._last_sample = None
        self.query_one(Sparkline).data = []
        self.refresh_view()

    def key_figures(self) -> str:
        """The decode rate and the cache's fill, for the title line where the panel is hidden."""
        rate = f"{self.metrics.decode_tok_s:,.1f} tok/s" if self.metrics.decode_tok_s else ""
        total, used = self.kv_total, self._kv_used()
        kv = f"KV {used}/{total:,}" if total else f"KV {used}" if self.kv_used else ""
        return " · ".join(part for part in (rate, kv) if part)

    @property
    def kv_total(self) -> int:
        return self.kv_size or (self.info.n_ctx if self.info else 0)

    def _kv_used(self) -> str:
        """The cache's fill, marked `~` where it rests on the prompt counted here."""
        return f"{'~' if self.kv_estimated else ''}{self.kv_used:,}"

    class PriceChosen(Message):
        """The user picked another price preset (the screen has the workspace keep it, in the config too)."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def choose_price(self, name: str) -> None:
        """As if the user picked `name` in the list (the palette's price commands)."""
        self.query_one("#price", Select).value = name

    @on(Select.Changed, "#price")
    def _price_changed(self, event: Select.Changed) -> None:
        self.price = self.prices[str(event.value)]
        self.refresh_view()
        self.post_message(self.PriceChosen(str(event.value)))

    def chat_cost(self) -> Decimal:
        return self._cost(self.replies())

    def session_cost(self) -> Decimal:
        return self._cost(self.spent)

    def _cost(self, replies: Iterable[TurnMetrics]) -> Decimal:
        return sum((turn_cost(self.price, t.prompt_tokens, t.cached_tokens, t.output_tokens).total
                    for t in replies), Decimal(0))

    def uncached_cost(self) -> Decimal:
        """What the chat would have cost with every prompt token billed as fresh input."""
        return sum((self.price.cost(t.prompt_tokens, 0, t.output_tokens) for t in self.replies()), Decimal(0))

    def refresh_view(self, status: str = "") -> None:
        info, m = self.info, self.metrics
        title = self.query_one("#model-title", Static)
        facts = self.query_one("#model-facts", Static)
        if info is None:
            title.update(Content(status or "No model loaded"))
            facts.update("")
        else:
            show(title, Content(terminal_safe(info.name)))
            threads = m.threads or info.threads
            width = facts.content_size.width
            counted = [f"{threads} thread{'s' if threads != 1 else ''}"] if threads else []
            hardware = fitted([info.quantization, *info.offload.split(" · "), *counted], width)
            thinks = f"\nThinking {'on' if self.thinking else 'off'} · F7" if info.thinking else ""
            server = "".join(f"\n{line}" for line in info.server_facts)
            memory = "".join(f"\n{memory_line(device, width)}" for device in info.memory)
            show(facts, Content(terminal_safe(f"{hardware}{memory}\n{info.description}{thinks}{server}")))
        server = f"\n  server {_rate(m.server_decode_tok_s)}" if m.server_decode_tok_s else ""  # by its own clock
        grammar = m.grammar_ms_per_token
        show(self.query_one("#speed", Static), Content(
                f"TTFT     {_seconds(m.ttft_s)}\n"
                + (f"Consent  {_seconds(m.consent_s)} waited\n" if m.consent_s else "")
                + f"Prefill  {_prefill(m)}\n"
                f"Decode   {_rate(m.decode_tok_s)}{server}{_drawn(m)}"
                + ("" if grammar is None else f"\nGrammar  {grammar:.2f} ms/token")
                + _draft(m)
            ))
        n_ctx = self.kv_total
        estimated = "~" if m.prompt_estimated else ""  # counted here until the server says
        restored = restore_note(m.as_dict())
        show(self.query_one("#tokens", Static), Content(
                f"Tokens   in {estimated}{m.prompt_tokens:,} · out {m.completion_tokens:,}{_thought(m)}{_tools(m)}\n"
                f"KV       {kv_bar(self.kv_used, n_ctx)}\n"
                f"         {self._kv_used()} / {f'{n_ctx:,}' if n_ctx else 'unknown'}\n"
                f"Reused   {m.cached_tokens:,} tokens this turn"
                + (f"\n{restored[0].upper()}{restored[1:]}" if restored else "")
            ))
        reply = turn_cost(self.price, m.prompt_tokens, m.cached_tokens, m.output_tokens)
        chat = self.chat_cost()
        show(self.query_one("#cost", Static), Content(
                f"prices read {self.price.read_on}\n"
                f"Reply    {_usd(reply.total)}\n"
                f" input   {_usd(reply.input)}\n"
                f" cached  {_usd(reply.cached_input)}\n"
                f" output  {_usd(reply.output)}\n"
                f"{_thinking_cost(self.price, m)}"
                f"{_calls_cost(self.price, m)}"
                f"Chat     {_usd(chat)}\n"
                f"Saved    {_usd(self.uncached_cost() - chat)} by reuse\n"
                f"Session  {_usd(self.session_cost())} spent"
            ))
