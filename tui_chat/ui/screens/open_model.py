"""Ctrl+O: load another model while the current one keeps working: one from this machine's list or a
configured server, or any path or name typed; with the context size and GPU layers to load it with."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ...config import check_context, check_gpu_layers, models_dir
from ...engine.factory import remote_spec
from ...engine.models import STARTER_NAME
from ...engine.params import InvalidParameter
from ...hub import HubError
from ...safetext import terminal_safe
from ...units import format_size
from ...workspace import Workspace
from .dialog import Dialog


class OpenModelScreen(Dialog[str | None]):
    """Returns the name to load; the context size and GPU layers chosen are the workspace's from now on (and
    the config's): None for the GPU layers is as the build can (all layers where it offloads)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    OpenModelScreen OptionList { height: auto; max-height: 12; margin: 1 0; }
    OpenModelScreen Horizontal { height: auto; margin: 1 0 0 0; }
    OpenModelScreen Horizontal Static { width: auto; padding: 0 1 0 0; }
    OpenModelScreen Horizontal Input { width: 12; margin: 0 2 0 0; }
    """

    def __init__(self, workspace: Workspace, servers: list[str], in_use: str) -> None:
        super().__init__()
        self.workspace = workspace
        self.servers = servers
        self.in_use = Path(in_use).stem
        self.n_ctx, self.gpu_layers = workspace.local_options()

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Open a model"
            yield Static(Content(f"A path to a .gguf file, OWNER/NAME:FILE, {STARTER_NAME}, @SERVER[:MODEL] or @http://HOST:PORT:"),
                         classes="hint")
            yield Input(placeholder="~/models/model-Q4_K_M.gguf", id="model-name")
            yield Static(Content("Or one on this machine or a configured server (↓ or Tab, then Enter):"),
                         classes="hint", id="choices-hint")
            yield OptionList(*self._options(), id="choices")
            with Horizontal():
                yield Static(Content("Context"))
                yield Input(str(self.n_ctx), id="n-ctx", type="integer", compact=True)
                yield Static(Content("GPU layers"))
                yield Input("" if self.gpu_layers is None else str(self.gpu_layers), placeholder="all",
                            id="gpu-layers", compact=True)
            yield Static(Content("Context in tokens (a multiple of 256); GPU layers -1 all, 0 CPU only. Saved as "
                                 "the defaults.  Esc cancels"), classes="hint")

    def _options(self) -> list[Option]:
        from ...hub.local import list_local

        try:
            local = list_local(models_dir())
        except HubError:
            local = []
        options = []
        for model in local:
            line = Text(terminal_safe(model.name), style="bold" if model.path.stem == self.in_use else "")
            line.append(f"  {model.quant or '?'} · {format_size(model.size)}", style="dim")
            options.append(Option(line, id=model.name))
        for server in self.servers:
            options.append(Option(Text(terminal_safe(server)).append("  server", style="dim"), id=server))
        return options

    def on_mount(self) -> None:
        choices = self.query_one(OptionList)
        choices.display = self.query_one("#choices-hint").display = choices.option_count > 0
        self.query_one("#model-name", Input).focus()

    def on_key(self, event: events.Key) -> None:
        """↓ from the box goes down into the list."""
        if event.key == "down" and self.focused is self.query_one("#model-name") and self.query_one(OptionList).display:
            self.query_one(OptionList).focus()
            event.stop()

    @on(OptionList.OptionSelected)
    def _listed(self, event: OptionList.OptionSelected) -> None:
        self._choose(event.option.id)

    @on(Input.Submitted)
    def _typed(self, event: Input.Submitted) -> None:
        name = self.query_one("#model-name", Input).value.strip()
        if event.input.id != "model-name" or name:
            self._choose(name or self.in_use)

    def _choose(self, name: str | None) -> None:
        try:
            n_ctx = check_context(int(self.query_one("#n-ctx", Input).value or self.n_ctx))
            layers_text = self.query_one("#gpu-layers", Input).value.strip()
            gpu_layers = None if layers_text in ("", "all") else check_gpu_layers(int(layers_text))
        except (ValueError, InvalidParameter) as error:
            self.notify(str(error) if isinstance(error, InvalidParameter) else "context and GPU layers are numbers",
                        severity="error", markup=False)
            return
        if not name:
            return
        try:
            self.workspace.reconfigure(n_ctx, gpu_layers)
        except OSError as error:
            self.notify(f"cannot save the settings: {error.strerror}", severity="warning", markup=False)
        self.dismiss(name)


def server_names(profiles: Mapping[str, object]) -> list[str]:
    return [remote_spec(name) for name in sorted(profiles)]
