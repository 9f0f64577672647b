"""Chat messages. A reply streams into a Textual Markdown widget; once finished it becomes one
Static, because hundreds of live Markdown widgets slow streaming down (measured: 440 → 65 tok/s).

Model text is untrusted: it is shown literally, never parsed as Rich markup, and control
characters become visible escapes before anything reaches the terminal.
"""

from __future__ import annotations

from rich.markdown import Markdown as RichMarkdown
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Markdown, Static

from ...engine.base import StopReason, TurnMetrics
from ...safetext import terminal_safe

STOP_LABELS: dict[str, str] = {
    "eos": "end of text",
    "stop": "stop sequence",
    "length": "max tokens",
    "cancelled": "stopped",
}


class ChatMessage(Vertical):
    """A message the user can focus (Tab or click) and copy."""

    can_focus = True
    BINDINGS = [Binding("c", "copy", "Copy", id="copy_message")]

    def __init__(self, text: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = text

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.notify("Copied to the clipboard", timeout=2)


class UserMessage(ChatMessage):
    def compose(self) -> ComposeResult:
        yield Static(Content(terminal_safe(self.text)), classes="body")


class AssistantMessage(ChatMessage):
    """A reply: streamed while it is generated, then frozen into one cheap Static."""

    def __init__(self, text: str = "", *, footer: str = "", **kwargs) -> None:
        super().__init__(text, **kwargs)
        self._footer_text = footer
        self._stream = None

    def compose(self) -> ComposeResult:
        if self._footer_text:
            yield self._frozen_body()
        else:
            yield Markdown(classes="body")
        yield Static(Content(self._footer_text), classes="footer")

    def on_mount(self) -> None:
        if not self._footer_text:
            self._stream = Markdown.get_stream(self.query_one(Markdown))

    def show_status(self, status: str) -> None:
        """A quiet line under the reply: prompt-reading progress now, the stop reason later."""
        self.query_one(".footer", Static).update(Content(status))

    async def append(self, text: str) -> None:
        self.text += text
        if self._stream is not None:
            await self._stream.write(terminal_safe(text))

    async def finish(self, text: str, reason: StopReason, metrics: TurnMetrics) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.text = text
        self._footer_text = reply_footer(reason, metrics)
        await self.query_one(Markdown).remove()
        await self.mount(self._frozen_body(), before=0)
        self.show_status(self._footer_text)

    def _frozen_body(self) -> Static:
        return Static(RichMarkdown(terminal_safe(self.text.strip()), code_theme="monokai"), classes="body")


def reply_footer(reason: StopReason, metrics: TurnMetrics) -> str:
    parts = [STOP_LABELS[reason], f"{metrics.completion_tokens} tokens"]
    if metrics.decode_tok_s:
        parts.append(f"{metrics.decode_tok_s:.1f} tok/s")
    if metrics.ttft_s is not None:
        parts.append(f"TTFT {metrics.ttft_s:.2f} s")
    return " · ".join(parts)
