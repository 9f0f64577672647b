"""The Textual application: themes, key map, command palette, and the chat screen."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from textual.app import App, SystemCommand
from textual.notifications import SeverityLevel
from textual.screen import Screen

from ..config import Config, config_dir, config_path, log_dir, save_setting
from ..engine.params import PRESETS, LiveParams
from ..guard import LOG_NAME, exception_line
from ..lag import monitor_from_env
from ..safetext import screen_safe
from ..workspace import OpenBackend, Workspace
from .chat.room import PaletteChoice
from .chat.screen import ChatScreen
from .keys import CHAT_KEYS, room
from .textual_fixes import spacing_marks_take_a_cell, terminal_driver
from .themes import load_themes
from .widgets.live_tail import COMMON_CODE, warm_lexer

DEFAULT_THEME = "tui-chat-dusk"


class ChatApp(App[None]):
    TITLE = "tui-chat"
    # Textual's toasts take at most half the width: at 80 columns a long line wrapped to 40 and ran off the
    # screen's foot. Up to 90 % keeps it whole.
    CSS = "Toast { max-width: 90%; }"

    def __init__(self, config: Config, open_backend: OpenBackend, model: str | None = None) -> None:
        super().__init__(driver_class=terminal_driver())
        spacing_marks_take_a_cell()
        self.config = config
        self.open_backend = open_backend
        self.model = model
        self.keymap_overrides = dict(config.keys)
        self._saved_theme: str | None = None
        self.lag = monitor_from_env()  # the event loop's stalls, when TUI_CHAT_LAG_LOG asks for them
        self.crash: str | None = None  # the line to say after the screen is back, when a bug ended the app
        self.workspace: Workspace | None = None

    def on_mount(self) -> None:
        if self.lag is not None:
            self.lag.start()
        self.call_after_refresh(warm_lexer, f"```{COMMON_CODE}")  # the first screen is drawn first
        themes, problems = load_themes(config_dir() / "themes")
        for theme in themes:
            self.register_theme(theme)
        for problem in problems:
            self.notify(problem, severity="warning", timeout=6, markup=False)
        wanted = self.config.theme or DEFAULT_THEME
        if wanted not in self.available_themes:
            self.notify(f"theme {wanted!r} in {config_path()} is not a theme tui-chat knows: using {DEFAULT_THEME} "
                        "(Ctrl+P, then Theme, lists them)", severity="warning", timeout=12, markup=False)
            wanted = DEFAULT_THEME
        self.theme = wanted
        self._saved_theme = self.theme
        self.set_keymap(self.keymap_overrides)
        self.workspace = Workspace(self.config, self.open_backend)
        self.push_screen(ChatScreen(self.workspace, self.model, LiveParams(self.config.sampling)))

    def _handle_exception(self, error: Exception) -> None:
        """A bug ends the app as a crash does (guard.py): the traceback goes to the log and the terminal
        gets one line (commands/chat.py), not Textual's traceback with every local's value, which here
        can be a chat's whole token record: thousands of lines."""
        if self.crash is None:
            self.crash = exception_line(error, log_dir() / LOG_NAME)
        self._return_code = 1
        if self._exception is None:  # as Textual's own, so that a Pilot test raises it
            self._exception = error
            self._exception_event.set()
        self._close_messages_no_wait()  # not Textual's render of it: over 40 s for a 100,000-character value

    def watch_theme(self, theme: str) -> None:
        """Remember the theme the user picked (command palette → Change theme)."""
        if self._saved_theme is None or theme == self._saved_theme:
            return
        try:
            save_setting("theme", theme)
            self._saved_theme = theme
        except OSError as error:
            self.notify(f"cannot save the theme: {error.strerror}", severity="warning", markup=False)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Notifications quote error messages, file and model names, server answers and chat titles:
        whatever the caller, none of their control characters reaches the terminal. (Markup is the
        caller's to refuse: every call that quotes such text passes markup=False.)"""
        super().notify(screen_safe(message), title=screen_safe(title), severity=severity, timeout=timeout,
                       markup=markup)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if not isinstance(screen, ChatScreen):
            return
        for binding in CHAT_KEYS:  # the chat screen's BINDINGS
            key = self.keymap_overrides.get(binding.id, binding.key) if binding.id else binding.key
            yield SystemCommand(binding.tooltip, f"{binding.description} · {key}",
                                partial(screen.run_action, binding.action))
        yield SystemCommand("Output format", "Replies as free text, a JSON object, JSON under a schema or a "
                            "grammar: this chat's, from the next reply",
                            partial(screen.run_action, room("output_format", "output_format")))
        for name in PRESETS:
            yield SystemCommand(f"Preset: {name}", f"Sampling preset {name}",
                                partial(screen.post_message, PaletteChoice("preset", name)))
        for name in self.config.prices:
            yield SystemCommand(f"Price: {name}", f"Show costs at {name} prices",
                                partial(screen.post_message, PaletteChoice("price", name)))
