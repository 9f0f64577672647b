"""The one thread that touches the model: llama.cpp's context is used by one thread at a time, so every job that
reads or writes it (a load, a reply, the lab, the serving slots' loop) runs here, in order."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable

from ..base import EngineError, Error, Event, Stream
from . import logs


class Worker:
    """Jobs in order, each ending its stream; and short jobs (an X-ray, a word's probability) that a reply being
    written runs between two tokens (`run_quick`) instead of after its last one."""

    def __init__(self, on_exit: Callable[[], None]) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._quick: deque[Callable[[], None]] = deque()
        self._on_exit = on_exit
        self._thread = threading.Thread(target=self._run, name="llama-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[Stream], None]) -> Stream:
        """`job` on the worker, with the stream it writes its events to."""
        stream = Stream()
        self._jobs.put(lambda: guarded(stream, lambda: job(stream)))
        return stream

    def submit_quick(self, compute: Callable[[], Event]) -> Stream:
        """`compute`'s one event, between two tokens of a reply being written, or at once when the worker is idle;
        an `EngineError` is its `Error`."""
        stream = Stream()

        def job() -> None:
            try:
                stream.put(compute())
            except EngineError as error:
                stream.put(Error(str(error)))

        self._quick.append(lambda: guarded(stream, job))
        self._jobs.put(self.run_quick)  # wakes an idle worker; a reply being written gets there first
        return stream

    def post(self, job: Callable[[], None]) -> None:
        """A job that answers for its own streams (the slot loop: several at once)."""
        self._jobs.put(job)

    @property
    def quick_waiting(self) -> bool:
        return bool(self._quick)

    def run_quick(self) -> None:
        while self._quick:
            self._quick.popleft()()

    def close(self) -> None:
        """After the jobs already given; then `on_exit`, still on the worker."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()
        self._on_exit()


def guarded(stream: Stream, job: Callable[[], None]) -> None:
    """A bug in a job must end its stream with an error, not the worker thread (the UI would wait forever); the
    traceback goes to the log file, the user gets one line."""
    try:
        job()
    except Exception as error:  # noqa: BLE001 - the thread boundary: nothing may escape
        logs.record_exception(error)
        stream.put(Error(f"internal error ({type(error).__name__}: {error}); details in the log"))
