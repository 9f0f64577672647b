"""The sampler chain's order as a row of stages the user can rearrange.

Each stage of `sampler_order` is shown in the order the chain applies it; the ones today's settings
turn on stand out, the ones they leave as no-ops are muted, and the ones left out of the order follow
after `out:`. The line below says what actually runs, as the engine plans it (stages.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.style import Style as VisualStyle
from textual.widget import Widget

from ...engine.params import DEFAULT_ORDER, SAMPLER_STAGES, SamplingParams
from ...engine.stages import is_on, label, plan
from ..widgets.fields import ControlMessage

SHORT_NAMES = {
    "penalties": "penalties", "dry": "DRY", "top_n_sigma": "top-nσ", "top_k": "top-k", "typical_p": "typical-p",
    "top_p": "top-p", "min_p": "min-p", "xtc": "XTC", "temperature": "temperature",
}


def stage_row(order: tuple[str, ...]) -> list[str]:
    """The stages as the row shows them: those in the order, then those left out of it."""
    return [*order, *(stage for stage in SAMPLER_STAGES if stage not in order)]


def moved(order: tuple[str, ...], stage: str, step: int) -> tuple[str, ...]:
    """`order` with `stage` one place earlier (-1) or later (+1); unchanged at either end."""
    index = order.index(stage)
    target = index + step
    if not 0 <= target < len(order):
        return order
    stages = list(order)
    stages[index], stages[target] = stages[target], stages[index]
    return tuple(stages)


def toggled(order: tuple[str, ...], stage: str) -> tuple[str, ...]:
    """`stage` left out of the order, or put back at its end. The last stage cannot be left out."""
    if stage not in order:
        return (*order, stage)
    return order if len(order) == 1 else tuple(s for s in order if s != stage)


def plan_line(params: SamplingParams) -> str:
    """What runs with these settings, in order: `top-k 40 → min-p 0.05 → temperature 0.7 → the draw`."""
    return " → ".join(label(stage, params) for stage in plan(params))


class OrderBar(Widget, can_focus=True):
    """←/→ pick a stage, Shift+←/→ (or `<` `>`) move it, Space leaves it out or puts it back,
    `d` brings back llama.cpp's order. Changes post `Changed` with the new order."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "pick(-1)", "Previous stage", show=False),
        Binding("right", "pick(1)", "Next stage", show=False),
        Binding("shift+left,less_than_sign", "move(-1)", "Move earlier", show=False),
        Binding("shift+right,greater_than_sign", "move(1)", "Move later", show=False),
        Binding("space", "toggle_stage", "Leave out / put back", show=False),
        Binding("d", "default", "llama.cpp's order", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"order--on", "order--off", "order--out", "order--cursor", "order--plan"}
    DEFAULT_CSS = """
    OrderBar {
        height: auto;
        pointer: pointer;
        & > .order--on { color: $text-accent; text-style: bold; }
        & > .order--off { color: $text-muted; }
        & > .order--out { color: $text-muted; text-style: strike; }
        & > .order--cursor { text-style: reverse; }
        & > .order--plan { color: $text-muted; }
        &:focus { background: $accent 20%; }
    }
    """

    class Changed(ControlMessage):
        def __init__(self, bar: OrderBar, order: tuple[str, ...]) -> None:
            super().__init__(bar)
            self.order = order

    def __init__(self, params: SamplingParams, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.params = params
        self.cursor = 0

    def show(self, params: SamplingParams) -> None:
        """The settings changed (any of them can turn a stage on or off): draw them."""
        self.params = params
        self.cursor = min(self.cursor, len(SAMPLER_STAGES) - 1)
        self.refresh(layout=True)

    @property
    def picked(self) -> str:
        return stage_row(self.params.sampler_order)[self.cursor]

    def action_pick(self, step: int) -> None:
        self.cursor = max(0, min(self.cursor + step, len(SAMPLER_STAGES) - 1))
        self.refresh()

    def action_move(self, step: int) -> None:
        order = self.params.sampler_order
        if self.picked in order and (changed := moved(order, self.picked, step)) != order:
            self.cursor += step
            self.post_message(self.Changed(self, changed))

    def action_toggle_stage(self) -> None:
        order = self.params.sampler_order
        changed = toggled(order, self.picked)
        if changed != order:
            self.cursor = stage_row(changed).index(self.picked)
            self.post_message(self.Changed(self, changed))

    def action_default(self) -> None:
        if self.params.sampler_order != DEFAULT_ORDER:
            self.post_message(self.Changed(self, DEFAULT_ORDER))

    def render(self) -> Content:
        order = self.params.sampler_order
        parts: list[tuple[str, VisualStyle] | str] = []
        for index, stage in enumerate(stage_row(order)):
            if index == len(order):
                parts.append(("  out: ", self.get_visual_style("order--off")))
            elif index:
                parts.append(" › ")
            kind = "order--out" if stage not in order else "order--on" if is_on(stage, self.params) else "order--off"
            style = self.get_visual_style(kind)
            if index == self.cursor and self.has_focus:
                style += self.get_visual_style("order--cursor")
            parts.append((SHORT_NAMES[stage], style))
        parts.append(("\nruns: " + plan_line(self.params), self.get_visual_style("order--plan")))
        return Content.assemble(*parts)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
