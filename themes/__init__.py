"""Themes shipped with tui-chat: TOML files read by tui_chat.ui.themes."""
