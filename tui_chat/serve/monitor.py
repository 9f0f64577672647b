"""What `tui-chat serve` shows of its requests, as the chat's panel shows a reply: per request its time to first
token, prompt-reading and decode rates, KV use, reuse and what it would cost on the paid API chosen; and the
totals. The server's threads write records; the live view (plain lines, or the Textual screen) and the JSON
log read them. No Textual here.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from ..engine.base import TurnMetrics
from ..pricing import Price, format_usd, turn_cost
from ..safetext import terminal_safe

RECENT = 200
# a request's id begins as its API's do
IDENTS = {"chat": "chatcmpl-", "messages": "msg_", "count": "msg_count_", "responses": "resp_"}


@dataclass(slots=True)
class RequestRecord:
    """One request, from its arrival to its end (`state`: waiting, running, then why it ended)."""

    number: int
    client: str
    kind: str
    stream: bool
    ident: str = ""
    wall_started: float = field(default_factory=time.time)
    arrived: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None
    metrics: TurnMetrics | None = None
    state: str = "waiting"
    detail: str = ""
    cost: Decimal = Decimal(0)
    status: int = 200

    def admitted(self) -> None:
        self.admitted_at = time.perf_counter()
        self.state = "running"

    @property
    def queued_s(self) -> float:
        return (self.admitted_at or self.arrived) - self.arrived

    @property
    def cached(self) -> int:
        return self.metrics.cached_tokens if self.metrics is not None else 0

    def as_dict(self) -> dict[str, Any]:
        """The JSON log's line: the request and the panel's figures for it."""
        m = self.metrics
        figures: dict[str, Any] = {} if m is None else {
            "prompt_tokens": m.prompt_tokens, "cached_tokens": m.cached_tokens,
            "completion_tokens": m.completion_tokens, "ttft_s": _round(m.ttft_s),
            "prefill_tok_s": _round(m.prefill_tok_s), "decode_tok_s": _round(m.decode_tok_s),
            "kv_used": m.context_tokens, "n_ctx": m.n_ctx}
        return {"id": self.ident, "number": self.number, "client": self.client, "endpoint": self.kind,
                "stream": self.stream, "started": round(self.wall_started, 3), "queued_s": round(self.queued_s, 4),
                "status": self.status, "end": self.state, "detail": self.detail, **figures,
                "cost_usd": str(self.cost)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(slots=True)
class Totals:
    requests: int = 0
    refused: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost: Decimal = Decimal(0)
    decoded_tokens: int = 0  # the tokens the decode time covers (each reply's first comes from the prompt's read)
    decode_s: float = 0.0


class Monitor:
    """The records of the requests in flight and the totals; `on_change` is told of each change (from the
    server's threads), and each ended request goes to the JSON log as one line."""

    def __init__(self, price: Price, json_log: Path | None = None) -> None:
        self.price = price
        self.in_flight: dict[int, RequestRecord] = {}
        self.recent: deque[RequestRecord] = deque(maxlen=RECENT)  # the last requests that ended, newest last
        self.totals = Totals()
        self.lock = threading.Lock()
        self.watchers: list[Callable[[RequestRecord], None]] = []
        self._log: IO[str] | None = json_log.open("a", encoding="utf-8") if json_log is not None else None

    def new_record(self, number: int, client: str, kind: str, stream: bool) -> RequestRecord:
        record = RequestRecord(number, client, kind, stream, ident=f"{IDENTS.get(kind, 'cmpl-')}{number:08d}")
        with self.lock:
            self.in_flight[number] = record
        self._changed(record)
        return record

    def turned_away(self) -> None:
        """A request refused before it had a record (bad JSON, a bad field, no key, too large): counted."""
        with self.lock:
            self.totals.requests += 1
            self.totals.refused += 1

    def refused(self, record: RequestRecord, status: int) -> None:
        record.status = status
        self.finish(record, "refused", f"HTTP {status}")

    def finish(self, record: RequestRecord, end: str, detail: str = "") -> None:
        record.state, record.detail = end, terminal_safe(detail)[:200]
        if record.status == 200 and end in ("refused", "failed"):
            record.status = 400 if end == "refused" else 500
        metrics = record.metrics
        with self.lock:
            self.in_flight.pop(record.number, None)
            self.recent.append(record)
            totals = self.totals
            totals.requests += 1
            totals.refused += end == "refused"
            totals.failed += end == "failed"
            if metrics is not None:
                bill = turn_cost(self.price, metrics.prompt_tokens, metrics.cached_tokens, metrics.completion_tokens)
                record.cost = bill.total
                totals.cost += bill.total
                totals.prompt_tokens += metrics.prompt_tokens
                totals.cached_tokens += metrics.cached_tokens
                totals.completion_tokens += metrics.completion_tokens
                if metrics.decode_tok_s:
                    totals.decoded_tokens += round(metrics.decode_tok_s * metrics.decode_s)
                    totals.decode_s += metrics.decode_s
            if self._log is not None:
                self._log.write(json.dumps(record.as_dict()) + "\n")
                self._log.flush()
        self._changed(record)

    def _changed(self, record: RequestRecord) -> None:
        for watcher in self.watchers:
            watcher(record)

    def snapshot(self) -> tuple[list[RequestRecord], list[RequestRecord], Totals]:
        """The requests in flight, the recent ones and a copy of the totals, read together."""
        with self.lock:
            totals = Totals(**{name: getattr(self.totals, name) for name in Totals.__dataclass_fields__})
            return list(self.in_flight.values()), list(self.recent), totals

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


def request_line(record: RequestRecord) -> str:
    """One ended request as `--no-ui` prints it."""
    m = record.metrics
    clock = time.strftime("%H:%M:%S", time.localtime(record.wall_started))
    head = f"{clock} #{record.number} {record.client} {record.kind}{' stream' if record.stream else ''}"
    if m is None:
        return f"{head} · {record.state}{f': {record.detail}' if record.detail else ''}"
    ttft = f"{m.ttft_s:.2f} s" if m.ttft_s is not None else "–"
    queued = f" · queued {record.queued_s:.2f} s" if record.queued_s > 0.05 else ""
    read = read_rate(m)
    prefill = f"{read:,.0f} tok/s" if read else "–"
    decode = f"{m.decode_tok_s:,.1f} tok/s" if m.decode_tok_s else "–"
    return (f"{head} · in {m.prompt_tokens:,} (reused {m.cached_tokens:,}) · out {m.completion_tokens:,} · "
            f"TTFT {ttft} · read {prefill} · decode {decode} · KV {m.context_tokens:,}/{m.n_ctx:,} · "
            f"{format_usd(record.cost, fine=True)} · {record.state}" + queued)


def read_rate(metrics: TurnMetrics) -> float | None:
    """Prompt tokens read a second, however few were read (llama.cpp's `timings.prompt_per_second`); the panel's
    own figure leaves a read of a few tokens out."""
    return metrics.read_tokens / metrics.prefill_s if metrics.prefill_s else None


def prometheus_text(totals: Totals, in_flight: int, waiting: int, engine_up: bool) -> str:
    """`/metrics` in Prometheus' text format: the totals as counters, the queue and the engine as gauges."""
    rate = totals.decoded_tokens / totals.decode_s if totals.decode_s else 0.0
    figures = (
        ("requests_total", "counter", "Requests ended, refused ones included.", totals.requests),
        ("requests_refused_total", "counter", "Requests refused (a bad field, no key, too large, busy).",
         totals.refused),
        ("requests_failed_total", "counter", "Requests the engine failed.", totals.failed),
        ("prompt_tokens_total", "counter", "Prompt tokens of the requests ended.", totals.prompt_tokens),
        ("prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's cache.", totals.cached_tokens),
        ("completion_tokens_total", "counter", "Tokens written.", totals.completion_tokens),
        ("decode_seconds_total", "counter", "Time spent writing tokens after each reply's first.", totals.decode_s),
        ("decode_tokens_per_second", "gauge", "Tokens written a second, over all requests ended.", rate),
        ("requests_in_flight", "gauge", "Requests being answered.", in_flight),
        ("requests_waiting", "gauge", "Requests waiting for a place.", waiting),
        ("engine_up", "gauge", "1 while the model's engine is up, 0 after it stopped until it is loaded again.",
         int(engine_up)),
    )
    lines: list[str] = []
    for name, kind, meaning, value in figures:
        lines += [f"# HELP tui_chat_{name} {meaning}", f"# TYPE tui_chat_{name} {kind}", f"tui_chat_{name} {value}"]
    return "\n".join(lines) + "\n"


def totals_line(totals: Totals) -> str:
    plural = "s" if totals.requests != 1 else ""
    return (f"{totals.requests:,} request{plural} ({totals.refused:,} refused, {totals.failed:,} failed) · "
            f"in {totals.prompt_tokens:,} (reused {totals.cached_tokens:,}) · out {totals.completion_tokens:,} · "
            f"{format_usd(totals.cost, fine=True)}")
