"""`tui-chat serve`'s live view: the requests in flight and the last ones, each with the chat panel's figures,
and the totals. It reads the server's monitor four times a second (bounded work, however fast tokens come);
the server runs on a thread of its own and stops with the view (q or Ctrl+C)."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.widgets import DataTable, Footer, Static

from ..pricing import format_usd
from ..safetext import screen_safe
from ..serve.monitor import Monitor, RequestRecord, totals_line
from ..serve.server import TuiChatServer

REFRESH_S = 0.25
SHOWN = 40  # rows: the requests in flight, then the most recent that ended
COLUMNS = ("#", "client", "endpoint", "state", "in", "reused", "out", "TTFT", "read tok/s", "decode tok/s", "KV",
           "cost $")


class ServeApp(App[None]):
    TITLE = "tui-chat serve"
    BINDINGS = [Binding("q", "quit", "Stop the server"), Binding("ctrl+c", "quit", "Stop", show=False)]
    CSS = """
    #where { padding: 0 1; background: $boost; }
    #totals { padding: 0 1; dock: bottom; height: 1; margin-bottom: 1; }
    """

    def __init__(self, server: TuiChatServer, monitor: Monitor, where: str) -> None:
        super().__init__()
        self.server, self.monitor, self.where = server, monitor, where

    def compose(self) -> ComposeResult:
        info, server = self.server.info, self.server
        yield Static(Content(screen_safe(
            f"{info.name} · {info.offload} · {self.where} · {server.options.parallel} at once, "
            f"{server.room:,} tokens of context each{' · API key required' if server.options.api_key else ''}")),
            id="where")
        yield DataTable(id="requests", cursor_type="none", zebra_stripes=True)
        yield Static(id="totals")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self.run_worker(self.server.serve_forever, thread=True, name="http")
        self.set_interval(REFRESH_S, self._refresh)
        self._refresh()

    def _refresh(self) -> None:
        in_flight, recent, totals = self.monitor.snapshot()
        table = self.query_one(DataTable)
        table.clear()
        for record in (in_flight + recent[::-1])[:SHOWN]:
            table.add_row(*_cells(record))
        self.query_one("#totals", Static).update(Content(totals_line(totals)))

    async def on_unmount(self) -> None:
        """However the view ends (q, Ctrl+C, a test), the server stops taking requests with it."""
        await asyncio.to_thread(self.server.shutdown)


def _cells(record: RequestRecord) -> tuple[str, ...]:
    m = record.metrics
    cost = "–" if record.state == "running" else format_usd(record.cost, fine=True)[1:]
    if m is None:
        return (str(record.number), record.client, record.kind, record.state, *("–",) * 8)
    return (str(record.number), record.client, record.kind, record.state, f"{m.prompt_tokens:,}",
            f"{m.cached_tokens:,}", f"{m.completion_tokens:,}", f"{m.ttft_s:.2f} s" if m.ttft_s is not None else "–",
            f"{m.prefill_tok_s:,.0f}" if m.prefill_tok_s else "–", f"{m.decode_tok_s:,.1f}" if m.decode_tok_s else "–",
            f"{m.context_tokens:,}/{m.n_ctx:,}", cost)
