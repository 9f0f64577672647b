"""The Textual application: themes, key map, command palette, and the chat screen."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from textual.app import App, SystemCommand
from textual.notifications import SeverityLevel
from textual.screen import Screen

from ..config import Config, config_dir, save_setting
from ..engine.params import PRESETS, LiveParams
from ..safetext import screen_safe
from .screens.chat import ChatScreen
from .screens.model_loader import OpenBackend
from .themes import load_themes


DEFAULT_THEME = "tui-chat-dusk"


class ChatApp(App[None]):
    TITLE = "tui-chat"

    def __init__(self, config: Config, open_backend: OpenBackend, model: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.open_backend = open_backend
        self.model = model
        self.keymap_overrides = dict(config.keys)
        self._saved_theme: str | None = None

    def on_mount(self) -> None:
        themes, problems = load_themes(config_dir() / "themes")
        for theme in themes:
            self.register_theme(theme)
        for problem in problems:
            self.notify(problem, severity="warning", timeout=6, markup=False)
        wanted = self.config.theme or DEFAULT_THEME
        if wanted in self.available_themes:
            self.theme = wanted
        else:
            self.notify(f"theme {wanted!r} not found; using {self.theme}", severity="warning", markup=False)
        self._saved_theme = self.theme
        self.set_keymap(self.keymap_overrides)
        self.push_screen(ChatScreen(self.open_backend, self.model, LiveParams(self.config.sampling), self.config))

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

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if not isinstance(screen, ChatScreen):
            return
        for binding in ChatScreen.BINDINGS:
            key = self.keymap_overrides.get(binding.id, binding.key)
            yield SystemCommand(binding.tooltip, f"{binding.description} · {key}",
                                partial(screen.run_action, binding.action))
        for name in PRESETS:
            yield SystemCommand(f"Preset: {name}", f"Sampling preset {name}", lambda name=name: screen.apply_preset(name))
        for name in self.config.prices:
            yield SystemCommand(f"Price: {name}", f"Show costs at {name} prices", lambda name=name: screen.choose_price(name))
