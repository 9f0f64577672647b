"""Models: opening another (Ctrl+O), the models screen (F5), and what the chat shows as a load ends."""

from __future__ import annotations

from ...engine.base import Backend, ModelInfo
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
        self.view.set_status("")
        self.show_title()
        self.view.recount_draft()
        self.view.show_legend()
        if job.note:
            self.notify(job.note, title="Default model", severity="warning", timeout=10, markup=False)
        backend = self.workspace.backend  # the job's, now in use; a held message goes once no load is to come
        if self.workspace.loading is None and backend is not None and (held := self.workspace.release()) is not None:
            await self.started(self.session.ask(held, backend.generate))

    def model_failed(self, job: LoadJob, message: str) -> None:
        """A failed load leaves the model in use answering, and a message that waited for it back in the box:
        only with no model at all is the failure the status."""
        self.notify(message, title="Model not loaded", severity="error", timeout=8, markup=False)
        if self.workspace.loading is None and (held := self.workspace.release()) is not None:
            self.view.prompt.set_draft(held)
        if self.workspace.backend is not None:
            self.view.set_status("")
            return
        self.view.set_status(f"Model not loaded: {message}  (Ctrl+O opens another)", error=True)
        self.query_one(MetricsPanel).show_model(None, "No model loaded")
