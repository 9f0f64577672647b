"""A one-line slider for numeric settings such as temperature or top-p.

Textual has no slider, and textual-slider is GPL and integer-only, so this is our own.
"""

from __future__ import annotations

from decimal import Decimal
from math import floor
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget


def _decimals(number: float) -> int:
    """Decimal places of a number as written, e.g. 0.05 -> 2, so grid values can be rounded clean."""
    exponent = Decimal(repr(number)).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _round_half_up(number: float) -> int:
    """Round .5 up, so snapping is symmetric (Python's round() rounds half to even)."""
    return floor(number + 0.5)


class Slider(Widget, can_focus=True):
    """Pick a number on the grid `minimum + k * step`, by keyboard or mouse.

    Values are computed from the integer k and rounded to the decimals of `step`
    and `minimum`, so float drift never shows (0.7, not 0.7000000000000001).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,minus", "move(-1)", "Decrease", show=False),
        Binding("right,plus", "move(1)", "Increase", show=False),
        Binding("shift+left,pagedown", "move(-10)", "Decrease x10", show=False),
        Binding("shift+right,pageup", "move(10)", "Increase x10", show=False),
        Binding("home", "jump(False)", "Minimum", show=False),
        Binding("end", "jump(True)", "Maximum", show=False),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {"slider--filled", "slider--knob", "slider--track"}

    DEFAULT_CSS = """
    Slider {
        height: 1;
        pointer: pointer;
        & > .slider--filled { color: $primary; }
        & > .slider--knob { color: $foreground 70%; }
        & > .slider--track { color: $foreground 30%; }
        &:hover > .slider--knob { color: $foreground; }
        /* $text-accent is contrast-adjusted per theme ($accent is too pale on light ones). */
        &:focus {
            background: $foreground 8%;
            & > .slider--filled { color: $text-accent; }
            & > .slider--knob { color: $text-accent; text-style: bold; }
        }
    }
    """

    value: reactive[float] = reactive(0.0, init=False)
    """The current value; assignments are snapped to the grid and clamped to the range."""

    class Changed(Message):
        """Posted when the value actually changes, by the user or by code."""

        def __init__(self, slider: Slider, value: float) -> None:
            super().__init__()
            self.slider = slider
            self.value = value

        @property
        def control(self) -> Slider:
            """The slider, so `@on(Slider.Changed, "#id")` selectors work."""
            return self.slider

    def __init__(
        self,
        value: float,
        minimum: float,
        maximum: float,
        step: float,
        *,
        integer: bool = False,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        if step <= 0 or maximum < minimum:
            raise ValueError("Slider needs step > 0 and maximum >= minimum")
        if integer and not (float(step).is_integer() and float(minimum).is_integer()):
            raise ValueError("An integer Slider needs a whole-number step and minimum")
        self.minimum = minimum
        self.step = step
        self.integer = integer
        self._decimals = 0 if integer else max(_decimals(step), _decimals(minimum))
        # The last grid point that does not pass maximum (1e-9 absorbs float error in the division).
        self._steps = floor((maximum - minimum) / step + 1e-9)
        self.maximum = self._value_at(self._steps)
        self.set_reactive(Slider.value, self.validate_value(value))

    def _value_at(self, index: int) -> float:
        """The grid value at step `index`, clamped to the range."""
        index = min(max(index, 0), self._steps)
        value = round(self.minimum + index * self.step, self._decimals)
        return int(value) if self.integer else value

    def _index_of(self, value: float) -> int:
        """The nearest grid step to `value`; may be out of range, `_value_at` clamps."""
        return _round_half_up((value - self.minimum) / self.step)

    def validate_value(self, value: float) -> float:
        return self._value_at(self._index_of(value))

    def watch_value(self, value: float) -> None:
        self.post_message(self.Changed(self, value))

    def action_move(self, steps: int) -> None:
        self.value = self._value_at(self._index_of(self.value) + steps)

    def action_jump(self, to_maximum: bool) -> None:
        self.value = self.maximum if to_maximum else self.minimum

    def _set_from_mouse(self, event: events.MouseEvent) -> None:
        """Map x across the content width (first cell = minimum, last = maximum)."""
        x = event.get_content_offset_capture(self).x
        span = max(self.content_size.width - 1, 1)
        self.value = self._value_at(_round_half_up(x / span * self._steps))

    def _on_mouse_down(self, event: events.MouseDown) -> None:
        if event.button == 1:
            self.capture_mouse()
            self._set_from_mouse(event)

    def _on_mouse_move(self, event: events.MouseMove) -> None:
        if self.app.mouse_captured is self:
            self._set_from_mouse(event)

    def _on_mouse_up(self) -> None:
        self.release_mouse()

    def render(self) -> Content:
        width = self.content_size.width
        index = self._index_of(self.value)
        knob = _round_half_up(index / self._steps * (width - 1)) if self._steps else 0
        return Content.assemble(
            ("━" * knob, self.get_visual_style("slider--filled")),
            ("●", self.get_visual_style("slider--knob")),
            ("─" * (width - knob - 1), self.get_visual_style("slider--track")),
        )
