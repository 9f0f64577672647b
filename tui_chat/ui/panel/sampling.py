"""Sampling controls, built from the engine's parameter table: a new row there is a new control here.

Changes go straight into the request's `LiveParams`, which the engine reads before every token. The
common settings come first; the samplers most people leave off are folded under "More samplers", and
the logit bias under its own heading, so the 34-column panel stays short enough to use at 80x24. Each
setting is a row (label, control, its hint while it has focus, and a note under the control that last
changed saying from which token the change applied).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Collapsible, Input, Select, Static

from ...engine.base import EngineError, FormatChecking, ModelInfo
from ...engine.formats import TEXT, FormatError, OutputFormat
from ...engine.params import LIST_SPECS, PARAMS, PRESETS, SPECS, InvalidParameter, LiveParams, ParamSpec, SamplingParams
from ..keys import shown_key
from ..widgets.fields import TextField, TickBox
from .bias import BiasList
from .order import OrderBar
from .output_format import FormatPicker
from .slider import Slider

if TYPE_CHECKING:
    from ...session import Writing

MAIN_PARAMS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "thinking_budget", "seed")
MORE_PARAMS = tuple(spec.name for spec in PARAMS if spec.name not in MAIN_PARAMS)
DEFAULTS = SamplingParams()
SETTINGS_SAVED_AFTER_S = 0.5  # the chat's settings reach the history this long after the last change
STREAM_HINT = ("On: the reply appears token by token. Off: it is held until complete, then shown whole, "
               "with the wait compared to the first word's.")
FORMAT_HINT = "Free text, a JSON object, JSON matching a schema, or a GBNF grammar; kept with this chat."
HINTS = {spec.name: spec.hint for spec in PARAMS} | {
    "stop": LIST_SPECS["stop"].hint + " Separate them with |; \\n stands for a new line.",
    "sampler_order": LIST_SPECS["sampler_order"].hint + " ←/→ pick a stage, Shift+←/→ move it, Space leaves it out "
                     "or puts it back, d resets.",
    "logit_bias": LIST_SPECS["logit_bias"].hint + " Enter on a row edits it, Delete removes it.",
}


def format_value(spec: ParamSpec, value: float) -> str:
    if value < 0 and spec.below_zero:
        return spec.below_zero
    return str(value) if spec.kind is int else f"{value:.2f}"


def shown_stops(stops: tuple[str, ...] | list[str]) -> str:
    return " | ".join(stops).replace("\n", "\\n")


def parse_stops(text: str) -> list[str]:
    r"""`a | b` gives two stop sequences; `\n` and `\t` stand for a newline and a tab."""
    stops = (part.strip().replace("\\n", "\n").replace("\\t", "\t") for part in text.split("|"))
    return [stop for stop in stops if stop]


def param_label(spec: ParamSpec, value: float) -> str:
    return f"{spec.label:<15}{format_value(spec, value):>8}"


def row(name: str, label: str, control: Widget, hint: str) -> Vertical:
    """One setting: its label, its control, its hint (shown while the row has focus) and its note."""
    return Vertical(
        Static(Content(label), id=f"label-{name}", classes="param-label"),
        control,
        Static(Content(hint), id=f"hint-{name}", classes="hint"),
        Static(id=f"note-{name}", classes="note"),
        id=f"row-{name}", classes="param",
    )


def more_title(params: SamplingParams) -> str:
    changed = sum(getattr(params, name) != getattr(DEFAULTS, name) for name in MORE_PARAMS)
    return f"More samplers · {changed} changed" if changed else "More samplers"


def bias_title(params: SamplingParams) -> str:
    return f"Logit bias · {len(params.logit_bias)}" if params.logit_bias else "Logit bias"


class SamplingPanel(Vertical):
    DEFAULT_CSS = """
    SamplingPanel .param { height: auto; margin: 1 0 0 0; border-left: blank; }
    SamplingPanel .param:focus-within { border-left: thick $accent; }
    SamplingPanel .param:focus-within > .param-label { color: $text-accent; text-style: bold; }
    SamplingPanel .hint { color: $text-muted; display: none; }
    SamplingPanel .param:focus-within > .hint, SamplingPanel .param.-ignored > .hint { display: block; }
    SamplingPanel .note { color: $success; display: none; }
    SamplingPanel .note.-shown { display: block; }
    SamplingPanel #row-presets { height: auto; margin: 1 0 0 0; }
    SamplingPanel #presets { height: auto; }
    SamplingPanel #presets Button { width: 1fr; min-width: 0; }
    SamplingPanel Input { margin: 0; }
    SamplingPanel Collapsible { padding: 0; margin: 1 0 0 0; background: transparent; }
    SamplingPanel Collapsible > Contents { padding: 0; }
    SamplingPanel Collapsible .param:first-child { margin: 0; }
    """

    class FormatChosen(Message):
        """The chat's output format, from its next reply (the screen keeps it with the chat)."""

        def __init__(self, output: OutputFormat) -> None:
            super().__init__()
            self.output = output

    class StreamingChosen(Message):
        def __init__(self, on: bool) -> None:
            super().__init__()
            self.on = on

    class Rested(Message):
        """The settings stopped changing: the screen saves them with the chat."""

    # The reply being written, if any: the chat screen's one record of it, bound to it (`data_bind`).
    writing: reactive[Writing | None] = reactive(None, init=False)

    def __init__(self, live: LiveParams, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.live = live
        self.output: OutputFormat = TEXT  # the chat's (`show_format`)
        self.checker: FormatChecking | None = None  # the model in use, where it says what it makes of a format
        self._rest: Timer | None = None  # a change waiting to be saved with the chat
        self.pending_version: int | None = None  # a change made mid-reply, until a token is drawn with it
        self._noted = ""  # the row whose note tells of the last change
        self._did = ""  # what the key that made it did, e.g. "End: Repeat penalty → 2.00"
        self.per_token = True  # False for a server: a change waits for the next reply

    def compose(self) -> ComposeResult:
        _, params = self.live.snapshot()
        yield Vertical(Horizontal(*(Button(name, id=f"preset-{name.lower()}", compact=True) for name in PRESETS),
                                  id="presets"),
                       Static(id="note-presets", classes="note"), id="row-presets")
        for name in MAIN_PARAMS:
            yield self._param_row(SPECS[name], params)
        yield row("stop", "Stop sequences   a | b",
                  TextField(shown_stops(params.stop), placeholder="none", id="stop", compact=True), HINTS["stop"])
        yield row("sampler_order", LIST_SPECS["sampler_order"].label, OrderBar(params, id="sampler_order"),
                  HINTS["sampler_order"])
        with Collapsible(title=more_title(params), id="more"):
            for name in MORE_PARAMS:
                yield self._param_row(SPECS[name], params)
        with Collapsible(title=bias_title(params), id="bias-group"):
            yield row("logit_bias", LIST_SPECS["logit_bias"].label, BiasList(params.logit_bias, id="logit_bias"),
                      HINTS["logit_bias"])
        yield row("format", "Output format", FormatPicker(id="format"), FORMAT_HINT)
        yield row("stream", "Streaming", TickBox("Stream replies", True, compact=True, id="stream"), STREAM_HINT)

    @staticmethod
    def _param_row(spec: ParamSpec, params: SamplingParams) -> Vertical:
        value = getattr(params, spec.name)
        control: Widget
        if spec.control == "seed":
            control = TextField("" if value < 0 else str(value), placeholder="random", id=spec.name, type="integer",
                                compact=True)
        else:
            low, high, step = spec.slider_range
            control = Slider(value, low, high, step, integer=spec.kind is int, id=spec.name)
        return row(spec.name, param_label(spec, value), control, HINTS[spec.name])

    def on_mount(self) -> None:
        self.border_title = "Sampling"

    def show_backend(self, info: ModelInfo, backend: object) -> None:
        """A server may pass on only some settings, and only when a reply starts: say so on each control; and
        what the model in use makes of the chat's output format."""
        self.checker = backend if isinstance(backend, FormatChecking) else None
        self.per_token = info.params_per_token
        for name, hint in HINTS.items():
            ignored = name in info.ignored_params
            self.query_one(f"#{name}").disabled = ignored
            self.query_one(f"#row-{name}").set_class(ignored, "-ignored")
            shown = "This server ignores it: not sent." if ignored else hint
            self.query_one(f"#hint-{name}", Static).update(Content(shown))
        self._check_format(self.output)

    def show_format(self, output: OutputFormat = TEXT) -> None:
        """The conversation's output format (a new chat, a reopened one)."""
        self.output = output
        self.query_one(FormatPicker).show(output)
        self._check_format(output)

    def _check_format(self, output: OutputFormat) -> None:
        """What the model's engine makes of a schema or grammar, said under the picker: that it cannot be
        used, or what of it is not enforced while writing. Off the UI thread: the first check of a model
        builds its tokenizer (1-4 s)."""
        backend = self.checker
        if output.constrained and backend is not None:
            self.run_worker(partial(self._checked, backend, output), thread=True, group="format", exclusive=True)

    def _checked(self, backend: FormatChecking, output: OutputFormat) -> None:
        try:
            note, refused = backend.check_format(output), False
        except (FormatError, EngineError) as error:
            note, refused = str(error), True
        self.app.call_from_thread(self.query_one(FormatPicker).checked, output, note, refused)

    # --- applying a change ---------------------------------------------------------------------

    def _apply(self, row_name: str | None, did: str = "", **changes: Any) -> None:
        """Check and apply `changes`; `row_name`: where to say from when it applies (None: nowhere), and
        `did` what a key did there."""
        _, current = self.live.snapshot()
        try:
            if current.with_changes(**changes) == current:
                return
            params = self.live.update(**changes)
        except InvalidParameter as error:
            self.notify(str(error), severity="error", markup=False)
            return
        self._show(params, changes)
        self._keep_when_resting()
        if row_name is not None:
            self._note_change(row_name, did)

    def _show(self, params: SamplingParams, changed: dict[str, Any]) -> None:
        """The controls that read the settings follow them (the order row reads them all)."""
        for name in changed:
            if name in SPECS:
                label = param_label(SPECS[name], getattr(params, name))
                self.query_one(f"#label-{name}", Static).update(Content(label))
        self.query_one(OrderBar).show(params)
        self.query_one(BiasList).show(params.logit_bias)
        self.query_one("#more", Collapsible).title = more_title(params)
        self.query_one("#bias-group", Collapsible).title = bias_title(params)

    def _note_change(self, row_name: str, did: str = "") -> None:
        """Mid-reply a change waits for the next token (show_applied says which); otherwise the next
        reply uses it. A server takes settings only when a reply starts."""
        self.pending_version = None
        self._did = did
        if self.writing is not None and self.per_token:
            self.pending_version = self.live.version
            self._note(row_name, "Waiting for the next token…")
        elif self.writing is not None:
            self._note(row_name, "Set: a server takes settings per reply, so from the next one")
        else:
            self._note(row_name, "✓ Set: the next reply uses it")

    def _note(self, row_name: str, text: str) -> None:
        if self._noted and self._noted != row_name:
            self.query_one(f"#note-{self._noted}", Static).remove_class("-shown")
        self._noted = row_name
        note = self.query_one(f"#note-{row_name}", Static)
        note.update(Content("\n".join(filter(None, (self._did, text)))))
        note.add_class("-shown")
        note.scroll_visible(animate=False)

    def show_applied(self, token_number: int) -> None:
        """The engine drew a token with the new settings: say where the change took effect."""
        self.pending_version = None
        self._note(self._noted, f"✓ Applied from token {token_number}")

    def watch_writing(self, writing: Writing | None) -> None:
        """A reply started: notes told of changes before it are done with. It ended: a change still waiting is
        for the next one."""
        if writing is not None and self._noted:
            self.query_one(f"#note-{self._noted}", Static).remove_class("-shown")
            self._noted = self._did = ""
        elif writing is None and self.pending_version is not None:
            self.pending_version = None
            self._note(self._noted, "✓ Set: the next reply uses it")

    def _keep_when_resting(self) -> None:
        """The chat's settings are what was last set in it: saved with it as they change, once they rest
        (a slider dragged is many changes), as a reply's text is saved while it streams."""
        if self._rest is not None:
            self._rest.stop()
        self._rest = self.set_timer(SETTINGS_SAVED_AFTER_S, lambda: self.post_message(self.Rested()))

    @on(FormatPicker.Chosen)
    def _format_chosen(self, event: FormatPicker.Chosen) -> None:
        event.stop()
        self.output = event.output
        self.post_message(self.FormatChosen(event.output))
        self._check_format(event.output)

    @on(Checkbox.Changed, "#stream")
    def _streaming_chosen(self, event: Checkbox.Changed) -> None:
        self.post_message(self.StreamingChosen(event.value))

    # --- the controls --------------------------------------------------------------------------

    @on(Slider.Changed)
    def _slider_changed(self, event: Slider.Changed) -> None:
        """A key says what it did, so a stray Home or End does not move a setting unnoticed."""
        name = event.slider.id
        assert name is not None, "each setting's slider has the setting's name as its id"
        spec, key = SPECS[name], event.key and shown_key(event.key)
        did = f"{key[0].upper()}{key[1:]}: {spec.label} → {format_value(spec, event.value)}" if key else ""
        self._apply(name, did, **{name: event.value})

    @on(Slider.Entered)
    def _number_typed(self, event: Slider.Entered) -> None:
        """A typed number may lie beyond the slider's end (max tokens): the setting's own range decides."""
        slider, name = event.control, event.control.id
        assert name is not None, "each setting's slider has the setting's name as its id"
        self._apply(name, **{name: event.text})
        with self.prevent(Slider.Changed):
            slider.value = getattr(self.live.snapshot()[1], name)

    @on(Input.Submitted, "#seed")
    @on(Input.Blurred, "#seed")
    def _seed_changed(self, event: Input.Submitted | Input.Blurred) -> None:
        self._apply("seed", seed=event.value.strip() or -1)

    @on(Input.Submitted, "#stop")
    @on(Input.Blurred, "#stop")
    def _stops_changed(self, event: Input.Submitted | Input.Blurred) -> None:
        self._apply("stop", stop=parse_stops(event.value))

    @on(OrderBar.Changed)
    def _order_changed(self, event: OrderBar.Changed) -> None:
        self._apply("sampler_order", sampler_order=event.order)

    @on(BiasList.Changed)
    def _bias_changed(self, event: BiasList.Changed) -> None:
        self._apply("logit_bias", logit_bias=event.entries)

    @on(Button.Pressed, "#presets Button")
    def _preset_pressed(self, event: Button.Pressed) -> None:
        self.apply_preset(str(event.button.label))

    def apply_preset(self, name: str) -> None:
        self.set_values(PRESETS[name], note_row="presets")
        self.notify(f"Preset: {name}", timeout=2, markup=False)

    def focus_format(self) -> None:
        """The output format's picker focused and in view, once the palette has gone and a panel just shown has
        its layout (before, the scroll is lost)."""
        kind = self.query_one("#format-kind", Select)
        kind.focus()
        self.set_timer(0.1, lambda: kind.scroll_visible(top=True, animate=False))

    def set_values(self, values: dict[str, Any], note_row: str | None = None) -> None:
        """Settings from elsewhere (a preset, a reopened conversation): the controls follow them."""
        with self.prevent(Slider.Changed):
            for name, value in values.items():
                if name == "seed":
                    self.query_one("#seed", Input).value = "" if value < 0 else str(value)
                elif name == "stop":
                    self.query_one("#stop", Input).value = shown_stops(value)
                elif name in SPECS:
                    self.query_one(f"#{name}", Slider).value = value
        self._apply(note_row, **values)
