"""The engine process (`python -m tui_chat.engine.host FD LOG`): one backend, driven over a socket by the app.

`process.py` is the app's side and says what crosses. Here the backend is built by the first message's
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
import pickle
import signal
import sys
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..guard import entry_line
from .base import Backend, Done, EngineError, Error, Event, Loaded, Request, Stream
from .params import LiveParams
from .process import HEARTBEAT_S, lives_in

BATCH_INTERVAL_S = 0.015
JOBS = frozenset({"load", "generate", "generate_together", "compare", "xray", "word_probability"})
CALLS = frozenset({"count_tokens", "tokenize", "check_format"})


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
            kind = message[0]
            if kind == "job":
                self._start(*message[1:])
            elif kind == "call":
                threading.Thread(target=self._call, args=message[1:], daemon=True).start()
            elif kind == "cancel":
                self._cancel(message[1])
            elif kind == "params":
                mirror = self.mirrors.get(message[1])
                if mirror is not None:
                    mirror.follow(message[2], message[3])
            elif kind == "close":
                self.backend.close()
                return

    def _beat(self) -> None:
        """A word every HEARTBEAT_S from a thread of its own (llama.cpp's calls leave the interpreter free), so the
        app's watchdog hears a live process however long a read or a load takes."""
        while True:
            time.sleep(HEARTBEAT_S)
            with contextlib.suppress(OSError):
                self.send(("alive",))

    def send(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            try:
                self.connection.send(message)
            except (pickle.PicklingError, TypeError, AttributeError) as error:  # a bug: said, not a hang
                self.connection.send(("events", message[1], [Error(f"internal error (the engine's answer could "
                                                                   f"not be sent: {error})")]))

    def _start(self, key: int, method: str, args: tuple[Any, ...], reload: bool) -> None:
        assert method in JOBS, method
        for live in lives_in(args):
            self.mirrors[live.key] = live
        threading.Thread(target=self._job, args=(key, method, args, reload), name=f"job-{key}", daemon=True).start()

    def _job(self, key: int, method: str, args: tuple[Any, ...], reload: bool) -> None:
        reload_s = 0.0
        try:
            if reload:
                started = time.perf_counter()
                if not self._reloaded(key):
                    return
                reload_s = _restart_clocks(args, started)
            try:
                stream: Stream = getattr(self.backend, method)(*args)
            except Exception as error:  # noqa: BLE001 - a job that never started still ends, in one line
                self.send(("events", key, [Error(f"internal error ({type(error).__name__}: {error})")]))
                return
            with self.lock:
                self.streams[key] = stream
                if key in self.cancelled:
                    stream.cancel()
            while True:
                events = stream.drain(timeout=None)
                if events:
                    self.send(("events", key, _with_reload(events, reload_s) if reload_s else events))
                if stream.finished:
                    return
                time.sleep(BATCH_INTERVAL_S)
        finally:
            with self.lock:
                self.streams.pop(key, None)
                self.cancelled.discard(key)
            for live in lives_in(args):  # a later job may mirror the same settings already: only ours goes
                if self.mirrors.get(live.key) is live:
                    del self.mirrors[live.key]

    def _reloaded(self, key: int) -> bool:
        """The model loaded again in this new process before the job that found the old one dead."""
        final = self.backend.load().result()
        if isinstance(final, Loaded):
            self.send(("loaded", final.info))
            return True
        self.send(("events", key, [final if isinstance(final, Error) else Error(f"the model did not load ({final})")]))
        return False

    def _cancel(self, key: int) -> None:
        with self.lock:
            stream = self.streams.get(key)
            if stream is None:
                self.cancelled.add(key)
        if stream is not None:
            stream.cancel()

    def _call(self, key: int, method: str, args: tuple[Any, ...]) -> None:
        assert method in CALLS, method
        try:
            value = getattr(self.backend, method)(*args)
        except Exception as error:  # noqa: BLE001 - goes back to the caller, who raises it there
            self.send(("reply", key, False, error if _picklable(error) else EngineError(str(error))))
            return
        self.send(("reply", key, True, value))


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


def _picklable(error: Exception) -> bool:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure means: send its text instead
        return False
    return True


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
    kind, make = connection.recv()
    assert kind == "make", kind
    Host(connection, make()).serve()


if __name__ == "__main__":
    main(sys.argv)
