"""The confidence heatmap: each token of a reply coloured by the probability the model gave it.

Colours come from the theme in force (success, warning, error blended into the background), and
the text on them is black or white, whichever has the higher WCAG contrast: at least 4.5:1 on any
fill, so every theme stays legible. Under an output format, a token its grammar forced (left one
choice) is drawn in italics, and the picked token's line says how much probability the grammar removed.
With speculative decoding, a token the draft guessed and the model kept is underlined.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.color import Color
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from ...engine.base import Token
from ...safetext import screen_safe
from .xray import grammar_summary


@dataclass(frozen=True, slots=True)
class Band:
    floor: float
    color: str | None  # a theme variable; None leaves likely tokens plain, so the doubtful stand out
    strength: float
    label: str


BANDS = (
    Band(0.9, None, 0.0, "≥90%"),
    Band(0.6, "success", 0.45, "60–90%"),
    Band(0.3, "warning", 0.5, "30–60%"),
    Band(0.1, "error", 0.5, "10–30%"),
    Band(0.0, "error", 0.9, "<10%"),
)
SELECTED = Style(reverse=True, underline=True)
BLACK, WHITE = Color(0, 0, 0), Color(255, 255, 255)
CHOSEN_BY_USER = Style(bold=True, underline=True)
FORCED_BY_FORMAT = Style(italic=True)
DRAFTED = Style(underline=True)  # speculative decoding guessed it, and the model's own draw kept it
BLOCK_CHARS = 1000  # a heatmap block's size: drawn in a few ms
WARM_S = 0.004  # drawing ahead per batch while a reply streams: a block or two


def band_of(prob: float) -> int:
    return next(i for i, band in enumerate(BANDS) if prob >= band.floor)


def band_colors(variables: Mapping[str, str]) -> list[tuple[Color, Color] | None]:
    """(text, background) per band for a theme's CSS variables; None where the band stays plain."""
    background = Color.parse(variables["background"])
    colors: list[tuple[Color, Color] | None] = []
    for band in BANDS:
        if band.color is None:
            colors.append(None)
            continue
        fill = background.blend(Color.parse(variables[band.color]), band.strength)
        colors.append((readable_text(fill), fill))
    return colors


def readable_text(fill: Color) -> Color:
    """Black or white, whichever stands out more from `fill` by WCAG relative luminance."""
    channels = [c / 255 for c in fill.rgb]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return BLACK if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else WHITE


def band_styles(variables: Mapping[str, str]) -> list[Style]:
    return [
        Style() if pair is None else Style(color=pair[0].rich_color, bgcolor=pair[1].rich_color)
        for pair in band_colors(variables)
    ]


def has_probabilities(tokens: Sequence[Token]) -> bool:
    return bool(tokens) and all(token.prob is not None for token in tokens)


class HeatBlocks:
    """A reply's heatmap (or its thinking's) cut into blocks of whole lines, each drawn once per width and
    token picked in it: a long reply's heatmap is drawn ahead while it streams (`warm`), and picking a
    token draws one or two blocks again, not the whole reply (25,000 tokens took ~170 ms in one frame).

    Only tokens inside the visible text are drawn: the tokens of a cut stop sequence are not.
    Leading whitespace is dropped, as the plain rendering does. A block ends at a line break once it
    holds `block_chars` characters; the break itself is left out, so the blocks' lines, one after the
    other, are the lines of the whole text drawn at once.
    """

    def __init__(self, tokens: Sequence[Token], start: int = 0, stop: int | None = None,
                 block_chars: int = BLOCK_CHARS) -> None:
        """Of `tokens[start:stop]`, each tagged with its index in `tokens`."""
        self.tokens, self.start, self.stop = tokens, start, stop
        self.block_chars = block_chars
        self._blocks: list[list[tuple[int, str]]] = [[]]  # (index, text drawn) per token; the last block is open
        self._size = 0  # characters in the open block
        self._next = start  # the next token to take
        self._taken = 0  # characters of the text its tokens cover
        self._started = False  # past the leading whitespace
        self._styles: Sequence[Style] = ()
        self._lines: list[tuple[tuple[int, int | None], list[Strip]] | None] = [None]  # per block: (key, its lines)

    @classmethod
    def kept(cls, blocks: HeatBlocks | None, tokens: Sequence[Token], start: int, text: str | None,
             stop: int | None = None) -> HeatBlocks:
        """`blocks` if they are those of `tokens[start:stop]` (else new ones), extended to `text`."""
        if blocks is None or blocks.tokens is not tokens or (blocks.start, blocks.stop) != (start, stop):
            blocks = cls(tokens, start, stop)
        blocks.extend(text)
        return blocks

    def extend(self, text: str | None) -> None:
        """Take the tokens that lie inside `text` (the part's text so far; None: every token)."""
        stop = len(self.tokens) if self.stop is None else self.stop
        while self._next < stop:
            piece = self.tokens[self._next].piece
            if text is not None and self._taken + len(piece) > len(text):
                break
            self._taken += len(piece)
            if not self._started:
                piece = piece.lstrip()
                self._started = bool(piece)
            self._add(self._next, screen_safe(piece))
            self._next += 1

    def _add(self, index: int, piece: str) -> None:
        if self._size >= self.block_chars and piece.startswith("\n"):
            self._close()
            piece = piece[1:]
            if not piece:
                return
        self._blocks[-1].append((index, piece))
        self._lines[-1] = None
        self._size += len(piece)
        if self._size >= self.block_chars and piece.endswith("\n"):
            if piece[:-1]:
                self._blocks[-1][-1] = (index, piece[:-1])
            else:
                self._blocks[-1].pop()
            self._close()

    def _close(self) -> None:
        self._blocks.append([])
        self._lines.append(None)
        self._size = 0

    def text(self, block: int, styles: Sequence[Style], selected: int | None) -> Text:
        out = Text(no_wrap=False)
        for index, piece in self._blocks[block]:
            token = self.tokens[index]
            assert token.prob is not None, "a heatmap is drawn for tokens with probabilities (has_probabilities)"
            style = styles[band_of(token.prob)] + Style(meta={"token": index})
            if token.forced:
                style += CHOSEN_BY_USER
            if token.grammar is not None and token.grammar.forced:
                style += FORCED_BY_FORMAT
            if token.drafted:
                style += DRAFTED
            if index == selected:
                style += SELECTED
            out.append(piece or ("·" if index == selected else ""), style)
        return out

    def lines(self, console: Console, width: int, styles: Sequence[Style], selected: int | None) -> list[Strip]:
        """The lines of all the blocks at `width`, without a base style."""
        self._restyle(styles)
        out: list[Strip] = []
        for block, pieces in enumerate(self._blocks):
            picked = selected if selected is not None and pieces and pieces[0][0] <= selected <= pieces[-1][0] else None
            out += self._block_lines(console, width, styles, block, picked)
        return out

    def warm(self, console: Console, width: int, styles: Sequence[Style], every: bool = False) -> bool:
        """Draw blocks not drawn yet (none picked) for about WARM_S, at least one: a batch's bounded share of
        the work, which keeps ahead of the reply unless the UI is starved. The finished blocks, or `every`
        one (the text is final). False once none is left."""
        if width <= 0:  # not laid out yet
            return False
        self._restyle(styles)
        deadline = time.perf_counter() + WARM_S
        for block, cached in enumerate(self._lines if every else self._lines[:-1]):
            if cached is None or cached[0] != (width, None):
                self._block_lines(console, width, styles, block, None)
                if time.perf_counter() > deadline:
                    return True
        return False

    async def catch_up(self, console: Console, width: int, styles: Sequence[Style]) -> None:
        """Draw every block (the text is final) WARM_S at a time, the event loop running in between: what a
        UI starved while the reply streamed did not draw ahead does not stall its finish."""
        while self.warm(console, width, styles, every=True):
            await asyncio.sleep(0)

    def _restyle(self, styles: Sequence[Style]) -> None:
        if list(styles) != list(self._styles):
            self._styles, self._lines = list(styles), [None] * len(self._blocks)

    def _block_lines(self, console: Console, width: int, styles: Sequence[Style], block: int,
                     picked: int | None) -> list[Strip]:
        cached = self._lines[block]
        if cached is None or cached[0] != (width, picked):
            options = console.options.update(width=width, height=None, highlight=False)
            rendered = console.render(self.text(block, styles, picked), options)
            lines = Segment.split_and_crop_lines(rendered, width, include_new_lines=False, pad=False)
            cached = self._lines[block] = (width, picked), [Strip(line) for line in lines]
        return cached[1]


class HeatLines:
    """Blocks' lines as a Rich renderable, inside another view (the thinking's)."""

    def __init__(self, heat: HeatBlocks, styles: Sequence[Style], selected: int | None) -> None:
        self.heat, self.styles, self.selected = heat, styles, selected

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.heat.lines(console, options.max_width, self.styles, self.selected):
            yield from line
            yield Segment.line()


class HeatmapView(Widget):
    """A finished reply's heatmap and the lines under it (the picked token's grammar, the footer): the blocks'
    lines, drawn once (HeatBlocks), on the reply's background as it changes (focus)."""

    DEFAULT_CSS = "HeatmapView { height: auto; }"

    def __init__(self, heat: HeatBlocks, styles: Sequence[Style], selected: int | None, after: RenderableType,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._heat, self._bands, self._selected, self._after = heat, styles, selected, after
        self._lines: list[Strip] = []
        self._width = 0

    def _rendered(self, width: int) -> list[Strip]:
        if width != self._width:
            console = self.app.console
            after = console.render(self._after, console.options.update(width=width, height=None, highlight=False))
            self._lines = self._heat.lines(console, width, self._bands, self._selected) + [
                Strip(line) for line in Segment.split_and_crop_lines(after, width, include_new_lines=False, pad=False)]
            self._width = width
        return self._lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._rendered(width))

    def render_line(self, y: int) -> Strip:
        lines = self._rendered(self.size.width)
        if y >= len(lines):
            return Strip.blank(self.size.width, self.rich_style)
        return lines[y].apply_style(self.visual_style.rich_style)


def grammar_line(tokens: Sequence[Token], index: int) -> Text | None:
    """What the output format's grammar did at the picked token; None without a format."""
    mask = tokens[index].grammar if 0 <= index < len(tokens) else None
    if mask is None:
        return None
    return Text(f"token {index + 1}: the format's {grammar_summary(mask)}" + (" (italics)" if mask.forced else ""),
                style="dim")


REOPENED_NOTE = "Replies reopened from the history stay plain: it keeps their text, not their token probabilities."


def legend(styles: Sequence[Style], reopened: bool = False, drafting: bool = False) -> Text:
    """The bands' colours; `reopened`: the chat has replies with no token records, which it says are plain;
    `drafting`: speculative decoding is on, so some tokens are underlined, which it says why."""
    out = Text("Heatmap  ", style="dim")
    for band, style in zip(BANDS, styles, strict=True):
        out.append(f" {band.label} ", style)
        out.append(" ")
    if drafting:
        out.append("underlined", DRAFTED)
        out.append(": drafted, kept  ", style="dim")
    out.append("←/→ Enter", style="dim")
    if reopened:
        out.append(f"\n{REOPENED_NOTE}", style="dim italic")
    return out
