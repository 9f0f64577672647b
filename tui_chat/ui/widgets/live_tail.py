"""The end of a reply while it is written: its last few thousand characters, drawn as the finished reply
will be (one Rich Markdown), so nothing changes look when the reply ends.

Cheap to update, because a reply is updated many times a second while the engine shares the CPU with
the UI: the Markdown is rendered once per update, at the widget's width, into lines that are then only
copied to the screen; and the screen is laid out again only when the widget's height changes, which
grows GROW_LINES lines at a time (the last few rows blank until the text reaches them). Text added
within that height repaints this widget alone: a layout of the whole screen costs ~15 ms on 2 cores, and
every millisecond the UI holds a core stalls all of llama.cpp's threads. Only the last block (after the
last blank line outside a code fence) is rendered again as text comes, and without syntax colours
(`render_last`: a code block is highlighted once it is complete); each block before it is rendered once,
and keeps its lines until the width or the colours change, also when it is frozen out of the tail.

A model may write one paragraph for thousands of characters (no blank line, so nothing to freeze): wrapping
it whole at every frame was the worst stall of a 4,000 tok/s stream (Rich's `cell_len` and word split, 250 ms).
Lines wrap greedily, so text added to a paragraph moves only its last line: the lines above it are settled
(`Settled`) and only the text after them is wrapped again, for a paragraph whose drawn words are its own (no
inline Markdown, one line of source); the settled lines are the ones a whole render would draw.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import RenderableType
from rich.style import Style as RichStyle
from rich.syntax import Syntax
from textual.app import App
from textual.geometry import Region, Size
from textual.selection import Selection
from textual.strip import Strip
from textual.widget import Widget

GROW_LINES = 4
MAX_GROW_LINES = 16
FAST_GROWTH_S = 0.25
LONG_PARAGRAPH = 1200  # characters of a paragraph wrapped at every frame before its first lines are settled
REWRAP_OFF_FRAME = 8000  # characters of frozen Markdown drawn again at a new width on a thread, not in a frame
REWRAP_AT_ONCE_WITHIN = 4  # columns: a scrollbar come or gone is drawn at once (a test or a snapshot sees it settled)
_MARKUP = re.compile(r"[\n*_`\[\]<>\\&~|!#]|^\s*(?:[-+>=]|\d+[.)])")  # inline Markdown, or a line that opens a block
_FENCE = "```"
_CODE = re.compile(r"```|~~~|^(?: {4}|\t)", re.MULTILINE)  # a fence, or an indented code block's line
_OPENING = re.compile(r"\s*```\s*([\w+#.-]+)")
_warmed: set[str] = set()  # the code languages whose lexer was compiled off the UI thread (once a process)
# The language a chat's code is most often in, compiled as the app starts: a fast model can finish its first
# block before a lexer compiled from the block's opening fence is ready.
COMMON_CODE = "python"


def warm_lexer(block: str) -> threading.Thread | None:
    """Compile the lexer of a code block being written on a thread of its own: Pygments compiles a lexer's
    regexes at its first use, 20-40 ms on the UI thread when the finished block is first highlighted."""
    found = _OPENING.match(block)
    if found is None or (language := found.group(1).lower()) in _warmed:
        return None
    _warmed.add(language)
    thread = threading.Thread(target=_compile_lexer, args=(language,), name="lexer-warm", daemon=True)
    thread.start()
    return thread


def _compile_lexer(language: str) -> None:
    Syntax("", language).highlight("x")  # a language Pygments does not know is plain text: nothing to compile


def blocks(text: str) -> list[str]:
    """The text's top-level blocks, split at blank lines outside code fences; the last one may be unfinished."""
    parts: list[tuple[str, int]] = []
    for piece in text.split("\n\n"):
        if not parts or parts[-1][1] % 2 == 0:
            parts.append((piece, piece.count(_FENCE)))
        else:  # inside a fence: the blank line belongs to the code
            part, fences = parts[-1]
            parts[-1] = (part + "\n\n" + piece, fences + piece.count(_FENCE))
    return [part for part, _ in parts]


def freeze_point(text: str) -> int | None:
    """Where the text can be cut between two top-level blocks: a blank line outside a code fence."""
    cut = text.rfind("\n\n")
    while cut > 0:
        if text.count(_FENCE, 0, cut) % 2 == 0:
            return cut
        cut = text.rfind("\n\n", 0, cut)
    return None


def stepped(lines: int, step: int = GROW_LINES) -> int:
    """The height that holds `lines`, in steps of `step` lines."""
    return -(-lines // step) * step


@dataclass(frozen=True, slots=True)
class Settled:
    """The first lines of the paragraph being written, drawn at `width`: the source `text` they hold (up to the
    next word), which starts every later version of the paragraph."""

    text: str
    lines: list[Strip]
    width: int


def settle(text: str, drawn: list[Strip], keep: int = 2) -> int:
    """How much of `text` (a plain paragraph, drawn as `drawn`) the lines before its last `keep` hold: where the
    next line's first word starts. 0 where the drawn words are not the source's (a wrapped word, markup)."""
    lines = drawn[:-keep]
    words = [word for line in lines for word in line.text.split()]
    if not words:
        return 0
    found = list(itertools.islice(re.finditer(r"\S+", text), len(words) + 1))
    if len(found) <= len(words) or [match[0] for match in found[:-1]] != words:
        return 0
    return found[-1].start()


class MarkdownBlocks(Widget):
    """Markdown drawn a top-level block at a time, each block's lines kept until the width changes: the part of
    a reply frozen out of its live tail takes the lines the tail already drew, so freezing renders nothing
    again (a render of a few thousand characters with syntax colours, twice: for the height, then the lines,
    was most of a layout's cost while a reply streamed). The lines are kept without the widget's own colours,
    which are put on as a line is drawn: a new theme, or the reply's focus, draws nothing again. Blocks drawn
    apart look as the whole Markdown does: one blank line between them.

    A new width (F2 hides the side panel) draws every block again: for a long reply (REWRAP_OFF_FRAME) that is
    done on a thread while the lines drawn at the old width stay, cut or padded to the new one, and swapped in
    when ready (a 20,000-token reply took 250-550 ms of the UI's loop there, keys and tokens waiting). The last two
    widths' lines are kept, so F2 back costs nothing."""

    DEFAULT_CSS = "MarkdownBlocks { height: auto; }"
    rewraps = True  # a new width's lines drawn on a thread where the text is long (the tail's changes every frame)

    def __init__(self, render: Callable[[str], RenderableType], text: str = "", **kwargs: Any) -> None:
        """`render(text)` gives the renderable of a block (the reply's Markdown)."""
        super().__init__(**kwargs)
        self.text = text
        self._render_text = render
        self._lines: list[Strip] = []
        self._width = 0  # the width `_lines` were put together at; 0: to do again
        self._finished: dict[str, list[Strip]] = {}  # each finished block's lines, drawn at `_drawn`
        self._drawn = 0  # the width the blocks were drawn at
        self._before: tuple[int, dict[str, list[Strip]]] = (0, {})  # the blocks' lines at the width before
        self._rewrapping = 0  # the width a thread is drawing the blocks at (0: none)
        self._meanwhile: dict[str, list[Strip]] = {}  # blocks frozen in at that width while it draws
        self._style = RichStyle()  # the widget's colours, as `render_lines` last found them

    def extend(self, text: str, tail: MarkdownBlocks) -> None:
        """`text`, finished blocks frozen out of the live `tail`, after this widget's own, with the lines the tail
        drew of them. One widget takes every part of a reply: a widget mounted per part was a mount, and one
        more child to arrange, each time."""
        self.text = f"{self.text}\n\n{text}" if self.text else text
        if self._drawn in (0, tail._drawn):
            self._finished, self._drawn = {**self._finished, **tail._finished}, tail._drawn
        if self._rewrapping:  # the rest is being drawn at the new width: these join the old lines meanwhile
            width = tail._drawn or self.size.width
            drawn = {block: tail._finished.get(block) or self._draw(self._render_text, block, width)
                     for block in blocks(text)}
            self._lines = [*self._lines, *(line for lines in drawn.values() for line in [Strip.blank(width), *lines])]
            if width == self._rewrapping:  # the thread's lines will lack them: kept to join its
                self._meanwhile = {**self._meanwhile, **drawn}
        else:
            self._width = 0
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._follow(width)
        return len(self._lines)

    def render_lines(self, crop: Region) -> list[Strip]:
        """The widget's colours found once for the lines drawn now: `rich_style` walks every ancestor's colours,
        and asked once a line it took half the UI's time while a reply streamed at 5,000 tok/s."""
        self._style = self.rich_style
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        self._follow(width)
        line = self._lines[y] if y < len(self._lines) else Strip.blank(width)
        if line.cell_length != width:  # drawn at the width before, until the new width's lines are in
            line = line.crop_extend(0, width, None)
        return line.apply_style(self._style)

    def _follow(self, width: int) -> None:
        """The lines at `width`: at once where that is cheap (the first ones, a scrollbar's change, under
        REWRAP_OFF_FRAME characters of blocks not drawn at that width yet: the width before keeps its own), else on a
        thread (`_rewrap`), the old lines standing in."""
        if width == self._width or width <= 0:
            return
        before_width, before = self._before
        if width == before_width and self._drawn != width:  # back to the width before (F2 twice): its blocks
            self._before, self._finished, self._drawn = (self._drawn, self._finished), before, width
        cache = self._finished if self._drawn == width else {}
        if (not (self.rewraps and self._lines) or abs(width - self._width) <= REWRAP_AT_ONCE_WITHIN
                or sum(len(block) for block in blocks(self.text) if block not in cache) < REWRAP_OFF_FRAME):
            self._lines, self._width = self._rendered(width), width
        elif width != self._rewrapping:
            self._rewrapping, self._meanwhile = width, {}
            threading.Thread(target=self._rewrap, args=(self.app, self.text, width, dict(cache)), name="rewrap",
                             daemon=True).start()

    def _rewrap(self, app: App[object], text: str, width: int, cache: dict[str, list[Strip]]) -> None:
        """On a thread of its own: the blocks of `text` not in `cache` drawn at `width`, handed to the UI's thread."""
        finished = {block: cache.get(block) or self._draw(self._render_text, block, width) for block in blocks(text)}
        with contextlib.suppress(RuntimeError):  # the app is closing
            app.call_from_thread(self._rewrapped, width, finished)

    def _rewrapped(self, width: int, finished: dict[str, list[Strip]]) -> None:
        """The blocks drawn at `width` are in, with those frozen in meanwhile: shown while the width is still
        theirs, else kept as the width before's."""
        if width != self._rewrapping:
            return
        self._rewrapping = 0
        finished, self._meanwhile = {**finished, **self._meanwhile}, {}
        if width != self.size.width:
            self._before = (width, finished)
            self.refresh(layout=True)
            return
        self._before = (self._drawn, self._finished)
        self._finished, self._drawn = finished, width
        self._lines, self._width = self._rendered(width), width
        self.refresh(layout=True)

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """A selection takes the lines as drawn."""
        return selection.extract("\n".join(line.text.rstrip() for line in self._lines)), "\n"

    def _rendered(self, width: int) -> list[Strip]:
        return self._blocks(blocks(self.text), width)[:-1]  # no blank line after the last block

    def _blocks(self, finished: list[str], width: int) -> list[Strip]:
        """The finished blocks' lines, a blank line after each; only these blocks' lines are kept."""
        if self._drawn != width:
            self._before = (self._drawn, self._finished)
        cache, self._finished, self._drawn = self._finished if self._drawn == width else {}, {}, width
        lines: list[Strip] = []
        for block in finished:
            rendered = cache.get(block)
            if rendered is None:
                rendered = self._draw(self._render_text, block, width)
            self._finished[block] = rendered
            lines += [*rendered, Strip.blank(width)] if rendered else []
        return lines

    def _draw(self, render: Callable[[str], RenderableType], text: str, width: int) -> list[Strip]:
        """Not `_render`: Textual's own, which reads a selected widget's text, would be shadowed."""
        if width <= 0 or not text.strip():
            return []
        renderable: RenderableType = render(text)
        console = self.app.console
        options = console.options.update(width=width, height=None, highlight=False)
        lines = [Strip(line, width) for line in console.render_lines(renderable, options, pad=True)]
        # Rich opens a list with a blank line: one goes between blocks. A code block's first row, its padding in
        # the code's background, stays
        while lines and not lines[0].text.strip() and not any(part.style and part.style.bgcolor for part in lines[0]):
            lines.pop(0)
        return lines


class LiveTail(MarkdownBlocks):
    DEFAULT_CSS = "LiveTail { height: auto; }"
    rewraps = False

    def __init__(self, render: Callable[[str], RenderableType], render_last: Callable[[str], RenderableType],
                 **kwargs: Any) -> None:
        """`render(text)` gives the renderable for finished blocks of the tail's text (the reply's Markdown),
        `render_last(text)` for the block being written."""
        super().__init__(render, **kwargs)
        self._render_last = render_last
        self._settled: Settled | None = None  # the first lines of a long paragraph being written
        self._last: tuple[str, list[Strip]] = ("", [])  # the block being written and its lines, as last drawn
        self._step = GROW_LINES  # rows the tail grows by: more while it grows fast (`_grown`)
        self._grown_at = 0.0

    def set_text(self, text: str) -> None:
        """Show `text`; lay the screen out again only if the widget's height changes."""
        height = stepped(len(self._lines), self._step)
        self.text = text
        if self._width:
            self._lines = self._rendered(self._width)
            grows = stepped(len(self._lines), self._step) > height
            if grows:
                self._grown()
            self.refresh(layout=stepped(len(self._lines), self._step) != height)
        else:
            self.refresh(layout=True)

    def _grown(self) -> None:
        """A tail that grew again within FAST_GROWTH_S grows by twice as many rows next time (up to MAX_GROW_LINES):
        at thousands of tokens a second each batch brings a dozen lines, and a layout of the screen for each was
        most of the UI's time (the rows it keeps blank fill within a batch or two); a slow one goes back to
        GROW_LINES."""
        now = time.monotonic()
        fast = now - self._grown_at < FAST_GROWTH_S
        self._step = min(self._step * 2, MAX_GROW_LINES) if fast else GROW_LINES
        self._grown_at = now

    async def freeze_whole(self, text: str, **kwargs: Any) -> MarkdownBlocks | None:
        """`freeze` of all of `text`, the reply as it finished, where the lines the tail drew are those of its
        finished Markdown: the same text, drawn, with a last block without code (drawn plain while written, in
        colour once finished). Nothing is drawn again; None where that cannot be, and nothing moves."""
        last, lines = self._last  # drawn by the `_rendered` of the current text wherever `_width` is set
        if text != self.text or not self._width or _CODE.search(last):
            return None
        self._finished[last] = lines
        return await self.freeze(text, **kwargs)

    async def freeze(self, text: str, **kwargs: Any) -> MarkdownBlocks:
        """Move `text`, the first finished blocks of the tail's text, with the lines drawn of them, into the
        frozen part just before the tail (mounted with `kwargs` the first time); that part."""
        parent = self.parent
        assert isinstance(parent, Widget), "a tail is frozen where it is mounted"
        index = parent.children.index(self)
        part = parent.children[index - 1] if index else None
        if type(part) is not MarkdownBlocks:
            part = MarkdownBlocks(self._render_text, **kwargs)
            await parent.mount(part, before=self)
        part.extend(text, self)
        return part

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return stepped(super().get_content_height(container, viewport, width), self._step)

    def _rendered(self, width: int) -> list[Strip]:
        *finished, last = blocks(self.text)
        warm_lexer(last)
        lines = self._last_block(last, width)
        self._last = (last, lines)
        return self._blocks(finished, width) + lines

    def _last_block(self, text: str, width: int) -> list[Strip]:
        """The block being written: a long plain paragraph's settled lines as they were, the rest wrapped again."""
        settled = self._settled
        if settled is None or settled.width != width or not text.startswith(settled.text):
            settled = self._settled = None
        head, lines = (settled.text, settled.lines) if settled else ("", [])
        rest = text[len(head):]
        drawn = self._draw(self._render_last, rest, width)
        if len(rest) > LONG_PARAGRAPH and not _MARKUP.search(text):
            cut = settle(rest, drawn)
            if cut:
                self._settled = Settled(head + rest[:cut], lines + drawn[:-2], width)
        return lines + drawn
