"""A one-line slider for numeric settings such as temperature or top-p.

Textual has no slider, and textual-slider is GPL and integer-only, so this is our own. A number can
also be typed on it (digits start the entry; Enter sets it).
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

from ..widgets.fields import ControlMessage, KeysInTurn


def _decimals(number: float) -> int:
    """Decimal places of a number as written, e.g. 0.05 -> 2, so grid values can be rounded clean."""
    exponent = Decimal(repr(number)).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _round_half_up(number: float) -> int:
    """Round .5 up, so snapping is symmetric (Python's round() rounds half to even)."""
    return floor(number + 0.5)


class Slider(KeysInTurn, Widget, can_focus=True):
    """Pick a number on the grid `minimum + k * step`, by keyboard or mouse, or type one.

    Values are computed from the integer k and rounded to the decimals of `step`
    and `minimum`, so float drift never shows (0.7, not 0.7000000000000001).

    Typing a digit or `.` starts an entry drawn in place of the bar: `-` flips its sign, Backspace
    edits, Enter (or leaving the slider) posts `Entered` with the text, Esc drops it. The owner checks
    it: a setting may accept more than the slider shows (max tokens beyond the slider's end).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,minus", "move(-1)", "Decrease", show=False),
        Binding("right,plus", "move(1)", "Increase", show=False),
        Binding("shift+left,pagedown", "move(-10)", "Decrease x10", show=False),
        Binding("shift+right,pageup", "move(10)", "Increase x10", show=False),
        Binding("home", "jump(False)", "Minimum", show=False),
        Binding("end", "jump(True)", "Maximum", show=False),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {"slider--filled", "slider--knob", "slider--track", "slider--hint"}

    DEFAULT_CSS = """
    Slider {
        height: 1;
        pointer: pointer;
        & > .slider--filled { color: $primary; }
        & > .slider--knob { color: $foreground 70%; }
        & > .slider--track { color: $foreground 30%; }
        & > .slider--hint { color: $text-muted; }
        &:hover > .slider--knob { color: $foreground; }
        /* $text-accent is contrast-adjusted per theme ($accent is too pale on light ones). */
        &:focus {
            background: $accent 20%;
            & > .slider--filled { color: $text-accent; }
            & > .slider--knob { color: $text-accent; text-style: bold; }
        }
    }
    """

    value: reactive[float] = reactive(0.0, init=False)
    """The current value; assignments are snapped to the grid and clamped to the range."""
    typed: reactive[str | None] = reactive(None)
    """The number being typed; None when not typing."""

    class Changed(Message):
        """Posted when the value actually changes, by the user or by code; `key`: the key that changed it
        (None: the mouse, or code), so the owner can say what a stray Home or End did."""

        def __init__(self, slider: Slider, value: float, key: str | None = None) -> None:
            super().__init__()
            self.slider = slider
            self.value = value
            self.key = key

        @property
        def control(self) -> Slider:
            """The slider, so `@on(Slider.Changed, "#id")` selectors work."""
            return self.slider

    class Entered(ControlMessage):
        """A number was typed and Enter pressed (or the slider left): `text` as typed, unchecked."""

        def __init__(self, slider: Slider, text: str) -> None:
            super().__init__(slider)
            self.slider = slider
            self.text = text

        @property
        def control(self) -> Slider:
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
        self._pressed: str | None = None  # the key being handled, for `Changed`

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
        self.post_message(self.Changed(self, value, self._pressed))
        self._pressed = None

    def action_move(self, steps: int) -> None:
        self.value = self._value_at(self._index_of(self.value) + steps)

    def action_jump(self, to_maximum: bool) -> None:
        self.value = self.maximum if to_maximum else self.minimum

    async def _on_key(self, event: events.Key) -> None:
        """Typing a number; other keys go on to the bindings (KeysInTurn), an entry set first."""
        self._pressed = None
        if self._typing_key(event.key, event.character):
            event.stop()
            event.prevent_default()
            return
        if self.typed is not None:
            self.commit_typed()
        self._pressed = event.key

    def _typing_key(self, key: str, character: str | None) -> bool:
        """Apply `key` to the entry; False when it is not a typing key here."""
        typed = self.typed
        if character is not None and (character.isdigit() or character == "."):
            self.typed = (typed or "") + character
        elif typed is None:
            return False
        elif key == "minus":
            self.typed = typed[1:] if typed.startswith("-") else "-" + typed
        elif key == "backspace":
            self.typed = typed[:-1]
        elif key == "enter":
            self.commit_typed()
        elif key == "escape":
            self.typed = None
        else:
            return False
        return True

    def commit_typed(self) -> None:
        typed, self.typed = self.typed, None
        if typed and typed != "-":
            self.post_message(self.Entered(self, typed))

    def on_blur(self) -> None:
        self.commit_typed()

    def _set_from_mouse(self, event: events.MouseEvent) -> None:
        """Map x across the content width (first cell = minimum, last = maximum)."""
        self._pressed = None
        x = event.get_content_offset_capture(self).x
        span = max(self.content_size.width - 1, 1)
        self.value = self._value_at(_round_half_up(x / span * self._steps))

    def on_mouse_down(self, event: events.MouseDown) -> None:
        if event.button == 1:
            self.capture_mouse()
            self._set_from_mouse(event)

    def _on_mouse_move(self, event: events.MouseMove) -> None:
        if self.app.mouse_captured is self:
            self._set_from_mouse(event)

    def on_mouse_up(self) -> None:
        self.release_mouse()

    def render(self) -> Content:
        width = self.content_size.width
        if self.typed is not None:
            return Content.assemble(
                ("› ", self.get_visual_style("slider--knob")),
                (self.typed, self.get_visual_style("slider--filled")),
                ("▏ Enter sets · Esc", self.get_visual_style("slider--hint")),
            ).truncate(width)
        index = self._index_of(self.value)
        knob = _round_half_up(index / self._steps * (width - 1)) if self._steps else 0
        return Content.assemble(
            ("━" * knob, self.get_visual_style("slider--filled")),
            ("●", self.get_visual_style("slider--knob")),
            ("─" * (width - knob - 1), self.get_visual_style("slider--track")),
        )
