"""Loading models for the chat screen: a backend is opened and loaded off the UI thread, and the
model in use keeps answering until the new one is ready (a failed load leaves it in place)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from textual.screen import Screen

from ...engine.base import Backend, EngineError, Error, Event, LoadProgress, Loaded, ModelInfo
from ..bridge import EngineBatch, forward_events

OpenBackend = Callable[[str | None], Backend]  # a BackendOpener, or a test's own


@dataclass(eq=False)
class LoadJob:
    """One load; the bridge's batches say which job their events belong to."""

    name: str | None
    fallback: str | None = None  # opened instead when `name` cannot be opened (the starter, for a lost default)
    backend: Backend | None = None
    note: str = ""  # what the user should know about this load (a fallback taken)

    @property
    def shown(self) -> str:
        return self.name or "the default model"


class ModelLoader:
    """`loaded` and `failed` are the screen's: what it shows when a load ends."""

    def __init__(self, screen: Screen, open_backend: OpenBackend, *, status: Callable[[str], None],
                 loaded: Callable[[LoadJob, ModelInfo], Awaitable[None]],
                 failed: Callable[[LoadJob, str], None]) -> None:
        self.screen = screen
        self.open_backend = open_backend
        self.status = status
        self.loaded = loaded
        self.failed = failed
        self.loading: LoadJob | None = None
        self.queued: str | None = None  # a message sent before the model was ready: sent when it is

    def load(self, name: str | None, fallback: str | None = None) -> None:
        """The load starts once the screen is drawn: its imports and file checks hold the interpreter in long
        stretches, and at start-up the first frame would wait for them."""
        job = self.loading = LoadJob(name, fallback)
        self._say(f"Loading {job.shown}…")
        self.screen.call_after_refresh(self.screen.run_worker, lambda: self._open_and_load(job), thread=True,
                                       group="load", exclusive=True)

    def hold(self, text: str) -> bool:
        """Keep a message for the model being loaded; False when none is on its way or one is already held."""
        if self.loading is None or self.queued is not None:
            return False
        self.queued = text
        self._say(f"Loading {self.loading.shown}…")
        return True

    def release(self) -> str | None:
        text, self.queued = self.queued, None
        return text

    def _say(self, line: str) -> None:
        self.status(line + (" · your message is sent as soon as it is ready" if self.queued is not None else ""))

    def _open_and_load(self, job: LoadJob) -> None:
        try:
            job.backend = self._open(job)
        except EngineError as error:
            self.screen.post_message(EngineBatch(job, [Error(str(error))]))
            return
        forward_events(job.backend.load(), self.screen, job)

    def _open(self, job: LoadJob) -> Backend:
        try:
            return self.open_backend(job.name)
        except EngineError as error:
            if job.fallback is None:
                raise
            job.note = f"The default model did not open ({error}): the starter model opens instead."
            job.name = job.fallback
            return self.open_backend(job.fallback)

    async def take(self, job: LoadJob, batch: list[Event]) -> None:
        for event in batch:
            if isinstance(event, LoadProgress):
                self._say(f"Loading {job.shown}… {event.stage or f'{event.fraction:.0%}'}")
            elif isinstance(event, Loaded):
                self._ended(job)
                await self.loaded(job, event.info)
            elif isinstance(event, Error):
                self._ended(job)
                if job.backend is not None:
                    self.close(job.backend)
                self.failed(job, event.message)

    def _ended(self, job: LoadJob) -> None:
        if self.loading is job:
            self.loading = None

    def close(self, backend: Backend) -> None:
        """Closing waits for the worker thread to end a reply in flight: never on the UI thread."""
        self.screen.run_worker(backend.close, thread=True, group="close")
