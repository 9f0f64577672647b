"""The engine process (`python -m tui_chat.engine.host FD LOG`): one backend, driven over a socket by the app.

`link.py` says what crosses and `process.py` is the app's side. Here the backend is built by the first message's
callable and runs as it would in the app (its own worker thread); each job's events go back in batches, at most
one a job every `BATCH_INTERVAL_S`, so a token costs this process a queue put and the app nothing until its
batch. Anything this process or llama.cpp prints goes to the log (its file descriptors 1 and 2), never to the
terminal the app draws on; a fatal signal leaves Python's stack there for the app's one line. When the app goes
away (the socket closes) this process ends at once, whatever llama.cpp is doing.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..guard import entry_line
from .base import Backend, Done, EngineError, Error, Event, Loaded, Request, Stream
from .link import (
    CAPABILITIES,
    HEARTBEAT_S,
    LINK_VERSION,
    Alive,
    Answer,
    Call,
    Cancel,
    Close,
    Events,
    FollowParams,
    Hello,
    Kind,
    ModelLoaded,
    Open,
    Refused,
    StartJob,
    lives_in,
    sendable_error,
    unsendable,
)
from .params import LiveParams

BATCH_INTERVAL_S = 0.015


class Host:
    def __init__(self, connection: Connection, backend: Backend) -> None:
        self.connection = connection
        self.backend = backend
        self.lock = threading.Lock()  # the socket's writes and the tables below
        self.streams: dict[int, Stream] = {}
        self.cancelled: set[int] = set()  # jobs cancelled before their stream existed (a reload in hand)
        self.mirrors: dict[int, LiveParams] = {}

    def serve(self) -> None:
        """Until the app says close, or goes away."""
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                os._exit(0)  # the app is gone: nothing here is worth finishing
            match message:
                case StartJob():
                    self._start(message)
                case Call():
                    threading.Thread(target=self._call, args=(message,), daemon=True).start()
                case Cancel(key):
                    self._cancel(key)
                case FollowParams(live, version, params):
                    mirror = self.mirrors.get(live)
                    if mirror is not None:
                        mirror.follow(version, params)
                case Close():
                    self.backend.close()
                    return

    def _beat(self) -> None:
        """A word every HEARTBEAT_S from a thread of its own (llama.cpp's calls leave the interpreter free), so the
        app's watchdog hears a live process however long a read or a load takes."""
        while True:
            time.sleep(HEARTBEAT_S)
            with contextlib.suppress(OSError):
                self.send(Alive())

    def send(self, message: object) -> None:
        with self.lock:
            try:
                self.connection.send(message)
            except Exception as error:  # noqa: BLE001 - could not be pickled (a bug): said on its key, not a hang
                instead = unsendable(message, error)
                if instead is not None:
                    self.connection.send(instead)

    def _start(self, job: StartJob) -> None:
        if _kind(job.method) is not Kind.JOB:
            self.send(Events(job.key, [Error(f"internal error (no such engine job: {job.method})")]))
            return
        for live in lives_in(job.args):
            self.mirrors[live.key] = live
        threading.Thread(target=self._job, args=(job,), name=f"job-{job.key}", daemon=True).start()

    def _job(self, job: StartJob) -> None:
        key, reload_s = job.key, 0.0
        try:
            if job.reload:
                started = time.perf_counter()
                if not self._reloaded(key):
                    return
                reload_s = _restart_clocks(job.args, started)
            try:
                stream: Stream = getattr(self.backend, job.method)(*job.args)
            except Exception as error:  # noqa: BLE001 - a job that never started still ends, in one line
                self.send(Events(key, [Error(f"internal error ({type(error).__name__}: {error})")]))
                return
            with self.lock:
                self.streams[key] = stream
                if key in self.cancelled:
                    stream.cancel()
            while True:
                events = stream.drain(timeout=None)
                if events:
                    self.send(Events(key, _with_reload(events, reload_s) if reload_s else events))
                if stream.finished:
                    return
                stream.cancelled.wait(BATCH_INTERVAL_S)  # a stop's last events go at once: Esc waits on them
        finally:
            with self.lock:
                self.streams.pop(key, None)
                self.cancelled.discard(key)
            for live in lives_in(job.args):  # a later job may mirror the same settings already: only ours goes
                if self.mirrors.get(live.key) is live:
                    del self.mirrors[live.key]

    def _reloaded(self, key: int) -> bool:
        """The model loaded again in this new process before the job that found the old one dead."""
        final = self.backend.load().result()
        if isinstance(final, Loaded):
            self.send(ModelLoaded(final.info))
            return True
        self.send(Events(key, [final if isinstance(final, Error) else Error(f"the model did not load ({final})")]))
        return False

    def _cancel(self, key: int) -> None:
        with self.lock:
            stream = self.streams.get(key)
            if stream is None:
                self.cancelled.add(key)
        if stream is not None:
            stream.cancel()

    def _call(self, call: Call) -> None:
        if _kind(call.method) is not Kind.CALL:
            self.send(Answer(call.key, False, EngineError(f"internal error (no such engine call: {call.method})")))
            return
        try:
            value = getattr(self.backend, call.method)(*call.args)
        except Exception as error:  # noqa: BLE001 - goes back to the caller, who raises it there
            self.send(Answer(call.key, False, sendable_error(error)))
            return
        self.send(Answer(call.key, True, value))


def _kind(method: str) -> Kind | None:
    capability = CAPABILITIES.get(method)
    return capability.kind if capability is not None else None


def _restart_clocks(args: tuple[Any, ...], loaded_from: float) -> float:
    """After a reload, a reply's time to its first token counts from the model being there again, as the first
    reply after a launch does (its message waits for the load); the reload is said apart. Its length."""
    now = time.perf_counter()
    for arg in args:
        if isinstance(arg, Request):
            arg.submitted_at = max(arg.submitted_at, now)
    return now - loaded_from


def _with_reload(events: list[Event], reload_s: float) -> list[Event]:
    return [replace(event, metrics=replace(event.metrics, reload_s=reload_s)) if isinstance(event, Done) else event
            for event in events]


def _to_the_log(log: Path) -> None:
    """File descriptors 1 and 2 (llama.cpp's prints, Python's at a crash) into the shared log, under a line naming
    this process; the terminal is the app's."""
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(handle, entry_line(os.getpid(), "started").encode())
    os.dup2(handle, 1)
    os.dup2(handle, 2)
    os.close(handle)
    sys.stdout = sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def main(argv: list[str]) -> None:
    connection = Connection(int(argv[1]))
    _to_the_log(Path(argv[2]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the app's keys are the app's; it closes this process itself
    connection.send(Hello(LINK_VERSION))
    make = _opened(connection)
    if make is not None:
        Host(connection, make()).serve()


def _opened(connection: Connection) -> Callable[[], Backend] | None:
    """The app's first message, checked: its version must be this process's (both ends run one install)."""
    try:
        message = connection.recv()
    except (EOFError, OSError):
        return None
    except Exception as error:  # noqa: BLE001 - written by another version of the app
        connection.send(Refused(f"its first message could not be read ({type(error).__name__}: {error})"))
        return None
    if not isinstance(message, Open) or message.version != LINK_VERSION:
        version = message.version if isinstance(message, Open) else "unknown"
        connection.send(Refused(f"the app speaks version {version} of the engine link, this engine {LINK_VERSION}"))
        return None
    return message.make


if __name__ == "__main__":
    main(sys.argv)
