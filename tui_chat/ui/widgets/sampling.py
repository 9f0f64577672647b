"""Sampling controls, built from the engine's parameter table: a new row there is a new control here.

Changes go straight into the request's `LiveParams`, which the engine reads before every token.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import Button, Input, Static

from ...engine.base import ModelInfo
from ...engine.params import PARAMS, PRESETS, SPECS, InvalidParameter, LiveParams, ParamSpec
from .slider import Slider


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


class SamplingPanel(Vertical):
    DEFAULT_CSS = """
    SamplingPanel .hint { color: $text-muted; }
    SamplingPanel .param-label { margin: 1 0 0 0; }
    SamplingPanel #presets { height: auto; margin: 1 0 0 0; }
    SamplingPanel #presets Button { width: 1fr; min-width: 0; }
    SamplingPanel Input { margin: 0; }
    SamplingPanel #applied { margin: 1 0; color: $success; }
    """

    def __init__(self, live: LiveParams, **kwargs) -> None:
        super().__init__(**kwargs)
        self.live = live
        self.pending_version: int | None = None
        self.per_token = True  # False for a server: a change waits for the next reply

    def compose(self) -> ComposeResult:
        _, params = self.live.snapshot()
        with Horizontal(id="presets"):
            for name in PRESETS:
                yield Button(name, id=f"preset-{name.lower()}", compact=True)
        for spec in PARAMS:
            value = getattr(params, spec.name)
            yield Static(Content(self._label(spec, value)), id=f"label-{spec.name}", classes="param-label")
            if spec.control == "seed":
                yield Input("" if value < 0 else str(value), placeholder="random", id=spec.name,
                            type="integer", compact=True)
            else:
                low, high, step = spec.slider_range
                yield Slider(value, low, high, step, integer=spec.kind is int, id=spec.name)
            yield Static(Content(spec.hint), id=f"hint-{spec.name}", classes="hint")
        yield Static(Content("Stop sequences (a | b, \\n = newline)"), classes="param-label")
        yield Input(shown_stops(params.stop), placeholder="none", id="stop", compact=True)
        yield Static(id="applied", classes="hint")

    def on_mount(self) -> None:
        self.border_title = "Sampling"

    def show_backend(self, info: ModelInfo) -> None:
        """A server may pass on only some settings, and only when a reply starts: say so on each control."""
        self.per_token = info.params_per_token
        for spec in PARAMS:
            ignored = spec.name in info.ignored_params
            self.query_one(f"#{spec.name}").disabled = ignored
            hint = "This server ignores it: not sent." if ignored else spec.hint
            self.query_one(f"#hint-{spec.name}", Static).update(Content(hint))

    @staticmethod
    def _label(spec: ParamSpec, value: float) -> str:
        return f"{spec.label:<15}{format_value(spec, value):>8}"

    def _apply(self, **changes) -> None:
        try:
            params = self.live.update(**changes)
        except InvalidParameter as error:
            self.notify(str(error), severity="error", markup=False)
            return
        for name in changes:
            if name in SPECS:
                spec = SPECS[name]
                self.query_one(f"#label-{name}", Static).update(Content(self._label(spec, getattr(params, name))))
        self.pending_version = self.live.version
        waiting = "the next token" if self.per_token else "the next reply (a server takes settings per reply)"
        self.query_one("#applied", Static).update(Content(f"Change waiting for {waiting}"))

    def show_applied(self, token_number: int) -> None:
        """The engine drew a token with the new settings: say where the change took effect."""
        self.pending_version = None
        self.query_one("#applied", Static).update(Content(f"✓ Applied from token {token_number}"))

    @on(Slider.Changed)
    def _slider_changed(self, event: Slider.Changed) -> None:
        self._apply(**{event.slider.id: event.value})

    @on(Input.Submitted, "#seed")
    @on(Input.Blurred, "#seed")
    def _seed_changed(self, event: Input.Submitted | Input.Blurred) -> None:
        self._apply(seed=int(event.value) if event.value.strip() else -1)

    @on(Input.Submitted, "#stop")
    @on(Input.Blurred, "#stop")
    def _stops_changed(self, event: Input.Submitted | Input.Blurred) -> None:
        self._apply(stop=parse_stops(event.value))

    @on(Button.Pressed)
    def _preset_pressed(self, event: Button.Pressed) -> None:
        self.apply_preset(str(event.button.label))

    def apply_preset(self, name: str) -> None:
        self.set_values(PRESETS[name])
        self.notify(f"Preset: {name}", timeout=2, markup=False)

    def set_values(self, values: dict) -> None:
        """Settings from elsewhere (a preset, a reopened conversation): the controls follow them."""
        with self.prevent(Slider.Changed):
            for name, value in values.items():
                if name == "seed":
                    self.query_one("#seed", Input).value = "" if value < 0 else str(value)
                elif name == "stop":
                    self.query_one("#stop", Input).value = shown_stops(value)
                elif name in SPECS:
                    self.query_one(f"#{name}", Slider).value = value
        self._apply(**values)
