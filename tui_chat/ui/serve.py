"""`tui-chat serve`'s live view: the requests in flight and the last ones, each with the chat panel's figures,
and the totals. It reads the server's monitor four times a second (bounded work, however fast tokens come) and
touches only the cells whose figures changed: an idle server's view draws nothing. The server runs on a thread
of its own and stops with the view (q or Ctrl+C)."""

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
from .widgets.figures import show

REFRESH_S = 0.25
SHOWN = 40  # rows: the requests in flight, then the most recent that ended
COLUMNS = ("#", "client", "endpoint", "state", "in", "reused", "out", "TTFT", "read tok/s", "decode tok/s", "KV",
           "cost $")
Rows = dict[str, tuple[str, ...]]  # each request's row by its number, in the order shown


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
        self._shown: Rows = {}

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
        table = self.query_one(DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        self.run_worker(self.server.serve_forever, thread=True, name="http")
        self.set_interval(REFRESH_S, self._refresh)
        self._refresh()

    def _refresh(self) -> None:
        in_flight, recent, totals = self.monitor.snapshot()
        wanted = {str(record.number): _cells(record) for record in (in_flight + recent[::-1])[:SHOWN]}
        _update_rows(self.query_one(DataTable), self._shown, wanted)
        self._shown = wanted
        show(self.query_one("#totals", Static), Content(totals_line(totals)))

    async def on_unmount(self) -> None:
        """However the view ends (q, Ctrl+C, a test), the server stops taking requests with it."""
        await asyncio.to_thread(self.server.shutdown)


def _update_rows(table: DataTable[str], shown: Rows, wanted: Rows) -> None:
    """The table from `shown` to `wanted` by row and by cell: a cell is drawn again only when it changed."""
    for key in shown.keys() - wanted.keys():
        table.remove_row(key)
    for key, cells in wanted.items():
        before = shown.get(key)
        if before is None:
            table.add_row(*cells, key=key)
            continue
        for column, old, new in zip(COLUMNS, before, cells, strict=True):
            if old != new:
                table.update_cell(key, column, new, update_width=True)
    if list(shown) != list(wanted):  # a request came or ended: the rows in the order of `wanted`
        place = {key: index for index, key in enumerate(wanted)}
        table.sort(COLUMNS[0], key=place.__getitem__)


def _cells(record: RequestRecord) -> tuple[str, ...]:
    m = record.metrics
    cost = "–" if record.state == "running" else format_usd(record.cost, fine=True)[1:]
    if m is None:
        return (str(record.number), record.client, record.kind, record.state, *("–",) * 8)
    return (str(record.number), record.client, record.kind, record.state, f"{m.prompt_tokens:,}",
            f"{m.cached_tokens:,}", f"{m.completion_tokens:,}", f"{m.ttft_s:.2f} s" if m.ttft_s is not None else "–",
            f"{m.prefill_tok_s:,.0f}" if m.prefill_tok_s else "–", f"{m.decode_tok_s:,.1f}" if m.decode_tok_s else "–",
            f"{m.context_tokens:,}/{m.n_ctx:,}", cost)
