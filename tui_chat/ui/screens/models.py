"""F5: the models on this machine, the servers of the config, and GGUF models to find and download from the
Hugging Face hub.

The screen is installed once and kept, so a download goes on while the user is back in the chat
and its progress is here when they return. Downloads run on a worker thread and report through
messages; hub names are untrusted text and are drawn literally.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, DataTable, Input, ProgressBar, Select, Static, TabbedContent, TabPane

from ...config import models_dir
from ...engine.factory import remote_spec
from ...hub import HubError
from ...hub.download import Cancelled, Progress
from ...hub.http import OFFLINE_MESSAGE, offline
from ...hub.local import LocalModel, import_model, list_local
from ...safetext import terminal_safe
from ...units import format_size
from ...workspace import Removed, Workspace

if TYPE_CHECKING:
    from ...hub.catalog import RepoListing, RepoSummary
from ..textual_fixes import Footer
from .dialog import Dialog

NAME = "models"


def _cell(text: str) -> Text:
    return Text(terminal_safe(text))


class _Found(Message):
    """A hub answer for the screen: search results, a repo's files, or the error instead."""

    def __init__(self, value: list[RepoSummary] | RepoListing | HubError) -> None:
        super().__init__()
        self.value = value


class _Downloading(Message):
    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress


class _Downloaded(Message):
    def __init__(self, name: str, error: str | None) -> None:
        super().__init__()
        self.name, self.error = name, error


class ConfirmScreen(Dialog[bool]):
    BINDINGS = [Binding("y", "dismiss(True)", "Yes"), Binding("n,escape", "dismiss(False)", "No")]
    DEFAULT_CSS = """
    ConfirmScreen > Vertical { width: 60; }
    """

    def __init__(self, question: str) -> None:
        super().__init__(classes="-delete")
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content(self.question))
            yield Static(Content("y deletes · n or Esc keeps it"))


class ModelsScreen(Screen[str | None]):
    CSS_PATH = "models.tcss"
    BINDINGS = [
        Binding("escape", "back", "Back to chat"),
        Binding("l", "tab('local')", "Local", tooltip="Local models"),
        Binding("s", "tab('hub')", "Search hub", tooltip="Search the hub"),
        Binding("r", "tab('servers')", "Servers", tooltip="Model servers from the config"),
        Binding("d", "set_default", "Set default", tooltip="Make the selected local model the default"),
        Binding("delete", "remove", "Delete", tooltip="Delete the selected local model"),
        Binding("i", "import_file", "Import", tooltip="Import a .gguf file from a path"),
        Binding("c", "cancel_download", "Cancel download", tooltip="Stop the download (it resumes next time)"),
    ]

    def __init__(self, workspace: Workspace) -> None:
        super().__init__()
        self.workspace = workspace
        self.models_dir = models_dir()
        self.local: dict[str, LocalModel] = {}
        self.repo: str | None = None
        self.cancel: threading.Event | None = None

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="local"):
            with TabPane("Local", id="local"):
                yield DataTable(id="local-models", cursor_type="row", zebra_stripes=True)
                yield Input(placeholder="/path/to/model.gguf — Enter imports it, Esc cancels", id="import-path")
                yield Static(Content("Enter loads · d sets default · Delete removes · i imports a file · Esc back"),
                             classes="hint")
            with TabPane("Servers", id="servers"):
                yield DataTable(id="servers-table", cursor_type="row", zebra_stripes=True)
                yield Static(Content("Enter switches to the server (OpenAI-compatible; add one as [remotes.NAME] "
                                     "in the config) · Esc back"), classes="hint")
            with TabPane("Search hub", id="hub"):
                with Horizontal(id="search-bar"):
                    yield Input(placeholder="search GGUF models, e.g. gemma", id="query")
                    yield Select([("most downloaded", "downloads"), ("most liked", "likes")], value="downloads",
                                 allow_blank=False, id="sort")
                yield Static(id="hub-status")
                yield DataTable(id="repos", cursor_type="row", zebra_stripes=True)
                yield DataTable(id="files", cursor_type="row", zebra_stripes=True)
        with Vertical(id="download"):
            yield Static(id="download-status")
            with Horizontal():
                yield ProgressBar(id="download-bar", show_eta=False)
                yield Button("Cancel (c)", id="cancel-download", variant="error", compact=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#local-models", DataTable).add_columns("Name", "Quant", "Size", "Last used", "")
        self.query_one("#repos", DataTable).add_columns("Repository", "Downloads", "Likes")
        self.query_one("#files", DataTable).add_columns("File", "Quant", "Size", "Fits")
        servers = self.query_one("#servers-table", DataTable)
        servers.add_columns("Name", "URL", "Model")
        for name, profile in sorted(self.workspace.config.remotes.items()):
            servers.add_row(_cell(remote_spec(name)), _cell(profile.base_url),
                            _cell(profile.model or "the first listed"), key=remote_spec(name))
        if not self.workspace.config.remotes:
            servers.add_row(_cell("No servers yet: add a [remotes.NAME] table with base_url to config.toml."), "", "",
                            key="")
        self.query_one("#import-path").display = False
        self.query_one("#files").display = False
        self.query_one("#download").display = False
        if offline():
            self._hub_status(OFFLINE_MESSAGE, error=True)
            self.query_one("#query", Input).disabled = True
        else:
            self._hub_status("Type a search and press Enter.")
        self.refresh_local()
        self.query_one("#local-models").focus()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self.query_one({"local": "#local-models", "servers": "#servers-table", "hub": "#query"}[tab]).focus()

    def on_screen_resume(self) -> None:
        self.refresh_local()

    # --- local models ----------------------------------------------------------------------------

    def refresh_local(self) -> None:
        table = self.query_one("#local-models", DataTable)
        selected = self._selected_local()
        table.clear()
        self.local = {model.name: model for model in list_local(self.models_dir)}
        for model in self.local.values():
            used = "never" if model.last_used is None else _ago(model.last_used)
            mark = "default" if model.name == self.workspace.config.default_model else ""
            table.add_row(_cell(model.name), model.quant or "?", format_size(model.size), used, mark, key=model.name)
        if selected in self.local:
            table.move_cursor(row=table.get_row_index(selected))
        if not self.local:
            table.add_row(_cell(f"No models yet in {self.models_dir}: search the hub or press i to import."),
                          "", "", "", "", key="")

    def _selected_local(self) -> str | None:
        table = self.query_one("#local-models", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return key or None

    @on(DataTable.RowSelected, "#local-models")
    @on(DataTable.RowSelected, "#servers-table")
    def _load(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.dismiss(event.row_key.value)

    def action_set_default(self) -> None:
        name = self._local_action_target()
        if name is None:
            return
        try:
            self.workspace.set_default_model(name)
        except OSError as error:
            self.notify(f"cannot save the default model: {error.strerror}", severity="error", markup=False)
            return
        self.notify(f"{name} is now the default model", markup=False)
        self.refresh_local()

    def action_remove(self) -> None:
        name = self._local_action_target()
        if name is None:
            return
        model = self.local[name]
        question = f"Delete {terminal_safe(name)} ({format_size(model.size)}) from this machine?"
        if name == self.workspace.config.default_model:
            question += "\nIt is the default model: the starter model takes its place at the next launch."
        def confirmed(yes: bool | None) -> None:
            if yes:
                self._remove(name)

        self.app.push_screen(ConfirmScreen(question), confirmed)

    @work(thread=True, group="remove")
    def _remove(self, name: str) -> None:
        """Off the UI thread: the model's saved KV caches go with it, and each file's record is read."""
        try:
            removed = self.workspace.remove_model(name)
        except (HubError, OSError) as error:
            self.app.call_from_thread(self.notify, str(error), severity="error", markup=False)
            return
        self.app.call_from_thread(self._removed, removed)

    def _removed(self, removed: Removed) -> None:
        self.notify(f"Deleted {removed.model.name}", markup=False)
        if removed.was_default:
            self.notify("The starter model is the default again", markup=False)
        self.refresh_local()

    def action_import_file(self) -> None:
        if self._on_tab("local"):
            path = self.query_one("#import-path", Input)
            path.display = True
            path.focus()

    @on(Input.Submitted, "#import-path")
    def _import(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            return
        try:
            model = import_model(self.models_dir, Path(event.value.strip()))
        except HubError as error:
            self.notify(str(error), title="Not imported", severity="error", markup=False)
            return
        event.input.value = ""
        event.input.display = False
        self.notify(f"Imported {model.name}", markup=False)
        self.refresh_local()
        self.query_one("#local-models").focus()

    def _local_action_target(self) -> str | None:
        if not self._on_tab("local"):
            return None
        return self._selected_local()

    def _on_tab(self, tab: str) -> bool:
        return self.query_one(TabbedContent).active == tab and not isinstance(self.focused, Input)

    def action_back(self) -> None:
        path = self.query_one("#import-path", Input)
        if path.display:
            path.display = False
            self.query_one("#local-models").focus()
            return
        self.dismiss(None)

    # --- the hub ---------------------------------------------------------------------------------

    def _hub_status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#hub-status", Static)
        status.update(Content(terminal_safe(text)))
        status.set_class(error, "-error")

    @on(Input.Submitted, "#query")
    @on(Select.Changed, "#sort")
    def _search(self) -> None:
        query = self.query_one("#query", Input).value.strip()
        if not query or offline():
            return
        self._hub_status(f"Searching the hub for {query!r}…")
        self._ask_hub("search", query, str(self.query_one("#sort", Select).value))

    @on(DataTable.RowSelected, "#repos")
    def _open_repo(self, event: DataTable.RowSelected) -> None:
        self.repo = event.row_key.value
        self._hub_status(f"Listing the GGUF files of {self.repo}…")
        self._ask_hub("files", self.repo, "")

    @work(thread=True, group="hub", exclusive=True)
    def _ask_hub(self, kind: str, text: str, sort: str) -> None:
        from ...hub.catalog import list_gguf, search

        try:
            self.post_message(_Found(search(text, sort) if kind == "search" else list_gguf(text)))
        except HubError as error:
            self.post_message(_Found(error))

    @on(_Found)
    def _found(self, message: _Found) -> None:
        value = message.value
        if isinstance(value, HubError):
            self._hub_status(str(value), error=True)
        elif isinstance(value, list):  # a search's
            self._show_repos(value)
        else:
            self._show_files(value)

    def _show_repos(self, repos: list[RepoSummary]) -> None:
        table = self.query_one("#repos", DataTable)
        table.clear()
        for repo in repos:
            table.add_row(_cell(repo.repo), f"{repo.downloads:,}", f"{repo.likes:,}", key=repo.repo)
        self.query_one("#files").display = False
        self._hub_status(f"{len(repos)} GGUF repositories · Enter lists a repository's files" if repos
                         else "No GGUF repositories match.")
        if repos:
            table.focus()

    def _show_files(self, listing: RepoListing) -> None:
        from ...hub.machine import fit_text

        table = self.query_one("#files", DataTable)
        table.clear()
        for model in listing.models:
            name = model.name if len(model.parts) == 1 else f"{model.name} ({len(model.parts)} parts)"
            table.add_row(_cell(name), model.quant or "?", format_size(model.size), fit_text(model.size),
                          key=f"{listing.repo}:{model.name}")
        table.display = True
        table.focus()
        self._hub_status(f"{listing.repo} · Enter downloads a file · Esc back")

    @on(DataTable.RowSelected, "#files")
    def _download(self, event: DataTable.RowSelected) -> None:
        if self.cancel is not None:
            self.notify("A download is running: wait for it or cancel it (c).", timeout=4)
            return
        name = event.row_key.value
        assert name is not None, "each file's row is keyed REPO:FILE"
        self.cancel = threading.Event()
        self.query_one("#download").display = True
        self.query_one("#download-status", Static).update(Content(f"Starting {terminal_safe(name)}…"))
        self._pull(name, self.cancel)

    @work(thread=True, group="download")
    def _pull(self, name: str, cancel: threading.Event) -> None:
        from ...hub.catalog import pull

        try:
            chosen, _ = pull(name, self.models_dir, lambda progress: self.post_message(_Downloading(progress)), cancel)
        except HubError as error:
            verb = "Cancelled" if isinstance(error, Cancelled) else "Failed"
            self.post_message(_Downloaded(name, f"{verb}: {error}"))
            return
        self.post_message(_Downloaded(str(chosen), None))

    @on(_Downloading)
    def _progress(self, message: _Downloading) -> None:
        progress = message.progress
        self.query_one("#download-bar", ProgressBar).update(total=progress.total, progress=progress.done)
        line = f"{terminal_safe(progress.file)} · {progress.line()}"
        self.query_one("#download-status", Static).update(Content(line))

    @on(_Downloaded)
    def _finished(self, message: _Downloaded) -> None:
        self.cancel = None
        status = self.query_one("#download-status", Static)
        if message.error is None:
            status.update(Content(f"Downloaded {terminal_safe(message.name)} · it is in the Local tab"))
            self.query_one("#download").display = False
            self.notify(f"Downloaded {message.name}: F5 → Local → Enter loads it", markup=False)
            self.refresh_local()
        else:
            status.update(Content(terminal_safe(message.error)))
            self.notify(message.error, title="Download stopped", severity="warning", markup=False, timeout=8)

    @on(Button.Pressed, "#cancel-download")
    def action_cancel_download(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
        else:
            self.query_one("#download").display = False

    def on_unmount(self) -> None:
        """Quitting the app stops a download between two chunks; the next pull resumes it."""
        if self.cancel is not None:
            self.cancel.set()


def _ago(timestamp: float) -> str:
    import time

    seconds = max(0, time.time() - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f} {unit} ago"
    return "just now"
