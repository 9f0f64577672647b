"""Ctrl+O: load another model by path or name while the current one keeps working."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from ...engine.models import STARTER_NAME


class OpenModelScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    OpenModelScreen { align: center middle; }
    OpenModelScreen > Vertical {
        width: 70; max-width: 100%; height: auto;
        border: round $accent; background: $surface; padding: 0 1;
    }
    OpenModelScreen .hint { color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Open a model"
            yield Static(Content(f"A path to a .gguf file, or {STARTER_NAME} for the starter model."), classes="hint")
            yield Input(placeholder="~/models/model-Q4_K_M.gguf", id="model-name")
            yield Static(Content("Enter loads it · Esc cancels"), classes="hint")

    @on(Input.Submitted)
    def _chosen(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
