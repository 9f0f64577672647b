"""The workspace's loads, run for the chat screen: a backend is opened and loaded off the UI thread, and its
events come back as batches; the model in use keeps answering until the new one is ready (the workspace
swaps it only when a load succeeds)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from textual.screen import Screen

from ...engine.base import Backend, EngineError, Error, Event, Loaded, LoadProgress, ModelInfo
from ...workspace import LoadJob, Workspace
from ..bridge import EngineBatch, forward_events


class ModelLoader:
    """`loaded` and `failed` are the screen's: what it shows when a load ends."""

    def __init__(self, screen: Screen[None], workspace: Workspace, *, status: Callable[[str], None],
                 loaded: Callable[[LoadJob, ModelInfo, Backend | None], Awaitable[None]],
                 failed: Callable[[LoadJob, str], None]) -> None:
        self.screen = screen
        self.workspace = workspace
        self.status = status
        self.loaded = loaded
        self.failed = failed

    def load(self, name: str | None, fallback: str | None = None) -> None:
        """The load starts once the screen is drawn: its imports and file checks hold the interpreter in long
        stretches, and at start-up the first frame would wait for them."""
        job = self.workspace.start_load(name, fallback)
        self._say(f"Loading {job.shown}…")
        self.screen.call_after_refresh(self.screen.run_worker, lambda: self._open_and_load(job), thread=True,
                                       group="load", exclusive=True)

    def chosen(self, name: str | None) -> None:
        """A screen's answer: the model to load, or None (or "") when none was chosen."""
        if name:
            self.load(name)

    def held(self, shown: str) -> None:
        """A message waits for the model being loaded: the status says so."""
        self._say(f"Loading {shown}…")

    def _say(self, line: str) -> None:
        waiting = self.workspace.queued is not None
        self.status(line + (" · your message is sent as soon as it is ready" if waiting else ""))

    def _open_and_load(self, job: LoadJob) -> None:
        try:
            backend = self.workspace.open(job)
        except EngineError as error:
            self.screen.post_message(EngineBatch(job, [Error(str(error))]))
            return
        forward_events(backend.load(), self.screen, job)

    async def take(self, job: LoadJob, batch: list[Event]) -> None:
        for event in batch:
            if isinstance(event, LoadProgress):
                self._say(f"Loading {job.shown}… {event.stage or f'{event.fraction:.0%}'}")
            elif isinstance(event, Loaded):
                replaced = self.workspace.loaded(job, event.info)
                await self.loaded(job, event.info, replaced)
                if replaced is not None:
                    self.close(replaced)
            elif isinstance(event, Error):
                self.workspace.failed(job)
                if job.backend is not None:
                    self.close(job.backend)
                self.failed(job, event.message)

    def close(self, backend: Backend) -> None:
        """Closing waits for the worker thread to end a reply in flight: never on the UI thread."""
        self.screen.run_worker(backend.close, thread=True, group="close")
