"""Nothing runs without the user's yes: the dialog a reply's tool call waits on.

The reply's tool thread asks (`consent`, tools/loop.py) and waits on a Future; the dialog answers it. Deny
has the focus first: a message being typed when the dialog opens must not say yes with its Enter. The
arguments are the model's: shown literally, escapes visible."""

from __future__ import annotations

import concurrent.futures
import json
from typing import cast

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.message_pump import MessagePump
from textual.widgets import Button, Static

from ...engine.base import ToolCall
from ...safetext import screen_safe
from ...tools.loop import Decision
from .dialog import Dialog


class ConsentWanted(Message):
    """Posted from a reply's tool thread: ask the user about `call`, answer `answer`."""

    def __init__(self, call: ToolCall, answer: concurrent.futures.Future[Decision]) -> None:
        super().__init__()
        self.call = call
        self.answer = answer


def ask_consent(app: MessagePump, call: ToolCall) -> concurrent.futures.Future[Decision]:
    """A `Consent` (tools/loop.py), with `app` bound: posts the question there (from any thread); a closed
    app says no."""
    answer: concurrent.futures.Future[Decision] = concurrent.futures.Future()
    if not app.post_message(ConsentWanted(call, answer)):
        answer.set_result("deny")
    return answer


class ConsentScreen(Dialog[None]):
    BINDINGS = [Binding("escape", "answer('deny')", "Deny", tooltip="Deny: the model is told the call was not allowed")]
    DEFAULT_CSS = """
    ConsentScreen > Vertical { width: 90; }
    ConsentScreen #arguments { height: auto; max-height: 16; border: round $panel; }
    ConsentScreen Horizontal { height: auto; margin: 1 0 0 0; }
    ConsentScreen Button { margin: 0 1 0 0; }
    """

    class Settled(Message):
        """The Future was answered or cancelled (the reply stopped): the dialog goes."""

    def __init__(self, call: ToolCall, answer: concurrent.futures.Future[Decision]) -> None:
        super().__init__(classes="-care")
        self.call = call
        self.answer = answer
        self._gone = False

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Run a tool?"
            yield Static(Content(screen_safe(f"Server: {self.call.server}\nTool:   {self.call.name}")), id="what")
            yield Static(Content("Arguments (written by the model):"), classes="hint")
            with VerticalScroll(id="arguments"):
                yield Static(Content(screen_safe(json.dumps(self.call.arguments, ensure_ascii=False, indent=2))))
            with Horizontal():
                yield Button("Run once", id="once", variant="primary")
                yield Button("Always for this tool in this chat", id="always")
                yield Button("Deny", id="deny", variant="error")
            yield Static(Content("Esc denies: the model is told the call was not allowed, and goes on."),
                         classes="hint")

    def on_mount(self) -> None:
        self.query_one("#deny", Button).focus()
        self.answer.add_done_callback(lambda _answer: self.post_message(self.Settled()))

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.action_answer(cast(Decision, event.button.id))  # the buttons' ids are the decisions

    def action_answer(self, decision: Decision) -> None:
        if not self.answer.done():
            self.answer.set_result(decision)
        self._close()

    @on(Settled)
    def _close(self) -> None:
        if not self._gone:
            self._gone = True
            self.dismiss()
