"""The chat screen's keys, in one list: the screen binds them, the footer shows them, F1 and the command
palette list them, and `[keys]` in the config rebinds them by id."""

from __future__ import annotations

from textual.binding import Binding

CHAT_KEYS = [  # in the footer in this order: what a newcomer needs first, as far as the width allows
    Binding("escape", "stop", "Stop", id="stop", tooltip="Stop the reply (keeps what was written)"),
    Binding("f1", "help", "Help", id="help", tooltip="Show all keys"),
    Binding("f2", "toggle_panel", "Panel", id="toggle_panel", tooltip="Show or hide the side panel"),
    Binding("ctrl+n", "new_chat", "New chat", id="new_chat", tooltip="Start a new chat"),
    Binding("ctrl+o", "open_model", "Model", id="open_model", tooltip="Open another model"),
    Binding("ctrl+l", "conversations", "Chats", id="conversations",
            tooltip="Saved chats: open, search, rename, delete, export"),
    Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate", tooltip="Regenerate the last reply"),
    Binding("ctrl+g", "edit_last", "Edit last", id="edit_last", tooltip="Edit and resend the last message"),
    Binding("f3", "copy_last", "Copy reply", id="copy_last", tooltip="Copy the last reply"),
    Binding("f8", "continue_reply", "Continue", id="continue_reply", tooltip="Continue the last reply where it stopped"),
    Binding("ctrl+t", "toggle_heatmap", "Heatmap", id="toggle_heatmap",
            tooltip="Colour each token by its probability"),
    Binding("f4", "show_earlier", "Earlier", id="show_earlier", show=False, tooltip="Show earlier messages"),
    Binding("f5", "models", "Models", id="models", show=False,
            tooltip="Models: local ones, and GGUF models to download from the hub"),
    Binding("f6", "system_prompt", "System", id="system_prompt", show=False, priority=True,
            tooltip="Edit this chat's system prompt"),
    Binding("f7", "toggle_thinking", "Thinking", id="toggle_thinking", show=False,
            tooltip="Let a reasoning model think before it answers, or not (this chat, from the next reply)"),
]
