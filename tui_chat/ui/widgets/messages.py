"""Chat messages.

A reply streams into a Textual Markdown tail; every few thousand characters the finished leading
blocks are frozen into one Static, so the live Markdown (one widget per block) stays small however
long the reply grows. A finished message is a single Static: hundreds of them keep layout cheap.

Model text is untrusted: it is shown literally, never parsed as Rich markup, and control
characters become visible escapes before anything reaches the terminal.
"""

from __future__ import annotations

from rich.console import Group
from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Markdown, Static

from ...engine.base import StopReason, TurnMetrics
from ...safetext import terminal_safe

STOP_LABELS: dict[str, str] = {
    "eos": "end of text",
    "stop": "stop sequence",
    "length": "max tokens",
    "cancelled": "stopped",
}
FREEZE_AFTER_CHARS = 3000
_FENCE = "```"


def rendered_markdown(text: str) -> RichMarkdown:
    return RichMarkdown(terminal_safe(text), code_theme="monokai")


def freeze_point(text: str) -> int | None:
    """Where the text can be cut between two top-level blocks: a blank line outside a code fence."""
    cut = text.rfind("\n\n")
    while cut > 0:
        if text.count(_FENCE, 0, cut) % 2 == 0:
            return cut
        cut = text.rfind("\n\n", 0, cut)
    return None


def reply_footer(reason: StopReason, metrics: TurnMetrics) -> str:
    parts = [STOP_LABELS[reason], f"{metrics.completion_tokens} tokens"]
    if metrics.decode_tok_s:
        parts.append(f"{metrics.decode_tok_s:.1f} tok/s")
    if metrics.ttft_s is not None:
        parts.append(f"TTFT {metrics.ttft_s:.2f} s")
    return " · ".join(parts)


class ChatMessage(Widget):
    """A message the user can focus (Tab or click) and copy."""

    can_focus = True
    BINDINGS = [Binding("c", "copy", "Copy", id="copy_message")]
    text: str

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.notify("Copied to the clipboard", timeout=2)


class UserMessage(ChatMessage, Static):
    def __init__(self, text: str, **kwargs) -> None:
        super().__init__(Content(terminal_safe(text)), **kwargs)
        self.text = text


class ReplyMessage(ChatMessage, Vertical):
    """A reply. While it is written: frozen chunks, a live Markdown tail and a status line. Once
    finished: only the chunks, the last one carrying the quiet footer (stop reason, tokens, speed),
    so finishing renders just the tail, not the whole reply again."""

    def __init__(self, text: str = "", footer: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = text
        self.footer = footer
        self._tail = text
        self._frozen_chars = 0
        self._stream = None

    def compose(self) -> ComposeResult:
        if self.footer is not None:
            yield self._last_chunk(self.text, self.footer)
        else:
            yield Markdown(classes="tail")
            yield Static(classes="status")

    def on_mount(self) -> None:
        if self.footer is None:
            self._stream = Markdown.get_stream(self.query_one(Markdown))

    @staticmethod
    def _last_chunk(text: str, footer: str) -> Static:
        return Static(Group(rendered_markdown(text.strip()), Text(footer, style="dim")), classes="chunk last")

    def show_status(self, status: str) -> None:
        """Prompt-reading progress before the first token; nothing once text flows."""
        self.query_one(".status", Static).update(Content(status))

    async def append(self, text: str) -> None:
        self.text += text
        self._tail += text
        await self._stream.write(terminal_safe(text))
        if len(self._tail) > FREEZE_AFTER_CHARS:
            cut = freeze_point(self._tail)
            if cut is not None:
                await self._freeze(cut)

    async def _freeze(self, cut: int) -> None:
        frozen, self._tail = self._tail[:cut], self._tail[cut + 2 :]
        self._frozen_chars += cut + 2
        await self._stream.stop()
        tail = self.query_one(Markdown)
        await self.mount(Static(rendered_markdown(frozen), classes="chunk"), before=tail)
        await tail.update(terminal_safe(self._tail))
        self._stream = Markdown.get_stream(tail)

    async def stop(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    async def finish(self, text: str, footer: str) -> None:
        """Freeze what is left: `text` is the engine's final word on the reply (a held-back stop
        prefix may have been released at the end)."""
        await self.stop()
        self.text, self.footer = text, footer
        await self.query_one(".status").remove()
        await self.query_one(Markdown).remove()
        await self.mount(self._last_chunk(text[self._frozen_chars :], footer))
