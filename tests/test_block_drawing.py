"""A heatmap and a thought drawn in blocks (so a long reply's is drawn ahead while it streams, and a picked
token redraws one block) look exactly as the whole text drawn at once."""

from __future__ import annotations

import random

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from tui_chat.engine.base import Token
from tui_chat.safetext import screen_safe
from tui_chat.ui.widgets import thinking
from tui_chat.ui.widgets.heatmap import SELECTED, HeatBlocks, band_of
from tui_chat.ui.widgets.thinking import Thought, draw_ahead, thought_blocks

STYLES = [Style(), Style(color="black", bgcolor="green"), Style(color="black", bgcolor="yellow"),
          Style(color="white", bgcolor="red"), Style(color="white", bgcolor="dark_red")]
WIDTH = 37


def reply(n: int, seed: int = 1) -> list[Token]:
    """Pieces as a tokenizer cuts them: whitespace and line breaks at a piece's start, at its end, alone,
    inside it; an empty special token; leading whitespace before the first word."""
    rng = random.Random(seed)
    shapes = ["{w}", " {w}", "\n{w}", "\n\n{w}", "{w}\n", "\n", "\n\n", "{w}\n\n{w}", " {w},", "\t{w}", ""]
    pieces = ["  \n", *(rng.choice(shapes).format(w=rng.choice(["the", "cache", "Paris", "x"])) for _ in range(n))]
    return [Token(i, piece, 0.0, 0, piece, rng.random()) for i, piece in enumerate(pieces)]


def heatmap_at_once(tokens: list[Token], text: str, selected: int | None, offset: int) -> Text:
    """The whole heatmap as one Text, as it was drawn before it was drawn in blocks."""
    out, drawn, started = Text(), 0, False
    for index, token in enumerate(tokens, start=offset):
        if drawn + len(token.piece) > len(text):
            break
        drawn += len(token.piece)
        piece = token.piece if started else token.piece.lstrip()
        started = started or bool(piece)
        picked = SELECTED if index == selected else Style()
        style = STYLES[band_of(token.prob)] + Style(meta={"token": index}) + picked
        out.append(screen_safe(piece) or ("·" if index == selected else ""), style)
    return out


def lines_at_once(tokens: list[Token], text: str, selected: int | None, offset: int = 0) -> list[list[Segment]]:
    console = Console(width=WIDTH)
    drawn = heatmap_at_once(tokens[offset:], text, selected, offset)
    return [list(line) for line in Segment.split_and_crop_lines(console.render(drawn, console.options), WIDTH,
                                                              include_new_lines=False, pad=False)]


def as_segments(blocks: HeatBlocks, selected: int | None) -> list[list[Segment]]:
    return [list(strip) for strip in blocks.lines(Console(width=WIDTH), WIDTH, STYLES, selected)]


def test_a_heatmap_built_in_blocks_as_it_streams_is_the_one_built_at_once():
    tokens = reply(1500)
    text = "".join(t.piece for t in tokens)[:-7]  # a stop sequence cut off the end: its tokens are not drawn
    blocks = HeatBlocks(tokens, block_chars=40)
    console = Console(width=WIDTH)
    for end in range(0, len(text), 97):  # the text grows batch by batch, blocks are drawn ahead
        blocks.extend(text[:end])
        blocks.warm(console, WIDTH, STYLES)
    blocks.extend(text)
    assert len(blocks._blocks) > 50
    for selected in (None, 0, 1, 2, 700, 1490, 1500):
        assert as_segments(blocks, selected) == lines_at_once(tokens, text, selected), selected


def test_the_answers_blocks_tag_tokens_with_their_index_in_the_reply():
    tokens = reply(400, seed=2)
    answer_from = 150
    text = "".join(t.piece for t in tokens[answer_from:])
    blocks = HeatBlocks(tokens, answer_from, block_chars=30)
    blocks.extend(text)
    assert as_segments(blocks, 200) == lines_at_once(tokens, text, 200, answer_from)
    thinking = HeatBlocks(tokens, 0, answer_from, block_chars=30)
    thinking.extend(None)  # every token of the thinking, its markers included
    thought = tokens[:answer_from]
    assert as_segments(thinking, 3) == lines_at_once(thought, "".join(t.piece for t in thought), 3)


def test_picking_a_token_draws_only_its_block_again():
    tokens = reply(1000, seed=3)
    blocks = HeatBlocks(tokens, block_chars=40)
    blocks.extend("".join(t.piece for t in tokens))
    console = Console(width=WIDTH)
    blocks.lines(console, WIDTH, STYLES, None)
    before = list(blocks._lines)
    blocks.lines(console, WIDTH, STYLES, 500)
    redrawn = [block for block, (old, new) in enumerate(zip(before, blocks._lines, strict=True)) if old is not new]
    assert len(redrawn) == 1


def test_a_thought_drawn_in_blocks_is_the_whole_text_drawn_at_once_and_its_blocks_are_drawn_ahead():
    tokens = reply(6000, seed=4)
    text = "".join(t.piece for t in tokens).strip() + "\x1b[2J"
    console = Console(width=WIDTH)
    options = console.options.update_width(WIDTH)
    whole = list(Segment.split_and_crop_lines(console.render(Text(text.replace("\x1b", "\\x1b"), style="dim italic"),
                                                             options), WIDTH, include_new_lines=False, pad=False))
    assert len(thought_blocks(text)) > 10
    for end in range(0, len(text), 500):  # as it streams
        draw_ahead(text[:end], console, WIDTH)
    drawn = len(thinking._drawn)
    lines = list(Segment.split_and_crop_lines(console.render(Thought(text), options), WIDTH, include_new_lines=False,
                                              pad=False))
    assert lines == whole
    assert len(thinking._drawn) - drawn <= 2  # the last ones, still growing when last drawn ahead
