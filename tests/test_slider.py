"""Slider: grid snapping, keys, mouse click and drag, Changed messages, rendering."""

from __future__ import annotations

import pytest
from textual import on
from textual.app import App, ComposeResult

from tui_chat.ui.panel.slider import Slider

# 21 cells wide with 20 steps: content x maps to exactly x * step.
WIDTH = 21


class SliderApp(App[None]):
    """Hosts the sliders under test and records every Changed message it sees."""

    CSS = f"Slider {{ width: {WIDTH}; }}"
    AUTO_FOCUS = None

    def __init__(self, *sliders: Slider) -> None:
        super().__init__()
        self.sliders = sliders
        self.changes: list[tuple[str | None, float]] = []

    def compose(self) -> ComposeResult:
        yield from self.sliders

    def on_slider_changed(self, event: Slider.Changed) -> None:
        self.changes.append((event.slider.id, event.value))


def unit_slider(value: float = 0.0) -> Slider:
    return Slider(value, 0.0, 1.0, 0.05, id="s")


def test_constructor_snaps_and_rejects_bad_ranges() -> None:
    assert Slider(0.73, 0.0, 1.0, 0.05).value == 0.75
    assert Slider(7.0, 0.0, 1.0, 0.05).value == 1.0
    off_grid = Slider(1.0, 0.0, 1.0, 0.3)
    assert off_grid.maximum == 0.9 and off_grid.value == 0.9
    with pytest.raises(ValueError):
        Slider(0.5, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        Slider(5, 0, 10, 0.5, integer=True)


async def test_setting_value_snaps_clamps_and_posts_changed() -> None:
    app = SliderApp(unit_slider())
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        for raw, snapped in [(0.73, 0.75), (0.72, 0.7), (5.0, 1.0), (-3.0, 0.0)]:
            slider.value = raw
            assert slider.value == snapped
        await pilot.pause()
        assert app.changes == [("s", 0.75), ("s", 0.7), ("s", 1.0), ("s", 0.0)]


async def test_no_float_drift_after_many_steps() -> None:
    app = SliderApp(unit_slider())
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        slider.focus()
        await pilot.press(*["right"] * 14)
        assert slider.value == 0.7 and str(slider.value) == "0.7"
        assert [str(value) for _, value in app.changes] == [
            "0.05", "0.1", "0.15", "0.2", "0.25", "0.3", "0.35",
            "0.4", "0.45", "0.5", "0.55", "0.6", "0.65", "0.7",
        ]  # fmt: skip


async def test_keys_move_by_step_ten_steps_and_to_the_ends() -> None:
    app = SliderApp(unit_slider(0.5))
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        slider.focus()
        expected = [
            ("right", 0.55), ("left", 0.5), ("plus", 0.55), ("minus", 0.5),
            ("shift+right", 1.0), ("shift+left", 0.5), ("pagedown", 0.0), ("pageup", 0.5),
            ("end", 1.0), ("home", 0.0),
        ]  # fmt: skip
        for key, value in expected:
            await pilot.press(key)
            assert slider.value == value, key
        assert app.changes == [("s", value) for _, value in expected]


async def test_no_changed_message_when_value_stays_the_same() -> None:
    app = SliderApp(unit_slider())
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        slider.focus()
        await pilot.press("left", "home", "pagedown", "shift+left")
        slider.value = 0.01  # snaps back to 0.0
        await pilot.pause()
        assert slider.value == 0.0
        assert app.changes == []


async def test_integer_mode_gives_ints() -> None:
    # Float arguments, as a config file would give them.
    app = SliderApp(Slider(40.0, 0.0, 100.0, 1.0, integer=True, id="k"))
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        assert slider.value == 40 and type(slider.value) is int
        slider.focus()
        await pilot.press("right", "shift+right")
        slider.value = 41.6
        await pilot.pause()
        assert app.changes == [("k", 41), ("k", 51), ("k", 42)]
        assert all(type(value) is int for _, value in app.changes)


async def test_click_sets_proportional_value_and_focuses() -> None:
    app = SliderApp(unit_slider(), Slider(0, 0, 100, 1, integer=True, id="k"))
    async with app.run_test() as pilot:
        slider = app.query_one("#s", Slider)
        for x, value in [(14, 0.7), (0, 0.0), (WIDTH - 1, 1.0), (10, 0.5)]:
            assert await pilot.click(slider, offset=(x, 0))
            assert slider.value == value, x
        assert slider.has_focus
        assert app.mouse_captured is None  # released on mouse up
        # 100 steps over the same 20 cells: each cell is 5 units.
        percent = app.query_one("#k", Slider)
        await pilot.click(percent, offset=(14, 0))
        assert percent.value == 70 and percent.has_focus


async def test_drag_updates_continuously_and_keeps_the_mouse_until_release() -> None:
    app = SliderApp(unit_slider(), Slider(0.0, 0.0, 1.0, 0.05, id="other"))
    async with app.run_test(size=(40, 5)) as pilot:
        slider = app.query_one("#s", Slider)
        await pilot.mouse_down(slider, offset=(4, 0))
        assert app.mouse_captured is slider and slider.value == 0.2
        await pilot.hover(slider, offset=(10, 0))
        assert slider.value == 0.5
        # Past the right end, over the bare screen: still ours thanks to the capture, clamped.
        await pilot.hover(None, offset=(35, 0))
        assert slider.value == 1.0
        # Down over the other slider: the captured one follows x, the other stays put.
        await pilot.hover(None, offset=(6, 1))
        assert slider.value == 0.3 and app.query_one("#other", Slider).value == 0.0
        await pilot.mouse_up(None, offset=(6, 1))
        assert app.mouse_captured is None
        await pilot.hover(slider, offset=(18, 0))  # moving without a button does nothing
        assert slider.value == 0.3
        assert app.changes == [("s", 0.2), ("s", 0.5), ("s", 1.0), ("s", 0.3)]


async def test_on_selector_matches_by_id() -> None:
    class TwoSliders(SliderApp):
        temperatures: list[float]

        @on(Slider.Changed, "#temperature")
        def temperature_changed(self, event: Slider.Changed) -> None:
            self.temperatures.append(event.value)

    app = TwoSliders(Slider(0.8, 0.0, 2.0, 0.05, id="temperature"), Slider(0.9, 0.0, 1.0, 0.05, id="top_p"))
    app.temperatures = []
    async with app.run_test() as pilot:
        app.query_one("#top_p", Slider).value = 0.5
        app.query_one("#temperature", Slider).value = 1.0
        await pilot.pause()
        assert app.temperatures == [1.0]
        assert app.changes == [("top_p", 0.5), ("temperature", 1.0)]


async def test_render_puts_knob_where_the_value_is() -> None:
    app = SliderApp(unit_slider(0.7))
    async with app.run_test() as pilot:
        slider = app.query_one(Slider)
        assert slider.render_line(0).text == "━" * 14 + "●" + "─" * 6
        slider.value = 0.0
        await pilot.pause()
        assert slider.render_line(0).text == "●" + "─" * 20
        slider.value = 1.0
        await pilot.pause()
        assert slider.render_line(0).text == "━" * 20 + "●"


class EntryApp(SliderApp):
    def __init__(self, *sliders: Slider) -> None:
        super().__init__(*sliders)
        self.entered: list[str] = []

    def on_slider_entered(self, event: Slider.Entered) -> None:
        self.entered.append(event.text)


async def test_typing_a_number_posts_it_on_enter_or_when_focus_leaves() -> None:
    app = EntryApp(unit_slider(0.5), Slider(0, 0, 10, 1, integer=True, id="k"))
    async with app.run_test() as pilot:
        slider = app.query_one("#s", Slider)
        slider.focus()
        await pilot.press("0", ".", "7", "backspace", "3")
        assert slider.typed == "0.3" and slider.render_line(0).text.startswith("› 0.3▏ Enter sets")
        await pilot.press("enter")
        await pilot.press("2", "minus", "escape")  # `-` flips the sign; Esc drops the entry
        await pilot.press("5", "minus", "minus", "tab")  # leaving the slider sets what was typed
        await pilot.press("right")  # keys go on to the bindings when no entry is open
        await pilot.pause()
        assert app.entered == ["0.3", "5"] and slider.typed is None
        assert slider.value == 0.5, "the owner decides what a typed number does"
        assert app.query_one("#k", Slider).value == 1
