"""The sampling lab: the last prompt (or the draft) answered side by side under 2–4 sampling settings, decoded
together over one read of the prompt. Each column streams its reply as a heatmap with its figures; the lab
marks where a column first parted from the first one. Keep puts a column into the chat as the reply (the
others become its branches): the screen is dismissed with the column's index."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Input, Static

from ...engine.base import Error, LabDone, Message, Request, Stream
from ...engine.compare import MAX_COLUMNS, Divergence
from ...engine.params import InvalidParameter, SamplingParams
from ...lab import Column, Lab
from ...replies import Outcome, Refused, SideBySide, Started
from ...safetext import quoted, screen_safe
from ...wording import stop_label
from ..bridge import EngineBatch, forward_events
from ..textual_fixes import Footer
from ..widgets.heatmap import SELECTED, band_of, band_styles

FIRST_COLUMNS = 2
SHOWN_SETTINGS = ("temperature", "top_p", "top_k", "min_p")


def settings_text(params: SamplingParams, **changes: object) -> str:
    """The main knobs as a column's settings field shows them (`temperature=0.7,top_p=0.9,…`); a seed where set."""
    values = {name: getattr(params, name) for name in SHOWN_SETTINGS} | changes
    if params.seed >= 0:
        values.setdefault("seed", params.seed)
    return ",".join(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
                    for name, value in values.items())


def contrast(params: SamplingParams) -> dict[str, object]:
    """What the second column changes first, so the lab opens on a comparison: greedy beside sampled settings,
    a seeded draw at temperature 1 beside greedy ones."""
    return {"temperature": 1.0, "seed": 7} if params.temperature == 0 else {"temperature": 0.0}


class LabColumn(Vertical):
    """One column: its settings (Enter runs the lab; while it runs, applies them from the next token), its
    reply as a heatmap, its figures, and Keep."""

    def __init__(self, index: int, settings: str) -> None:
        super().__init__(classes="lab-column")
        self.index = index
        self.settings = settings

    def compose(self) -> ComposeResult:
        yield Input(self.settings, placeholder="temperature=1.0,top_p=0.9,seed=7", classes="lab-settings")
        with VerticalScroll(classes="lab-body", can_focus=False):  # Tab goes from settings to settings
            yield Static(classes="lab-text")
        yield Static("", classes="lab-figures")
        yield Button("Keep", disabled=True, classes="lab-keep", tooltip="Into the chat as the reply")

    def show(self, column: Column, styles: list[Style], parted: Divergence | None, figures: str) -> None:
        text = Text()
        started = False  # the leading whitespace is left out, as the chat does
        for position, token in enumerate(column.tokens):
            style = styles[band_of(token.prob)] if token.prob is not None else Style()
            if parted is not None and position == parted.position:
                style += SELECTED
            piece = screen_safe(token.piece or token.text)
            piece = piece if started else piece.lstrip()
            started = started or bool(piece)
            text.append(piece, style)
        if column.done is not None:  # its tokens' pieces end where its text does: a stop sequence is not shown
            text = text[: len(screen_safe(column.done.text).lstrip())]
        self.query_one(".lab-text", Static).update(text)
        self.query_one(".lab-figures", Static).update(Text(figures))


class LabScreen(Screen[int | None]):
    BINDINGS = [
        Binding("ctrl+r", "run", "Run", tooltip="Run every column again (while they run: stop them)"),
        Binding("f2", "add", "Add column", tooltip=f"Add a column (at most {MAX_COLUMNS})"),
        Binding("f3", "remove", "Remove column", tooltip="Remove the last column"),
        Binding("escape", "close", "Back", tooltip="Back to the chat (stops a run; nothing is kept)"),
    ]
    DEFAULT_CSS = """
    LabScreen #lab-header { height: auto; padding: 0 1; color: $text-muted; }
    LabScreen #lab-columns { height: 1fr; }
    LabScreen .lab-column { width: 1fr; border: round $primary-darken-2; padding: 0 1; }
    LabScreen .lab-body { height: 1fr; }
    LabScreen .lab-figures { height: auto; color: $text-muted; }
    LabScreen .lab-keep { width: 100%; }
    """

    def __init__(self, start: Callable[[SideBySide], Outcome], messages: list[Message], question: str,
                 base: SamplingParams, top_logprobs: int = 0, reply_tok_s: float | None = None) -> None:
        """`start`: the workspace's one starter of replies. `reply_tok_s`: the chat's latest reply's decode rate,
        what a step of the columns is set against."""
        super().__init__()
        self.start = start
        self.messages = messages
        self.question = question
        self.base = base
        self.top_logprobs = top_logprobs
        self.reply_tok_s = reply_tok_s
        self.lab: Lab | None = None
        self._stream: Stream | None = None

    def compose(self) -> ComposeResult:
        yield Static(Text(f"Lab · {quoted(self.question.strip().splitlines()[0][:200])}"), id="lab-header")
        yield Static("", id="lab-status")
        with Horizontal(id="lab-columns"):
            yield LabColumn(0, settings_text(self.base))
            yield LabColumn(1, settings_text(self.base, **contrast(self.base)))
        yield Footer()

    def on_mount(self) -> None:
        self.query(Input).first().focus()
        self._status("Ctrl+R runs every column over one read of the prompt; F2 / F3 add or remove a column.")

    @property
    def running(self) -> bool:
        return self.lab is not None and self.lab.ended is None

    def _columns(self) -> list[LabColumn]:
        return list(self.query(LabColumn))

    def _status(self, line: str) -> None:
        self.query_one("#lab-status", Static).update(Text(line))

    async def action_add(self) -> None:
        columns = self._columns()
        if self.running or len(columns) >= MAX_COLUMNS:
            return
        settings = columns[-1].query_one(Input).value
        await self.query_one("#lab-columns").mount(LabColumn(len(columns), settings))

    async def action_remove(self) -> None:
        columns = self._columns()
        if not self.running and len(columns) > 1:
            await columns[-1].remove()

    def action_close(self) -> None:
        if self.running and self._stream is not None:
            self._stream.cancel()
        self.dismiss(None)

    def action_run(self) -> None:
        if self.running and self._stream is not None:
            self._stream.cancel()
            return
        try:
            columns = [Column.parsed(column.query_one(Input).value, self.base) for column in self._columns()]
        except InvalidParameter as error:
            self.notify(str(error), severity="error", markup=False)
            return
        lab = Lab(columns)
        request: Request = lab.request(self.messages, top_logprobs=self.top_logprobs)
        outcome = self.start(SideBySide(request, [column.live for column in columns]))
        if isinstance(outcome, Refused):
            self._status(f"The lab cannot run: {outcome.reason}")
            return
        assert isinstance(outcome, Started), "only a message sent is held for a load"
        self.lab, self._stream = lab, (stream := outcome.stream)
        for widget in self._columns():
            widget.query_one(Button).disabled = True
        self._status(f"Running {len(columns)} columns… (Ctrl+R stops them)")
        self.run_worker(partial(forward_events, stream, self, lab), thread=True, group="lab")

    @on(Input.Submitted)
    def _settings_entered(self, event: Input.Submitted) -> None:
        """While the lab runs, a column's settings apply from its next token; otherwise Enter runs it."""
        if not self.running:
            self.action_run()
            return
        assert self.lab is not None
        column = next(widget for widget in self._columns() if event.input in widget.query(Input))
        try:
            params = Column.parsed(event.value, self.base).live.snapshot()[1]
        except InvalidParameter as error:
            self.notify(str(error), severity="error", markup=False)
            return
        if column.index < len(self.lab.columns):
            self.lab.columns[column.index].live.update(**params.as_dict())

    @on(EngineBatch)
    def _on_batch(self, message: EngineBatch) -> None:
        try:
            if message.job is self.lab and self.lab is not None:
                changed = self.lab.take(message.events)
                if self.lab.loading and not any(column.tokens for column in self.lab.columns):
                    self._status(f"{self.lab.loading} (Ctrl+R stops the run)")
                self._redraw(changed if self.lab.ended is None else set(range(len(self.lab.columns))))
                if self.lab.ended is not None:
                    self._ended(self.lab.ended)
        finally:
            message.done()

    def _redraw(self, changed: set[int]) -> None:
        assert self.lab is not None
        styles = band_styles(self.app.theme_variables)
        widgets = self._columns()
        for index in sorted(changed):
            if index < len(widgets):
                widgets[index].show(self.lab.columns[index], styles, self.lab.divergence(index),
                                    self._figures(index))

    def _figures(self, index: int) -> str:
        assert self.lab is not None
        column = self.lab.columns[index]
        metrics = column.metrics
        parts = [f"{len(column.tokens)} tokens"]
        if metrics is not None and metrics.decode_tok_s:
            parts.append(f"{metrics.decode_tok_s:.1f} tok/s")
        if column.done is not None:
            parts.append(stop_label(column.done.stop_reason, column.done.stop_sequence))
        if (surprise := self.lab.surprise(index)) is not None:
            parts.append(f"surprise {surprise:.2f}")
        if (parted := self.lab.divergence(index)) is not None:
            parts.append(f"parted from column 1 at token {parted.position + 1}: "
                         f"{quoted(parted.token.piece)} {_percent(parted.token.prob)} where it drew "
                         f"{quoted(parted.first.piece)} {_percent(parted.first.prob)}")
        elif index and column.done is not None:
            parts.append("same tokens as column 1")
        return " · ".join(parts)

    def _ended(self, ended: LabDone | Error) -> None:
        if isinstance(ended, Error):
            self._status(f"The lab could not run: {ended.message}")
            return
        for widget in self._columns()[: len(ended.columns)]:
            widget.query_one(Button).disabled = False
        metrics, count = ended.columns[0].metrics, ended.prompt_reads
        reads = "the server did not say how often it read it" if count is None else \
            "read once" if count == 1 else f"read {count} times"
        note = f"{ended.note[0].upper()}{ended.note[1:]} · " if ended.note else ""
        self._status(f"{note}Prompt: {metrics.prompt_tokens:,} tokens, {reads} for {len(ended.columns)} columns "
                     f"({metrics.cached_tokens:,} from the cache){self._step_cost(ended)} · Keep puts a column "
                     "into the chat as the reply; the others stay as its branches")

    def _step_cost(self, ended: LabDone) -> str:
        """What a step of every column cost, against a token of the chat's latest reply: the extra columns' price
        (not where a server ran the columns one after another)."""
        rate = ended.columns[0].metrics.decode_tok_s  # the first column stepped with the others while it went on
        if not rate or not ended.parallel:
            return ""
        line = f" · a step of the columns took {1000 / rate:.0f} ms"
        if self.reply_tok_s:
            line += f", {self.reply_tok_s / rate:.2f} × a token of the chat's last reply"
        return line

    @on(Button.Pressed, ".lab-keep")
    def _keep(self, event: Button.Pressed) -> None:
        column = next(widget for widget in self._columns() if event.button in widget.query(Button))
        self.dismiss(column.index)


def _percent(prob: float | None) -> str:
    return "" if prob is None else f"{prob:.0%}"
