"""The output format selector: free text, a JSON object, JSON that matches a schema, or a GBNF grammar.

A schema or a grammar is pasted into the box, or its file's path typed there, then `Use` (or Ctrl+S)
checks it: a bad one is one line and stays in the box to fix. The chosen format belongs to the
conversation (the chat screen keeps it in the session and the history) and applies from the next reply.
"""

from __future__ import annotations

from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Button, Select, Static, TextArea

from ...engine.formats import KINDS, TEXT, FormatError, OutputFormat, choose
from ..widgets.fields import ControlMessage, KeysInTurn

NEEDS_SOURCE = {"json_schema": "a JSON schema", "grammar": "a GBNF grammar"}


class SourceArea(KeysInTurn, TextArea):
    """Where a schema or grammar is pasted, or its path typed; Ctrl+S uses it."""

    BINDINGS = [Binding("ctrl+s", "use", "Use it", show=False)]

    class Use(Message):
        """The user asked to use what is in the box."""

    def action_use(self) -> None:
        self.post_message(self.Use())


class FormatPicker(Vertical):
    """Posts `Chosen` with a format that passed its checks."""

    DEFAULT_CSS = """
    FormatPicker { height: auto; }
    FormatPicker #format-source { height: auto; min-height: 2; max-height: 8; }
    FormatPicker #format-source-row { height: auto; display: none; }
    FormatPicker.-source #format-source-row { display: block; }
    FormatPicker #format-use { width: auto; min-width: 0; }
    FormatPicker #format-state { color: $text-muted; }
    FormatPicker #format-state.-error { color: $error; }
    FormatPicker #format-note { color: $warning; display: none; }
    FormatPicker #format-note.-shown { display: block; }
    FormatPicker #format-note.-error { color: $error; }
    """

    class Chosen(ControlMessage):
        def __init__(self, picker: FormatPicker, output: OutputFormat) -> None:
            super().__init__(picker)
            self.output = output

    def __init__(self, output: OutputFormat = TEXT, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.output = output

    def compose(self) -> ComposeResult:
        yield Select([(label, kind) for kind, label in KINDS.items()], value=self.output.kind, allow_blank=False,
                     compact=True, id="format-kind")
        with Vertical(id="format-source-row"):
            yield SourceArea(self.output.source, soft_wrap=True, compact=True, id="format-source",
                             placeholder="paste it here, or type its file path")
            yield Button("Use", compact=True, id="format-use")
        yield Static(id="format-state")
        yield Static(id="format-note")

    def on_mount(self) -> None:
        self.show(self.output)

    def show(self, output: OutputFormat) -> None:
        """The conversation's format (a new chat, a reopened one): the controls follow it."""
        self.output = output
        with self.prevent(Select.Changed):
            self.query_one("#format-kind", Select).value = output.kind
        self.query_one("#format-source", SourceArea).text = output.source
        self.set_class(output.kind in NEEDS_SOURCE, "-source")
        self._state(f"Replies: {output.label}")
        self.checked(output, "")

    def checked(self, output: OutputFormat, note: str, refused: bool = False) -> None:
        """What the model's engine said of `output` (the panel asks it): that it cannot be used, or what of
        it is not enforced while writing, in one line under the state; nothing when all of it is."""
        if output != self.output:
            return  # said of a format since replaced
        shown = self.query_one("#format-note", Static)
        shown.update(Content(f"{'✗' if refused else '⚠'} {note[:1].upper()}{note[1:]}" if note else ""))
        shown.set_class(bool(note), "-shown")
        shown.set_class(refused, "-error")

    def _state(self, text: str, error: bool = False) -> None:
        state = self.query_one("#format-state", Static)
        state.update(Content(text))
        state.set_class(error, "-error")

    @on(Select.Changed, "#format-kind")
    def _kind_chosen(self, event: Select.Changed) -> None:
        event.stop()
        kind = str(event.value)
        self.set_class(kind in NEEDS_SOURCE, "-source")
        if kind == self.output.kind and kind not in NEEDS_SOURCE:
            return  # the select reporting the value it was given
        if kind in NEEDS_SOURCE:
            self._state(f"Paste {NEEDS_SOURCE[kind]} or type its path, then Use (Ctrl+S)")
        else:
            self._use(kind, "")

    @on(Button.Pressed, "#format-use")
    @on(SourceArea.Use)
    def _use_source(self, event: Message) -> None:
        event.stop()
        self._use(str(self.query_one("#format-kind", Select).value), self.query_one("#format-source", SourceArea).text)

    def _use(self, kind: str, source: str) -> None:
        try:
            output = choose(kind, source.strip())
        except FormatError as error:
            self._state(str(error), error=True)
            self.notify(str(error), title="Output format not changed", severity="error", markup=False)
            return
        self.output = output
        self._state(f"Replies: {output.label}, from the next reply")
        self.checked(output, "")
        self.post_message(self.Chosen(self, output))
