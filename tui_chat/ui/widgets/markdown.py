"""A reply's Markdown as Rich draws it, made cheaply: a streaming reply makes one for every block it finishes and
one for the block being written at every batch, dozens a second at thousands of tokens a second."""

from __future__ import annotations

from markdown_it import MarkdownIt
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import CodeBlock, Markdown as RichMarkdown
from rich.syntax import Syntax

from ...safetext import screen_safe

CODE_THEME = "monokai"
_PARSER = MarkdownIt().enable("strikethrough").enable("table")  # the parser Rich's Markdown makes for itself


class ReplyMarkdown(RichMarkdown):
    """Rich's Markdown, parsed by one parser for all: Rich makes a new MarkdownIt for each instance (0.45 ms, twice
    as long as drawing a paragraph). The attributes are those Rich's own `__init__` sets, for a reply (no links
    followed, monokai code); a test holds the lines drawn to Rich's."""

    def __init__(self, markup: str) -> None:  # Rich's __init__ would make its own parser
        self.markup = markup
        self.parsed = _PARSER.parse(markup)
        self.code_theme = self.inline_code_theme = CODE_THEME
        self.justify = None
        self.style = "none"
        self.hyperlinks = False
        self.inline_code_lexer = None


class _PlainCode(CodeBlock):
    """A code block not yet complete: drawn without colours, which pygments would compute again at every batch."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Syntax(str(self.text).rstrip(), "text", theme=self.theme, word_wrap=True, padding=1)


class WritingMarkdown(ReplyMarkdown):
    """The block being written: its code without syntax colours until the block is finished."""

    elements = {**RichMarkdown.elements, "fence": _PlainCode, "code_block": _PlainCode}


def rendered_markdown(text: str) -> ReplyMarkdown:
    """Untrusted text as a finished block draws: terminal-safe, then Markdown."""
    return ReplyMarkdown(screen_safe(text))


def writing_markdown(text: str) -> WritingMarkdown:
    return WritingMarkdown(screen_safe(text))
