"""The logit bias as an editable list: one row a text and the number added to its first token's logit
(or -inf, which bans it)."""

from __future__ import annotations

import math
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from ...engine.params import InvalidParameter, parse_logit_bias
from ...safetext import quoted
from ..widgets.fields import ControlMessage, TextField

Entries = tuple[tuple[str, float], ...]


def shown_bias(bias: float) -> str:
    return "-inf" if bias == -math.inf else f"{bias:+g}"


def as_typed(text: str, bias: float) -> str:
    """An entry as it is typed in the field, to edit it."""
    return f"{text}={shown_bias(bias).lstrip('+')}"


class BiasEntries(OptionList):
    """The entries; Delete or Backspace removes the highlighted one."""

    BINDINGS = [Binding("delete,backspace", "remove", "Remove", show=False)]

    class Removed(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def action_remove(self) -> None:
        if self.highlighted is not None:
            self.post_message(self.Removed(self.highlighted))


class BiasList(Vertical):
    """`TEXT=BIAS` in the field adds an entry, or changes the bias of a text already listed (a leading
    space counts: ` Paris` is the word mid-sentence); Enter on an entry puts it back in the field to
    edit; Delete removes it. Posts `Changed` with every entry; a bad entry is one line and stays in
    the field."""

    DEFAULT_CSS = """
    BiasList { height: auto; }
    BiasList BiasEntries { height: auto; max-height: 8; }
    BiasList BiasEntries.-empty { display: none; }
    """

    class Changed(ControlMessage):
        def __init__(self, bias_list: BiasList, entries: Entries) -> None:
            super().__init__(bias_list)
            self.entries = entries

    def __init__(self, entries: Entries, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entries = entries

    def compose(self) -> ComposeResult:
        yield BiasEntries(compact=True, id="bias-entries")
        yield TextField(placeholder="TEXT=BIAS, e.g. Paris=-inf", compact=True, select_on_focus=False, id="bias-add")

    def on_mount(self) -> None:
        self.show(self.entries)

    def show(self, entries: Entries) -> None:
        self.entries = tuple(entries)
        rows = self.query_one(BiasEntries)
        rows.clear_options()
        rows.add_options([Option(Content(f"{quoted(text):<20.20} {shown_bias(bias):>6}")) for text, bias in entries])
        rows.set_class(not entries, "-empty")

    @on(Input.Submitted, "#bias-add")
    def _add(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            text, bias = parse_logit_bias(event.value)
        except InvalidParameter as error:
            self.notify(str(error), severity="error", markup=False)
            return
        event.input.value = ""
        self.post_message(self.Changed(self, (*(e for e in self.entries if e[0] != text), (text, bias))))

    @on(OptionList.OptionSelected, "#bias-entries")
    def _edit(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        field = self.query_one("#bias-add", TextField)
        field.value = as_typed(*self.entries[event.option_index])
        field.cursor_position = len(field.value)
        field.focus()

    @on(BiasEntries.Removed)
    def _remove(self, event: BiasEntries.Removed) -> None:
        event.stop()
        self.post_message(self.Changed(self, self.entries[: event.index] + self.entries[event.index + 1 :]))
