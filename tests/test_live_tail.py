"""The live tail of a reply: drawn as the finished reply will be, and the screen laid out again only when
its height changes, a few lines at a time (a layout of the whole screen per batch kept a core busy while
the engine decoded)."""

from __future__ import annotations

from textual.app import App
from textual.geometry import Region

from tui_chat.ui.widgets.live_tail import GROW_LINES, LiveTail, MarkdownBlocks, warm_lexer
from tui_chat.ui.widgets.markdown import rendered_markdown


class Spied(LiveTail):
    def __init__(self) -> None:
        super().__init__(rendered_markdown, rendered_markdown)
        self.layouts: list[bool] = []

    def refresh(self, *regions, repaint=True, layout=False, recompose=False):
        self.layouts.append(layout)
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)


class Holder(App):
    def compose(self):
        yield Spied()


def shown(tail: LiveTail) -> list[str]:
    return [tail.render_line(y).text.rstrip() for y in range(tail.size.height)]


async def test_text_on_the_same_line_repaints_and_a_new_line_lays_out():
    app = Holder()
    async with app.run_test(size=(40, 10)) as pilot:
        tail = app.query_one(Spied)
        tail.set_text("The capital")
        await pilot.pause()
        assert shown(tail)[0] == "The capital" and not "".join(shown(tail)[1:]).strip()
        tail.layouts.clear()
        tail.set_text("The capital of France")
        await pilot.pause()
        assert shown(tail)[0] == "The capital of France"
        assert tail.layouts[0] is False  # the same one line: no layout of the screen
        tail.set_text("The capital of France is Paris, a city on the Seine.")
        await pilot.pause()
        assert tail.layouts[1] is False  # a second line, in the room the first step left
        assert tail.size.height == GROW_LINES and "Seine" in shown(tail)[1]
        tail.set_text("Paris\n\n" * GROW_LINES)
        await pilot.pause()
        assert tail.layouts[2] is True  # past it: the screen is laid out again, one step taller
        assert tail.size.height == 2 * GROW_LINES


async def test_markdown_and_model_text_render_as_the_finished_reply_does():
    app = Holder()
    async with app.run_test(size=(40, 10)) as pilot:
        tail = app.query_one(Spied)
        tail.set_text("**bold** and [a link](https://example.com)\x1b[2J")
        await pilot.pause()
        assert "bold and a link (https://example.com)" in " ".join(shown(tail))  # a link shows its target
        assert "\x1b" not in "".join(shown(tail)) and "\\x1b" in "".join(shown(tail))


def test_the_blocks_of_a_tail_split_at_blank_lines_outside_code():
    from tui_chat.ui.widgets.live_tail import blocks

    text = "# Title\n\nA paragraph.\n\n```python\na = 1\n\nb = 2\n```\n\nThe last one, still wr"
    assert blocks(text) == ["# Title", "A paragraph.", "```python\na = 1\n\nb = 2\n```", "The last one, still wr"]
    assert blocks("```\nopen\n\nfence") == ["```\nopen\n\nfence"]
    assert "\n\n".join(blocks(text)) == text



async def test_a_selection_over_the_tail_copies_without_a_crash():
    """Textual reads a selected widget's text through `Widget._render()`: the tail's own renderer once shadowed
    it, and copying a selection that took in the reply being written raised a TypeError. It copies what shows."""
    from textual.selection import Selection

    app = Holder()
    async with app.run_test(size=(40, 10)) as pilot:
        tail = app.query_one(Spied)
        tail.set_text("The capital of France")
        await pilot.pause()
        app.screen.selections = {tail: Selection(None, None)}
        assert app.screen.get_selected_text() == "The capital of France"


def drawn_text(lines: list[str]) -> list[str]:
    """The lines' text, without the blank lines at the end."""
    text = [line.rstrip() for line in lines]
    while text and not text[-1]:
        text.pop()
    return text


class Counted(App):
    """A tail whose renderer counts the blocks it renders, beside the whole Markdown as one Static."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.rendered = text, 0

    def render_block(self, text: str):
        self.rendered += 1
        return rendered_markdown(text)

    def compose(self):
        from textual.widgets import Static

        yield LiveTail(self.render_block, self.render_block)
        yield Static(rendered_markdown(self.text), id="whole")


async def test_frozen_parts_keep_the_tails_lines_and_look_as_the_whole_markdown():
    """Freezing the tail's finished blocks out of it renders none of them again (twice, for the height and then
    the lines, was most of a layout's cost while a fast reply streamed), nor does a change of colours; every part
    goes into one widget, and blocks drawn apart look as the whole Markdown does: a code block keeps its first
    row, its padding."""
    first = "## Plan\n\nA paragraph that wraps at forty columns, long enough."
    second = "- one\n- two\n\n```python\na = 1\n```"
    app = Counted(f"{first}\n\n{second}")
    async with app.run_test(size=(40, 40)) as pilot:
        tail = app.query_one(LiveTail)
        tail.set_text(f"{first}\n\n{second}\n\nStill being wr")
        await pilot.pause()
        whole = drawn_text([line.text for line in app.query_one("#whole").render_lines(Region(0, 0, 40, 40))])
        assert drawn_text(shown(tail))[: len(whole)] == whole
        drawn = app.rendered
        await tail.freeze(first)
        tail.set_text(f"{second}\n\nStill being wr")
        await pilot.pause()
        await tail.freeze(second)
        tail.set_text("Still being wr")
        await pilot.pause()
        parts = [widget for widget in app.screen.children if type(widget) is MarkdownBlocks]
        assert len(parts) == 1 and app.screen.children.index(parts[0]) == 0
        frozen = parts[0]
        assert drawn_text([frozen.render_line(y).text for y in range(frozen.size.height)]) == whole
        assert app.rendered == drawn + 2  # only the tail's last block, at each of its updates
        frozen.styles.background = "red"  # as a focused reply's: the lines take the colour, nothing is rendered again
        await pilot.pause()
        assert list(frozen.render_line(0))[0].style.bgcolor.triplet == (255, 0, 0) and app.rendered == drawn + 2


def test_a_code_blocks_lexer_is_compiled_off_the_ui_thread_while_the_block_is_written():
    """Pygments compiles a lexer's regexes at its first use: 20-40 ms on the UI thread when the finished block
    was first highlighted (the worst stall of a fresh app at 5,000 tok/s). Once a language, on a thread."""
    from pygments.lexers.haskell import HaskellLexer

    assert "_tokens" not in HaskellLexer.__dict__
    thread = warm_lexer("```haskell\nmain = pure ()")
    assert thread is not None and thread.name == "lexer-warm"
    thread.join(10)
    assert "_tokens" in HaskellLexer.__dict__
    assert warm_lexer("```Haskell\nmain = print 1") is None
    assert warm_lexer("Some prose, no fence") is None
    unknown = warm_lexer("```no-such-language\nx")
    assert unknown is not None
    unknown.join(10)


class Wrapping(LiveTail):
    """Counts the characters each frame wraps."""

    def __init__(self) -> None:
        super().__init__(rendered_markdown, rendered_markdown)
        self.wrapped: list[int] = []

    def _draw(self, render, text, width):
        self.wrapped.append(len(text))
        return super()._draw(render, text, width)


class WrappingHolder(App):
    def compose(self):
        yield Wrapping()


async def test_one_long_paragraph_is_not_wrapped_whole_at_every_frame_and_looks_as_a_whole_render():
    """A reply that is one paragraph of 20,000 characters: each frame wraps at most a few lines more than
    LONG_PARAGRAPH characters, and the lines are those of the whole paragraph drawn at once."""
    import random

    from tui_chat.ui.widgets.live_tail import LONG_PARAGRAPH

    rng = random.Random(5)
    words = "the model cache layer token batch thread queue widget screen render stream parser value".split()
    text = " ".join(rng.choice(words) + ("." if rng.random() < 0.1 else "") for _ in range(3000)).capitalize()
    app = WrappingHolder()
    async with app.run_test(size=(60, 10)) as pilot:
        tail = app.query_one(Wrapping)
        await pilot.pause()
        for end in range(0, len(text), 37):  # about nine tokens a frame
            tail.set_text(text[: end + 37])
        assert max(tail.wrapped) < LONG_PARAGRAPH + 3 * 60 and len(tail.wrapped) > 500
        lines, width = [line.text for line in tail._lines], tail._width
        assert lines == [line.text for line in tail._draw(rendered_markdown, text, width)]


async def test_a_paragraph_with_markdown_in_it_is_still_drawn_whole():
    """Inline Markdown may change how the words above draw (a closing `**`): no line of it is settled."""
    app = WrappingHolder()
    async with app.run_test(size=(60, 10)) as pilot:
        tail = app.query_one(Wrapping)
        await pilot.pause()
        text = "word " * 400 + "**bold** " + "word " * 400
        tail.set_text(text)
        tail.set_text(text + "more")
        assert tail._settled is None and tail.wrapped[-1] == len(text + "more")


def test_a_replys_markdown_draws_as_richs_own_with_one_parser_for_all():
    """ReplyMarkdown sets Rich's attributes itself to share one parser: what it draws must stay Rich's."""
    from rich.console import Console
    from rich.markdown import Markdown

    from tui_chat.ui.widgets.markdown import ReplyMarkdown, WritingMarkdown

    text = ("# Title\n\nSome **bold**, `code`, ~~gone~~ and [a link](https://example.com).\n\n- one\n- two\n\n"
            "| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('hi')\n```\n\n> quoted")
    console = Console(width=60, record=True, color_system="truecolor", force_terminal=True)

    def drawn(markdown) -> list:
        return [[(segment.text, segment.style) for segment in line] for line in console.render_lines(markdown)]

    assert drawn(ReplyMarkdown(text)) == drawn(Markdown(text, code_theme="monokai", hyperlinks=False))
    assert drawn(WritingMarkdown(text))[:8] == drawn(ReplyMarkdown(text))[:8]  # the same until its code block


class Rewrapped(MarkdownBlocks):
    """Notes which thread drew each block."""

    def __init__(self, text: str) -> None:
        import threading

        super().__init__(rendered_markdown, text)
        self.drawn_on: list[str] = []
        self.hold = threading.Event()  # the thread's drawing waits for it

    def _rewrap(self, app, text, width, cache):
        self.hold.wait(10)
        super()._rewrap(app, text, width, cache)

    def _draw(self, render, text, width):
        import threading

        self.drawn_on.append(threading.current_thread().name)
        return super()._draw(render, text, width)


class RewrapHolder(App):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self):
        from textual.containers import VerticalScroll

        with VerticalScroll():
            yield Rewrapped(self.text)


async def test_a_long_reply_is_wrapped_again_at_a_new_width_off_the_ui_thread_and_back_for_nothing():
    """F2 hides the side panel: a 20,000-token reply drawn again at the new width held the UI's loop for 250-550 ms.
    Its lines are drawn on a thread while the old ones stand in (cut to the new width), and swapped in; the old
    width's are kept, so F2 again draws nothing; a block frozen in meanwhile shows at once."""
    import time

    from tui_chat.ui.widgets.live_tail import REWRAP_OFF_FRAME

    paragraphs = [f"Paragraph {index}: " + "words that wrap across the width of the screen " * 6 for index in range(60)]
    text = "\n\n".join(paragraphs)
    assert len(text) > REWRAP_OFF_FRAME
    app = RewrapHolder(text)
    async with app.run_test(size=(100, 20)) as pilot:
        blocks_widget = app.query_one(Rewrapped)
        await pilot.pause()
        wide = [line.text for line in blocks_widget._lines]
        blocks_widget.drawn_on.clear()
        await pilot.resize_terminal(70, 20)
        await pilot.pause()
        assert "MainThread" not in blocks_widget.drawn_on  # nothing drawn in a frame
        assert blocks_widget.render_line(0).cell_length == blocks_widget.size.width  # the old lines, cut
        blocks_widget.extend("A block frozen in meanwhile.", MarkdownBlocks(rendered_markdown))
        assert "A block frozen in meanwhile." in blocks_widget._lines[-1].text
        blocks_widget.hold.set()
        deadline = time.monotonic() + 20
        while blocks_widget._width != blocks_widget.size.width and time.monotonic() < deadline:
            await pilot.pause(0.05)
        narrow = [line.text for line in blocks_widget._lines]
        whole = [line.text for line in blocks_widget._draw(rendered_markdown, f"{text}\n\nA block frozen in "
                                                           "meanwhile.", blocks_widget.size.width)]
        assert narrow == whole and len(narrow) > len(wide)
        blocks_widget.drawn_on.clear()
        blocks_widget.hold.clear()  # a thread now would not finish: the test would wait for it in vain
        await pilot.resize_terminal(100, 20)
        await pilot.pause()
        assert blocks_widget.drawn_on == ["MainThread"]  # only the block frozen in: the rest kept from before
        assert [line.text for line in blocks_widget._lines][: len(wide)] == wide
        more = "\n\n".join(paragraphs[:30]).replace("Paragraph", "Later paragraph")  # frozen in at the wide width
        blocks_widget.extend(more, MarkdownBlocks(rendered_markdown))
        await pilot.pause()
        blocks_widget.drawn_on.clear()
        blocks_widget.hold.set()
        await pilot.resize_terminal(70, 20)  # the narrow lines lack all that came since: drawn on the thread again
        await pilot.pause()
        assert "MainThread" not in blocks_widget.drawn_on


async def test_a_long_reply_ends_with_the_lines_it_streamed_which_are_a_whole_renders(monkeypatch):
    """Issue 46: at its end a reply drew its text after the last frozen block again whole, in the frame that shows
    its footer (a 10,000-token paragraph: ~60 ms before Esc's "stopped" showed). The lines the tail drew are
    kept instead, nothing is drawn again, and the screen is the one the same reply drawn whole shows (reopened
    from the history): every cell, with its style."""
    import random

    from tui_chat.engine.base import Stream
    from tui_chat.session import Branch, Turn, Writing
    from tui_chat.ui.widgets import markdown
    from tui_chat.ui.widgets.messages import ReplyMessage

    rng = random.Random(3)
    words = "the model cache layer token batch thread queue widget screen render stream parser value".split()
    paragraph = " ".join(rng.choice(words) + ("." if rng.random() < 0.1 else "") for _ in range(800)).capitalize()
    text = f"## Notes\n\n{'A short first block. ' * 120}\n\n- one\n- two\n\n{paragraph}"

    class Reply(App):
        def __init__(self, reply: ReplyMessage) -> None:
            super().__init__()
            self.reply = reply

        def compose(self):
            yield self.reply

    def cells(app: App) -> list[list[tuple[str, object]]]:
        """Each cell's character and style (without the offsets Textual puts in for a selection); a blank's
        background alone (its colour draws nothing)."""
        return [[(char, segment.style.bgcolor if char == " " else segment.style.clear_meta_and_links())
                 for segment in line for char in segment.text] for line in app.screen._compositor.render_strips()]

    drawn = []
    console = markdown.ReplyMarkdown.__rich_console__
    monkeypatch.setattr(markdown.ReplyMarkdown, "__rich_console__",
                        lambda self, *args: drawn.append(self.markup) or console(self, *args))
    size = (90, 160)
    async with (app := Reply(ReplyMessage(Turn("question", [Branch(text, "end of text")])))).run_test(size=size):
        whole = cells(app)
    turn = Turn("question")
    writing = Writing(turn, Stream(), [], None)
    async with (app := Reply(ReplyMessage(turn, writing))).run_test(size=size) as pilot:
        for start in range(0, len(text), 97):
            writing.text = text[: start + 97]
            await app.reply.append(text[start : start + 97])
        await pilot.pause()
        assert app.reply.query(MarkdownBlocks).filter(".chunk"), "blocks were frozen out of the tail as it went"
        turn.branches.append(Branch(text, "end of text"))
        drawn.clear()
        await app.reply.finish()
        await pilot.pause()
        assert not any(paragraph[:100] in markup for markup in drawn), "the paragraph was not drawn again"
        assert cells(app) == whole
