"""Work-arounds for Textual (and Rich) bugs, each with its upstream issue: delete one once the version we require
fixes it."""

from __future__ import annotations

import contextlib
import os
import selectors
import sys
import unicodedata
from codecs import getincrementaldecoder
from collections.abc import Callable
from typing import Any

import rich.cells
import textual.widgets
from textual import constants
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver

IDLE_WAIT_S = 0.1  # Textual's own select timeout with no escape pending


def release_styles_caches() -> None:
    """Textual memoises `StylesCache.get_inner_outer` in an lru_cache keyed by the StylesCache itself, so the
    last 1024 calls keep removed widgets' rendered lines alive (Textualize/textual#6665): about 0.1 MB a chat
    turn here until it fills. Clearing it costs one recomputation of two styles per widget."""
    try:
        from textual._styles_cache import StylesCache
    except ImportError:  # the private module moved: the bug went with it, or this needs a new look
        return
    clear = getattr(StylesCache.get_inner_outer, "cache_clear", None)
    if clear is not None:
        clear()


class Footer(textual.widgets.Footer):
    """Textual's footer remounts every key, with their styles, on each bindings change, even when what it shows
    stays the same (not reported upstream yet). Right after the first frame a screen has four or five such
    changes (focus, its mount, its bindings): on 2 cores ~50 ms before the first key typed shows. This one
    recomposes only when the keys it would show changed."""

    _shown: tuple[object, ...] | None = None

    async def recompose(self) -> None:
        if not self.is_attached:  # its screen was dismissed while the recompose waited
            return
        shown = tuple((binding, enabled, tooltip) for _, binding, enabled, tooltip
                      in self.screen.active_bindings.values() if binding.show)
        if shown != self._shown:
            self._shown = shown
            await super().recompose()


def spacing_marks_take_a_cell() -> None:
    """Rich measures a spacing combining mark (Unicode category Mc: Devanagari's ि and ी, Bengali's ি, Tamil's
    ா, …) as 0 cells, with the letter it follows; terminals that measure by wcwidth (tmux 3.3a, measured with
    its cursor; xterm, VTE) give each its own cell, so a reply in such a script drew its rows a cell short per
    mark and pushed the panel's edge (issue 38). Measured as those terminals draw them: one cell each. Rich
    (15) keeps each Unicode version's zero-width ranges in a list, changed here in place as it loads them."""
    load = getattr(rich.cells, "load_cell_table")  # noqa: B009 - not in Rich's exports
    if getattr(load, "spacing_marks", False):
        return
    patched: set[int] = set()

    def load_measuring_marks(unicode_version: str = "auto") -> Any:
        table = load(unicode_version)
        widths: list[tuple[int, int, int]] = table.widths
        if id(widths) not in patched:
            widths[:] = [span for start, end, width in list(widths)
                         for span in (_without_spacing_marks(start, end) if width == 0 else [(start, end, width)])]
            patched.add(id(widths))
        return table

    setattr(load_measuring_marks, "spacing_marks", True)  # noqa: B010
    setattr(rich.cells, "load_cell_table", load_measuring_marks)  # noqa: B010
    rich.cells.get_character_cell_size.cache_clear()
    rich.cells.cached_cell_len.cache_clear()


def _without_spacing_marks(start: int, end: int) -> list[tuple[int, int, int]]:
    """A zero-width range as the zero-width ranges left once its Mc code points are taken out."""
    spans: list[tuple[int, int, int]] = []
    for codepoint in range(start, end + 1):
        if unicodedata.category(chr(codepoint)) == "Mc":
            continue
        if spans and spans[-1][1] == codepoint - 1:
            spans[-1] = (spans[-1][0], codepoint, 0)
        else:
            spans.append((codepoint, codepoint, 0))
    return spans


class TimelyEscapeDriver(LinuxDriver):
    """Textual's input thread (`LinuxDriver.run_input_thread`) asks its parser whether a lone Esc has waited out
    ESCDELAY only when its `select` returns, which with no more input is after 100 ms (not reported upstream
    yet): every Esc, stop a reply or close a dialog, took 100 ms whatever ESCDELAY said. This one waits at most
    ESCDELAY after input that held an Esc; otherwise as Textual does."""

    def run_input_thread(self) -> None:
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        wait = IDLE_WAIT_S
        try:
            while not self.exit_event.is_set():
                wait = self._take_input(parser, decode, selector.select(wait))
            selector.unregister(self.fileno)
            self._take_input(parser, decode, selector.select(IDLE_WAIT_S), final=True)
        finally:
            selector.close()
            with contextlib.suppress(EOFError, ParseError):
                for _ in parser.feed(""):
                    pass

    def _take_input(self, parser: XTermParser, decode: Callable[..., str], ready: list[Any],
                    final: bool = False) -> float:
        """Feed what came to the parser and pass on its events; how long the next select may wait."""
        wait = IDLE_WAIT_S
        for index, _ in enumerate(ready):
            data = decode(os.read(self.fileno, 4096), final=final and index == len(ready) - 1)
            if not data:
                break
            if "\x1b" in data:
                wait = constants.ESCAPE_DELAY
            for event in parser.feed(data):
                self.process_message(event)
        for event in parser.tick():
            self.process_message(event)
        return wait


def terminal_driver() -> type[Driver] | None:
    """The driver an app runs on in a terminal: ours where Textual would take its Linux one (Linux and macOS, no
    TEXTUAL_DRIVER set); None leaves the choice to Textual."""
    return None if constants.DRIVER is not None or sys.platform == "win32" else TimelyEscapeDriver
