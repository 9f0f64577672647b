"""Models: opening another (Ctrl+O), the models screen (F5), and what the chat shows as a load ends."""

from __future__ import annotations

import contextlib

from ...engine.base import Backend, EngineDeath, ModelInfo, WatchesItsDeath
from ...replies import Ask
from ...wording import engine_died_in_chat
from ...workspace import LoadJob
from ..panel.metrics import MetricsPanel
from ..panel.sampling import SamplingPanel
from .room import Room


class ModelsRoom(Room):
    def action_pick_model(self, where: str) -> None:
        """Ctrl+O: a name, path or server, with the context size and GPU layers (saved as the defaults); F5:
        the models screen, one for the whole session, so a download keeps going while the user chats."""
        if where == "open":
            from ..screens.open_model import OpenModelScreen, server_names

            remotes = server_names(self.workspace.config.remotes)
            self.app.push_screen(OpenModelScreen(self.workspace, remotes, self.session.model), self.loader.chosen)
            return
        from ..screens.models import NAME, ModelsScreen

        if not self.app.is_screen_installed(NAME):
            self.app.install_screen(ModelsScreen(self.workspace), NAME)
        self.app.push_screen(NAME, self.loader.chosen)

    async def model_loaded(self, job: LoadJob, info: ModelInfo, replaced: Backend | None) -> None:
        if replaced is not None:
            self.session.stop()  # the reply ends as stopped when the old backend closes
        self.query_one(MetricsPanel).show_model(info)
        self.query_one(SamplingPanel).show_backend(info, self.workspace.backend)
        watched: object = self.workspace.backend  # an engine process's (a test's own backend has no process)
        if isinstance(watched, WatchesItsDeath):
            watched.on_idle_death = self._engine_died
        self.view.set_status("")
        self.show_title()
        self.view.recount_draft()
        self.view.show_legend()
        if job.note:
            self.notify(job.note, title="Default model", severity="warning", timeout=10, markup=False)
        if self.workspace.loading is None and (held := self.workspace.release()) is not None:
            await self.start(Ask(held))  # a held message goes once no load is to come, to the model now in use

    def _engine_died(self, death: EngineDeath) -> None:
        """The engine process died between replies (on the link's thread): said now, not at the next message."""
        line = engine_died_in_chat(death)
        with contextlib.suppress(RuntimeError):  # the app is closing
            self.app.call_from_thread(self.notify, f"{line[:1].upper()}{line[1:]}.", title="Engine stopped",
                                      severity="warning", timeout=10, markup=False)

    def model_failed(self, job: LoadJob, message: str) -> None:
        """A failed load leaves the model in use answering, and a message that waited for it back in the box (in
        front of what was typed since): only with no model at all is the failure the status."""
        self.notify(message, title="Model not loaded", severity="error", timeout=8, markup=False)
        if self.workspace.loading is None and (held := self.workspace.release()) is not None:
            self.view.prompt.put_back(held)
        if self.workspace.backend is not None:
            self.view.set_status("")
            return
        self.view.set_status(f"Model not loaded: {message}  (Ctrl+O opens another)", error=True)
        self.query_one(MetricsPanel).show_model(None, "No model loaded")
