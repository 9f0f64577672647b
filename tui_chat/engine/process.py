"""The engine in a process of its own, as the app sees it: a `Backend` whose model lives in another process.

Every local runner worth using keeps the model out of the UI's process (LM Studio's runtime, Ollama's runner):
there, llama.cpp's threads and the UI's never wait for one interpreter lock, and a crash inside llama.cpp (an
abort, a segfault in a CPU kernel, out of GPU memory, kill -9) ends that process, not the app. This module is
the app's side; `host.py` is the engine process's. They speak over one socket with pickled tuples:

  app → engine   ("job", key, method, args, reload)   load, generate, generate_together, compare, xray,
                                                       word_probability
                 ("call", key, method, args)          count_tokens, tokenize, check_format: a value or an
                                                       exception back
                 ("cancel", key)   ("params", live key, version, params)   ("close",)
  engine → app   ("events", key, [events])            every event of a job since the last, a few dozen a second
                 ("reply", key, ok, value)   ("loaded", ModelInfo)

Nothing here imports llama.cpp: the backend is built over there by `make`, a picklable callable. When the engine
process dies, each job still open ends with one `Error` line saying what died and where its log is (the session
keeps what the reply wrote so far), and the next job starts a new process that loads the model again first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..guard import LOG_NAME, crash_parts, own_part, read_tail
from .base import FINAL_EVENTS, Backend, EngineError, Error, Event, Loaded, LoadProgress, ModelInfo, Request, Stream
from .formats import OutputFormat
from .params import LiveParams, SamplingParams

MakeBackend = Callable[[], Backend]  # picklable (a module-level function or a partial of one): run over there
UI_PROCESS_ENV = "TUI_CHAT_UI_PROCESS"  # the app's pid, for the engine's thread governor (local/cpu.py)
CLOSE_TIMEOUT_S = 10.0  # a closing engine finishes the job in hand first (a stopped reply ends within a token)
HEARTBEAT_S = 1.0  # the engine process says it is alive this often, whatever its worker is doing
SILENCE_LIMIT_S = 15.0  # this long without a word while a job is open: stopped (kill -STOP) or hung, so it is ended
STOP_GRACE_S = 1.0  # a stopped job the engine has not ended by then ends here, with what it wrote
AFTER_DEATH = "the chat is kept, and the next message loads the model again"


def lives_in(args: Iterable[Any]) -> list[LiveParams]:
    """The live settings a job's arguments carry (a request's, a lab's columns): mirrored while it runs."""
    found: list[LiveParams] = []
    for arg in args:
        if isinstance(arg, LiveParams):
            found.append(arg)
        elif isinstance(arg, Request):
            found.append(arg.params)
        elif isinstance(arg, (list, tuple)):
            found.extend(lives_in(arg))
    return found


class _Job(Stream):
    """A job's events on the app's side, as they come from the engine process; cancelling it cancels it there."""

    def __init__(self, link: _Link, key: int, lives: Sequence[LiveParams]) -> None:
        super().__init__()
        self.link, self.key, self.lives = link, key, lives

    def cancel(self) -> None:
        """Stops it there; if the engine does not end it soon (stopped, or deep in a long read), it ends here: Esc
        never waits for the engine's help."""
        super().cancel()
        self.link.send(("cancel", self.key))
        timer = threading.Timer(STOP_GRACE_S, self.link.end, (self, Error(
            f"stopped here: the engine did not end the reply within {STOP_GRACE_S:g} s of the stop")))
        timer.daemon = True
        timer.start()


class _Link:
    """One engine process and the socket to it: the jobs and calls in flight, and the thread that reads."""

    def __init__(self, make: MakeBackend, log_dir: Path, on_loaded: Callable[[ModelInfo], None],
                 on_death: Callable[[str], None]) -> None:
        self.log = log_dir / LOG_NAME
        self.on_loaded, self.on_death = on_loaded, on_death
        self.jobs: dict[int, _Job] = {}
        self.calls: dict[int, Future[Any]] = {}
        self.keys = itertools.count(1)
        self.lock = threading.Lock()  # the socket's writes, and the tables above
        self.cause = ""  # how the process ended, once it has
        self.death: str | None = None  # the line that says so: the cause, what happens now, where the log is
        self.closing = False
        self.heard = time.monotonic()  # the last word from the engine process: the watchdog's clock
        self.silenced = False  # the watchdog ended it
        ours, theirs = socket.socketpair()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tui_chat.engine.host", str(theirs.fileno()), str(self.log)],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,
            env=os.environ | {UI_PROCESS_ENV: str(os.getpid())})  # its thread governor counts the UI as load
        theirs.close()
        self.connection = Connection(ours.detach())
        self.send(("make", make))
        threading.Thread(target=self._read, name="engine-link", daemon=True).start()
        threading.Thread(target=self._watch, name="engine-watchdog", daemon=True).start()

    def send(self, message: tuple[Any, ...]) -> None:
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
            self.send(("job", key, method, args, bool(reload)))
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # a bug: one line, not a traceback
            self.end(job, Error(f"internal error (the request could not be sent to the engine: {error})"))
        if self.death is not None:
            self.end(job, Error(self.death))
        return job

    def call(self, method: str, *args: Any) -> Any:
        future: Future[Any] = Future()
        with self.lock:
            key = next(self.keys)
            self.calls[key] = future
        self.send(("call", key, method, args))
        if self.death is not None:
            raise EngineError(self.death)
        return future.result()

    def close(self) -> None:
        self.closing = True
        self.send(("close",))
        try:
            self.process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.connection.close()

    def _details(self, code: int) -> str:
        """Where to read more: the log, unless the process was killed (it wrote nothing)."""
        return "" if code == -signal.SIGKILL else f"; details in {self.log}"

    def _changed(self, live: LiveParams) -> None:
        version, params = live.snapshot()
        self.send(("params", live.key, version, params))

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
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                break
            self.heard = time.monotonic()
            kind = message[0]
            if kind == "events":
                self._events(message[1], message[2])
            elif kind == "reply":
                with self.lock:
                    future = self.calls.pop(message[1])
                if message[2]:
                    future.set_result(message[3])
                else:
                    future.set_exception(message[3])
            elif kind == "loaded":
                self.on_loaded(message[1])
        self._died()

    def _events(self, key: int, events: list[Event]) -> None:
        job = self.jobs.get(key)
        if job is None:
            return
        for event in events:
            if isinstance(event, Loaded):
                self.on_loaded(event.info)
            job.put(event)
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
            self.cause = ("the engine was closed" if self.closing else silenced() if self.silenced else
                          death_cause(code, self.process.pid, self.log))
            self.death = self.cause if self.closing else f"{self.cause}; {AFTER_DEATH}{self._details(code)}"
            jobs, calls = list(self.jobs.values()), list(self.calls.values())
            self.calls.clear()
        for job in jobs:
            self.end(job, Error(self.death))
        for future in calls:
            future.set_exception(EngineError(self.death))
        if not (jobs or calls or self.closing):
            self.on_death(self.death)  # between replies: said when it happens, not at the next message


def silenced() -> str:
    """Why the watchdog ended the engine process."""
    return (f"the engine process stopped answering (not a word for {SILENCE_LIMIT_S:g} s: stopped or hung), "
            "so it was ended")


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
        self.on_idle_death: Callable[[str], None] | None = None  # told on the link's thread (a screen's toast)
        self._link: _Link | None = None
        self._start = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The engine process's, while it runs (tests stop it; `info` names it)."""
        link = self._link
        return link.process.pid if link is not None and link.death is None else None

    def load(self) -> Stream:
        return self._job("load", (), load=True)

    def generate(self, request: Request) -> Stream:
        return self._job("generate", (request,))

    def compare(self, request: Request, columns: Sequence[LiveParams]) -> Stream:
        return self._job("compare", (request, list(columns)))

    def count_tokens(self, text: str) -> int:
        return int(self._live_link().call("count_tokens", text))

    def close(self) -> None:
        with self._start:
            link, self._link = self._link, None
        if link is not None and link.death is None:
            link.close()

    def _job(self, method: str, args: tuple[Any, ...], load: bool = False) -> Stream:
        with self._start:
            link = self._link
            reload = ""  # a process died: the new one loads its model again first
            if link is None or link.death is not None:
                if not load:
                    reload = link.cause if link is not None else "its engine was closed"
                link = self._link = _Link(self.make, self.log_dir, self._loaded, self._died_idle)
        return link.job(method, args, reload)

    def _live_link(self) -> _Link:
        link = self._link
        if link is None:
            raise EngineError("no model is loaded")
        if link.death is not None:
            raise EngineError(link.death)
        return link

    def _loaded(self, info: ModelInfo) -> None:
        self.info = info

    def _died_idle(self, line: str) -> None:
        if self.on_idle_death is not None:
            self.on_idle_death(line)


class LocalEngineProcess(EngineProcess):
    """llama.cpp in its own process: what the in-process engine does besides replying (`FormatChecking`,
    `Recomputing`, `Serving`) crosses too."""

    def check_format(self, output: OutputFormat) -> str:
        return str(self._live_link().call("check_format", output))

    def xray(self, context: Sequence[int], token: int, params: SamplingParams) -> Stream:
        return self._job("xray", (tuple(context), token, params))

    def word_probability(self, context: Sequence[int], text: str) -> Stream:
        return self._job("word_probability", (tuple(context), text))

    def generate_together(self, request: Request, room: int) -> Stream:
        return self._job("generate_together", (request, room))

    def tokenize(self, text: str) -> list[int]:
        return list(self._live_link().call("tokenize", text))
