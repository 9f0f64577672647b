"""The chat screen's keys, in one list: the screen binds them, the footer shows them, F1 and the command
palette list them, and `[keys]` in the config rebinds them by id.

They work wherever the focus is on the chat screen, so all but Esc are priority bindings: the message
box (a TextArea) binds F6 and F7 itself, and a widget of the panel may bind others. Esc stays the
focused widget's first (a slider drops a typed number, a list closes); on the screen it stops a reply,
or with none being written takes the focus back to the message box."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.keys import key_to_character

CONFIRM_WITHIN_S = 3.0  # a key that deletes asks to be pressed again, within this


def everywhere(key: str, action: str, description: str, **options: Any) -> Binding:
    """A key that works wherever the focus is on the chat screen, ahead of the focused widget's own."""
    return Binding(key, action, description, priority=True, **options)


def room(name: str, action: str, *argument: object) -> str:
    """A key's action: the chat screen's one `room` action, which runs the named room's `action_<action>` (with
    the one argument, if any, that follows)."""
    return f"room({', '.join(repr(part) for part in (name, action, *argument))})"


CHAT_KEYS = [  # in the footer in this order: what a newcomer needs first, as far as the width allows
    Binding("escape", room("conversation", "reply", "stop"), "Stop", id="stop",
            tooltip="Stop the reply (keeps what was written)"),
    Binding("escape", room("conversation", "to_box"), "Message box", id="to_box", show=False,
            tooltip="Back to the message box (with no reply being written)"),
    everywhere("f1", room("panel", "help"), "Help", id="help", tooltip="Show all keys"),
    everywhere("f2", room("panel", "toggle_panel"), "Panel", id="toggle_panel",
               tooltip="Show or hide the side panel"),
    everywhere("ctrl+n", room("chats", "new_chat"), "New chat", id="new_chat", tooltip="Start a new chat"),
    everywhere("ctrl+o", room("models", "pick_model", "open"), "Model", id="open_model",
               tooltip="Open another model"),
    everywhere("ctrl+l", room("chats", "conversations"), "Chats", id="conversations",
               tooltip="Saved chats: open, search, rename, delete, export"),
    everywhere("ctrl+r", room("conversation", "reply", "regenerate"), "Regenerate", id="regenerate",
               tooltip="Regenerate the last reply"),
    everywhere("ctrl+g", room("conversation", "edit_last"), "Edit last", id="edit_last",
               tooltip="Edit and resend the last message"),
    everywhere("f3", room("conversation", "copy_last"), "Copy reply", id="copy_last", tooltip="Copy the last reply"),
    everywhere("f8", room("conversation", "reply", "continue"), "Continue", id="continue_reply",
               tooltip="Continue the last reply where it stopped"),
    everywhere("ctrl+t", room("conversation", "toggle_heatmap"), "Heatmap", id="toggle_heatmap",
               tooltip="Colour each token by its probability"),
    everywhere("f4", room("conversation", "show_earlier"), "Earlier", id="show_earlier", show=False,
               tooltip="Show earlier messages"),
    everywhere("f5", room("models", "pick_model", "models"), "Models", id="models", show=False,
               tooltip="Models: local ones, configured servers, and GGUF models to download from the hub"),
    everywhere("f6", room("chats", "system_prompt"), "System", id="system_prompt", show=False,
               tooltip="Edit this chat's system prompt"),
    everywhere("f7", room("conversation", "toggle_thinking"), "Thinking", id="toggle_thinking", show=False,
               tooltip="Let a reasoning model think before it answers, or not (this chat, from the next reply)"),
    everywhere("f9", room("tools", "tools"), "Tools", id="tools", show=False,
               tooltip="Tools: the MCP servers and their tools, switched on or off for this chat"),
    everywhere("f10", room("lab", "lab"), "Lab", id="lab", show=False,
               tooltip="Sampling lab: 2–4 settings side by side on one prompt"),
    everywhere("alt+up", room("conversation", "focus_message", -1), "Earlier message", id="previous_message",
               show=False, tooltip="Focus the message above (from the box: the latest)"),
    everywhere("alt+down", room("conversation", "focus_message", 1), "Later message", id="next_message",
               show=False, tooltip="Focus the message below (past the latest: the box)"),
]


def shown_key(key: str) -> str:
    """A key as a person reads it: `[`, not `left_square_bracket`; modifiers and named keys stay words."""
    *modifiers, name = key.strip().split("+")
    character = key_to_character(name)
    if character is not None and character.isprintable() and not character.isspace():
        name = character
    return "+".join([*modifiers, name])
