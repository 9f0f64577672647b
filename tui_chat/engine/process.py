"""The engine in a process of its own, as the app sees it: a `Backend` whose model lives in another process.

Every local runner worth using keeps the model out of the UI's process (LM Studio's runtime, Ollama's runner):
there, llama.cpp's threads and the UI's never wait for one interpreter lock, and a crash inside llama.cpp (an
abort, a segfault in a CPU kernel, out of GPU memory, kill -9) ends that process, not the app. This module is
the app's side; `host.py` is the engine process's; `link.py` names what crosses between them (typed messages, a
version each side checks, the table of jobs and calls the proxy methods below are declared from). A batch of
events from the engine stays one item until the screen's bridge drains it.

Nothing here imports llama.cpp: the backend is built over there by `make`, a picklable callable. When the engine
process dies, each job still open ends with one `Error` line saying what died and where its log is (the session
keeps what the reply wrote so far), and the next job starts a new process that loads the model again first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, TimeoutError as CallTimeout
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..guard import LOG_NAME, crash_parts, own_part, read_tail
from .base import (
    FINAL_EVENTS,
    Backend,
    Comparing,
    Embedding,
    EngineDeath,
    EngineDied,
    EngineError,
    Error,
    Event,
    FormatChecking,
    Loaded,
    LoadProgress,
    ModelInfo,
    Recomputing,
    Serving,
    Stream,
)
from .link import (
    CALL_TIMEOUT_S,
    HEARTBEAT_S,
    LINK_VERSION,
    UI_PROCESS_ENV,
    Alive,
    Answer,
    Call,
    Cancel,
    Capability,
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
    remote,
)
from .params import LiveParams

MakeBackend = Callable[[], Backend]  # picklable (a module-level function or a partial of one): run over there
CLOSE_TIMEOUT_S = 10.0  # a closing engine finishes the job in hand first (a stopped reply ends within a token)
SILENCE_LIMIT_S = 15.0  # this long without a word while a job is open: stopped (kill -STOP) or hung, so it is ended
STOP_GRACE_S = 1.0  # a stopped job the engine has not ended by then ends here, with what it wrote


class _Job(Stream):
    """A job's events on the app's side, as they come from the engine process; cancelling it cancels it there."""

    def __init__(self, link: _Link, key: int, lives: Sequence[LiveParams]) -> None:
        super().__init__()
        self.link, self.key, self.lives = link, key, lives

    def cancel(self) -> None:
        """Stops it there; if the engine does not end it soon (stopped, or deep in a long read), it ends here: Esc
        never waits for the engine's help."""
        super().cancel()
        self.link.send(Cancel(self.key))
        timer = threading.Timer(STOP_GRACE_S, self.link.end, (self, Error(
            f"stopped here: the engine did not end the reply within {STOP_GRACE_S:g} s of the stop")))
        timer.daemon = True
        timer.start()


class _Link:
    """One engine process and the socket to it: the jobs and calls in flight, and the thread that reads."""

    def __init__(self, make: MakeBackend, log_dir: Path, on_loaded: Callable[[ModelInfo], None],
                 on_death: Callable[[EngineDeath], None]) -> None:
        self.log = log_dir / LOG_NAME
        self.on_loaded, self.on_death = on_loaded, on_death
        self.jobs: dict[int, _Job] = {}
        self.calls: dict[int, Future[Any]] = {}
        self.keys = itertools.count(1)
        self.lock = threading.Lock()  # the socket's writes, and the tables above
        self.death: EngineDeath | None = None  # how the process ended, once it has
        self.closing = False
        self.heard = time.monotonic()  # the last word from the engine process: the watchdog's clock
        self.silenced = False  # the watchdog ended it
        self.refused = ""  # the engine process would not open (another version of the app installed meanwhile)
        ours, theirs = socket.socketpair()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tui_chat.engine.host", str(theirs.fileno()), str(self.log)],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,
            env=os.environ | {UI_PROCESS_ENV: str(os.getpid())})  # its thread governor counts the UI as load
        theirs.close()
        self.connection = Connection(ours.detach())
        self.send(Open(LINK_VERSION, make))
        threading.Thread(target=self._read, name="engine-link", daemon=True).start()
        threading.Thread(target=self._watch, name="engine-watchdog", daemon=True).start()

    def send(self, message: object) -> None:
        with self.lock:
            if self.death is None:
                with contextlib.suppress(OSError):  # a dead process: the reader says so to every job
                    self.connection.send(message)

    def job(self, method: str, args: tuple[Any, ...], reload: str = "") -> Stream:
        """`reload`: the model loads again first in this new process, after the last one ended so (a status line)."""
        lives = lives_in(args)
        with self.lock:
            key = next(self.keys)
            job = self.jobs[key] = _Job(self, key, lives)
        if reload:
            job.put(LoadProgress(0.0, f"Loading the model again: {reload}…"))
        for live in lives:  # before the request leaves: a change made meanwhile is sent after it, never lost
            live.watch(self._changed)
        try:
            self.send(StartJob(key, method, args, bool(reload)))
        except Exception as error:  # noqa: BLE001 - could not be pickled:  # a bug: one line, not a traceback
            self.end(job, Error(f"internal error (the request could not be sent to the engine: {error})"))
        if self.death is not None:
            self.end(job, died(self.death))
        return job

    def call(self, method: str, *args: Any) -> Any:
        future: Future[Any] = Future()
        with self.lock:
            key = next(self.keys)
            self.calls[key] = future
        self.send(Call(key, method, args))
        if self.death is not None:
            raise EngineDied(self.death)
        try:
            return future.result(CALL_TIMEOUT_S)
        except CallTimeout:
            with self.lock:
                self.calls.pop(key, None)
            raise EngineError(f"the engine did not answer {method} within {CALL_TIMEOUT_S:g} s") from None

    def close(self) -> None:
        self.closing = True
        self.send(Close())
        try:
            self.process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.connection.close()

    def _changed(self, live: LiveParams) -> None:
        version, params = live.snapshot()
        self.send(FollowParams(live.key, version, params))

    def _watch(self) -> None:
        """The engine process beats every HEARTBEAT_S; silent for SILENCE_LIMIT_S with work open, it is stopped or
        hung, and nothing it holds will come: it is ended, its jobs told why, and the next one starts it anew."""
        while self.death is None and not self.closing:
            time.sleep(HEARTBEAT_S)
            waiting = bool(self.jobs or self.calls)
            if waiting and time.monotonic() - self.heard > SILENCE_LIMIT_S and self.death is None:
                self.silenced = True
                with contextlib.suppress(OSError):
                    self.process.kill()
                return

    def _read(self) -> None:
        if self._greeted():
            while True:
                try:
                    message = self.connection.recv()
                except (EOFError, OSError):
                    break
                self.heard = time.monotonic()
                self._take(message)
        self._died()

    def _greeted(self) -> bool:
        """The engine process's first words: its version, checked against this app's."""
        try:
            message = self.connection.recv()
        except (EOFError, OSError):
            return False
        if isinstance(message, Hello) and message.version == LINK_VERSION:
            self.heard = time.monotonic()
            return True
        self.refused = (message.reason if isinstance(message, Refused) else
                        f"it speaks version {getattr(message, 'version', 'unknown')} of the engine link, "
                        f"this app {LINK_VERSION}")
        with contextlib.suppress(OSError):
            self.process.kill()
        return False

    def _take(self, message: object) -> None:
        match message:
            case Events(key, events):
                self._events(key, events)
            case Answer(key, ok, value):
                with self.lock:
                    future = self.calls.pop(key, None)
                if future is None:  # timed out meanwhile
                    return
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            case ModelLoaded(info):
                self.on_loaded(info)
            case Refused(reason):
                self.refused = reason
            case Alive():
                pass

    def _events(self, key: int, events: list[Event]) -> None:
        job = self.jobs.get(key)
        if job is None:
            return
        for event in events:
            if isinstance(event, Loaded):
                self.on_loaded(event.info)
        job.put_batch(events)
        if any(isinstance(event, FINAL_EVENTS) for event in events):
            self._forget(job)

    def _forget(self, job: _Job) -> bool:
        """Whether the job was still open (each ends once)."""
        with self.lock:
            open_ = self.jobs.pop(job.key, None) is not None
        for live in job.lives:
            live.unwatch(self._changed)
        return open_

    def end(self, job: _Job, error: Error) -> None:
        """Ends `job` with `error` unless it has ended already."""
        if self._forget(job):
            job.put(error)

    def _died(self) -> None:
        """The socket closed: the process ended (or is ending). Every job and call still open is told how."""
        try:
            code = self.process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # it closed the socket and hangs: it is of no more use
            self.process.kill()
            code = self.process.wait()
        with self.lock:
            self.death = death = self._death(code)
            jobs, calls = list(self.jobs.values()), list(self.calls.values())
            self.calls.clear()
        for job in jobs:
            self.end(job, died(death))
        for future in calls:
            future.set_exception(EngineDied(death))
        if not (jobs or calls or self.closing):
            self.on_death(self.death)  # between replies: said when it happens, not at the next message


    def _death(self, code: int) -> EngineDeath:
        """What ended the process with exit status `code`, and its log where it wrote there (not when killed)."""
        if self.closing:
            return EngineDeath("the engine was closed")
        if self.refused:
            return EngineDeath(refused(self.refused))
        cause = silenced() if self.silenced else death_cause(code, self.process.pid, self.log)
        return EngineDeath(cause, "" if code == -signal.SIGKILL else str(self.log))  # killed: it wrote nothing


def died(death: EngineDeath) -> Error:
    """A job's end when its engine process died: the cause as its message, the facts for its front-end."""
    return Error(death.cause, died=death)


def silenced() -> str:
    """Why the watchdog ended the engine process."""
    return (f"the engine process stopped answering (not a word for {SILENCE_LIMIT_S:g} s: stopped or hung), "
            "so it was ended")


def refused(reason: str) -> str:
    """Why the engine process would not open: another install of tui-chat than the running app's."""
    return f"the engine process would not start: {reason}; restart tui-chat after an upgrade"


def death_cause(code: int, pid: int, log: Path) -> str:
    """What ended the engine process (its exit status or signal), what it was doing, llama.cpp's last words."""
    if code >= 0:
        return f"the engine process exited unexpectedly (status {code})"
    number = -code
    if number == signal.SIGKILL:
        return "the engine process was killed (SIGKILL: out of memory, or kill -9)"
    who, what, where, said = crash_parts(number, own_part(read_tail(log), pid), engine=True)
    inside = " (llama.cpp)" if who == "llama.cpp" else ""
    doing = f" {where}" if where else ""
    said = f": {said}" if said else ""
    return f"the engine process{inside} crashed with {what}{doing}{said}"


class EngineProcess:
    """A backend in its own process (the remote servers' client, or the base of the local one below)."""

    def __init__(self, make: MakeBackend, log_dir: Path) -> None:
        self.make = make
        self.log_dir = log_dir
        self.info: ModelInfo | None = None
        self.on_idle_death: Callable[[EngineDeath], None] | None = None  # told on the link's thread (a screen's toast)
        self._link: _Link | None = None
        self._start = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The engine process's, while it runs (tests stop it; `info` names it)."""
        link = self._link
        return link.process.pid if link is not None and link.death is None else None

    load = remote(Backend.load)
    generate = remote(Backend.generate)
    count_tokens = remote(Backend.count_tokens)
    compare = remote(Comparing.compare)

    def close(self) -> None:
        with self._start:
            link, self._link = self._link, None
        if link is not None and link.death is None:
            link.close()

    def _remote(self, capability: Capability, *args: Any) -> Any:
        """A method of the table run over there: a job on a live process (started anew if it died), or a call."""
        if capability.kind is Kind.CALL:
            return self._live_link().call(capability.name, *args)
        with self._start:
            link = self._link
            reload = ""  # a process died: the new one loads its model again first
            if link is None or link.death is not None:
                if capability.name != "load":
                    reload = link.death.cause if link is not None and link.death else "its engine was closed"
                link = self._link = _Link(self.make, self.log_dir, self._loaded, self._died_idle)
        return link.job(capability.name, args, reload)

    def _live_link(self) -> _Link:
        link = self._link
        if link is None:
            raise EngineError("no model is loaded")
        if link.death is not None:
            raise EngineDied(link.death)
        return link

    def _loaded(self, info: ModelInfo) -> None:
        self.info = info

    def _died_idle(self, death: EngineDeath) -> None:
        if self.on_idle_death is not None:
            self.on_idle_death(death)


class LocalEngineProcess(EngineProcess):
    """llama.cpp in its own process: what the in-process engine does besides replying (`FormatChecking`,
    `Recomputing`, `Serving`, `Embedding`) crosses too."""

    check_format = remote(FormatChecking.check_format)
    xray = remote(Recomputing.xray)
    word_probability = remote(Recomputing.word_probability)
    generate_together = remote(Serving.generate_together)
    tokenize = remote(Serving.tokenize)
    embed = remote(Embedding.embed)
