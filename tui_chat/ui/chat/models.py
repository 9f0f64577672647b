"""Models: opening another (Ctrl+O), the models screen (F5), and what the chat shows as a load ends."""

from __future__ import annotations

import contextlib

from ...engine.base import Backend, EngineDeath, ModelInfo, WatchesItsDeath
from ...replies import Ask
from ...wording import engine_died_in_chat
from ...workspace import LoadJob
from .room import Room


class ModelsRoom(Room):
    def action_pick_model(self, where: str) -> None:
        """Ctrl+O: a name, path or server, with the context size and GPU layers (saved as the defaults); F5:
        the models screen, one for the whole session, so a download keeps going while the user chats."""
        app, workspace = self.chat.app, self.chat.workspace
        if where == "open":
            from ..screens.open_model import OpenModelScreen, server_names

            remotes = server_names(workspace.config.remotes)
            app.push_screen(OpenModelScreen(workspace, remotes, self.chat.session.model), self.chat.loader.chosen)
            return
        from ..screens.models import NAME, ModelsScreen

        if not app.is_screen_installed(NAME):
            app.install_screen(ModelsScreen(workspace), NAME)
        app.push_screen(NAME, self.chat.loader.chosen)

    async def loaded(self, job: LoadJob, info: ModelInfo, replaced: Backend | None) -> None:
        """The loader's word that a load ended well (before the model it replaced closes)."""
        chat = self.chat
        if replaced is not None:
            chat.session.stop()  # the reply ends as stopped when the old backend closes
        chat.panels.metrics.show_model(info)
        chat.panels.sampling.show_backend(info, chat.workspace.backend)
        watched: object = chat.workspace.backend  # an engine process's (a test's own backend has no process)
        if isinstance(watched, WatchesItsDeath):
            watched.on_idle_death = self._engine_died
        chat.view.set_status("")
        chat.panels.show_title()
        chat.view.recount_draft()
        chat.view.show_legend()
        if job.note:
            chat.notify(job.note, title="Default model", severity="warning", timeout=10, markup=False)
        if chat.workspace.loading is None and (held := chat.workspace.release()) is not None:
            await chat.start(Ask(held))  # a held message goes once no load is to come, to the model now in use

    def _engine_died(self, death: EngineDeath) -> None:
        """The engine process died between replies (on the link's thread): said now, not at the next message."""
        line = engine_died_in_chat(death)
        with contextlib.suppress(RuntimeError):  # the app is closing
            self.chat.app.call_from_thread(self.chat.notify, f"{line[:1].upper()}{line[1:]}.", title="Engine stopped",
                                           severity="warning", timeout=10, markup=False)

    def failed(self, job: LoadJob, message: str) -> None:
        """A failed load leaves the model in use answering, and a message that waited for it back in the box (in
        front of what was typed since): only with no model at all is the failure the status."""
        chat = self.chat
        chat.notify(message, title="Model not loaded", severity="error", timeout=8, markup=False)
        if chat.workspace.loading is None and (held := chat.workspace.release()) is not None:
            chat.view.prompt.put_back(held)
        if chat.workspace.backend is not None:
            chat.view.set_status("")
            return
        chat.view.set_status(f"Model not loaded: {message}  (Ctrl+O opens another)", error=True)
        chat.panels.metrics.show_model(None, "No model loaded")
