"""The confidence heatmap: each token of a reply coloured by the probability the model gave it.

Colours come from the theme in force (success, warning, error blended into the background), and
the text on them is black or white, whichever has the higher WCAG contrast: at least 4.5:1 on any
fill, so every theme stays legible. Under an output format, a token its grammar forced (left one
choice) is drawn in italics, and the picked token's line says how much probability the grammar removed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual.color import Color

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


def heatmap_text(tokens: Sequence[Token], text: str, styles: Sequence[Style], selected: int | None,
                 offset: int = 0) -> Text:
    """The reply (or its part: its thinking, its answer) as its tokens, each styled by its band and tagged
    with its index in the reply (`offset` that of the first) for mouse clicks.

    Only tokens inside the visible text are drawn: the tokens of a cut stop sequence are not.
    Leading whitespace is dropped, as the plain rendering does.
    """
    out = Text(no_wrap=False)
    drawn = 0
    started = False
    for index, token in enumerate(tokens, start=offset):
        if drawn + len(token.piece) > len(text):
            break
        drawn += len(token.piece)
        piece = token.piece
        if not started:
            piece = piece.lstrip()
            started = bool(piece)
        style = styles[band_of(token.prob)] + Style(meta={"token": index})
        if token.forced:
            style += CHOSEN_BY_USER
        if token.grammar is not None and token.grammar.forced:
            style += FORCED_BY_FORMAT
        if index == selected:
            style += SELECTED
        out.append(screen_safe(piece) or ("·" if index == selected else ""), style)
    return out


def grammar_line(tokens: Sequence[Token], index: int) -> Text | None:
    """What the output format's grammar did at the picked token; None without a format."""
    mask = tokens[index].grammar if 0 <= index < len(tokens) else None
    if mask is None:
        return None
    return Text(f"token {index + 1}: the format's {grammar_summary(mask)}" + (" (italics)" if mask.forced else ""),
                style="dim")


REOPENED_NOTE = "Replies reopened from the history stay plain: it keeps their text, not their token probabilities."


def legend(styles: Sequence[Style], reopened: bool = False) -> Text:
    """The bands' colours; `reopened`: the chat has replies with no token records, which it says are plain."""
    out = Text("Heatmap  ", style="dim")
    for band, style in zip(BANDS, styles):
        out.append(f" {band.label} ", style)
        out.append(" ")
    out.append("←/→ Enter", style="dim")
    if reopened:
        out.append(f"\n{REOPENED_NOTE}", style="dim italic")
    return out
