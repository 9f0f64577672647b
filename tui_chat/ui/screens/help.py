"""F1: every key the app answers to, as bound right now (the config can rebind them)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from ..keys import shown_key
from ..panel.slider import Slider
from ..widgets.messages import ChatMessage, ReplyMessage, UserMessage
from ..widgets.prompt import PromptInput
from .dialog import Dialog

Section = tuple[str, Sequence[BindingType]]
HELP_WIDTH = 86


def handled(key: str, what: str) -> Binding:
    """A key a widget handles itself (a list's Enter, a field's Enter): F1 lists it beside the bindings."""
    return Binding(key, "", what)


def chat_sections(chat_bindings: Sequence[BindingType]) -> list[Section]:
    """The chat screen's keys, then those of the screens and widgets it opens."""
    from ..panel.bias import BiasEntries
    from ..panel.order import OrderBar
    from ..widgets.thinking import ThinkingBlock
    from ..widgets.tool_calls import ToolCallBlock
    from .consent import ConsentScreen
    from .conversations import ConversationsScreen
    from .inspector import InspectorScreen
    from .models import ModelsScreen

    return [
        ("Chat", chat_bindings),
        ("Models screen", ModelsScreen.BINDINGS),
        ("Message box", PromptInput.BINDINGS),
        ("A focused message", ChatMessage.BINDINGS),
        ("A focused message of yours", UserMessage.BINDINGS),
        ("A focused reply (or click one of its tokens)", ReplyMessage.BINDINGS),
        ("A reply's thinking", ThinkingBlock.BINDINGS),
        ("A reply's tool call", ToolCallBlock.BINDINGS),
        ("Asked to run a tool", [handled("tab,enter", "Pick and press Run once, Always for this tool in this chat "
                                                    "or Deny (focused first)"), *ConsentScreen.BINDINGS]),
        ("Token inspector", [
            *InspectorScreen.BINDINGS,
            handled("up,down", "Pick an alternative"),
            handled("enter", "Branch the reply here with the picked alternative"),
            handled("tab", "To the word field: type a word or phrase, Enter gives its probability here"),
        ]),
        ("A focused slider (or click and drag it)",
         [*Slider.BINDINGS, handled("0-9,.", "Type a number (Enter sets it, Esc drops it)")]),
        ("Sampler order", OrderBar.BINDINGS),
        ("Logit bias", [handled("enter", "In the field: add TEXT=BIAS (-inf bans it); on a row: edit it"),
                        *BiasEntries.BINDINGS]),
        ("Saved chats", [handled("enter", "Open the chat"), *ConversationsScreen.BINDINGS]),
    ]


def as_bindings(declared: Iterable[BindingType]) -> list[Binding]:
    """BINDINGS as Binding objects (Textual allows tuples too), each with its keys as declared."""
    return [binding if isinstance(binding, Binding) else Binding(*binding) for binding in declared]


KEYS_WIDTH = 22
ANYWHERE = [("ctrl+p", "command palette (themes, presets, every action)"),
            ("tab, shift+tab", "move focus: the message box and the panel (messages: alt+up/down)"),
            ("ctrl+q", "quit")]


def key_lines(sections: Sequence[Section], keymap: Mapping[str, str], width: int = 0) -> list[str]:
    """A section's title, then a line for each key; a description longer than `width` (0: any) goes on under
    itself, not under the keys."""
    lines: list[str] = []
    for title, bindings in [*sections, ("Anywhere", [handled(key, what) for key, what in ANYWHERE])]:
        lines.append(title)
        for binding in as_bindings(bindings):
            keys = keymap.get(binding.id, binding.key) if binding.id else binding.key
            keys = ", ".join(shown_key(key) for key in keys.split(","))
            lines += textwrap.wrap(f"  {keys:<{KEYS_WIDTH}} {binding.tooltip or binding.description}",
                                   width or 10_000, subsequent_indent=" " * (KEYS_WIDTH + 3))
        lines.append("")
    return lines[:-1]


class HelpScreen(Dialog[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen > VerticalScroll { width: 86; }  /* HELP_WIDTH */
    """

    def __init__(self, sections: Sequence[Section], keymap: Mapping[str, str]) -> None:
        """`keymap`: the config's rebound keys (binding id to keys)."""
        super().__init__()
        self.sections = sections
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = "Keys"
            yield Static()

    def on_resize(self) -> None:
        """Wrapped to the box's width (the border, padding and scrollbar off it)."""
        width = min(HELP_WIDTH, self.size.width) - 6
        self.query_one(Static).update(Content("\n".join(key_lines(self.sections, self.keymap, width))))
