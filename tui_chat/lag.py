"""How late the event loop runs, and why: the UI's stalls, each attributed to its cause.

A tick scheduled every `tick_s` on the loop measures how late it runs. While a tick is overdue, a
watchdog thread samples the loop thread's Python stack (it gets the GIL at the interpreter's switch
interval, so only C code that keeps the GIL hides, and the garbage collector is timed by its own
callback). A stall of `stall_s` or more is recorded with the most frequent cause among its samples and the
innermost frame of this package that was running. Set TUI_CHAT_LAG_LOG=FILE to have the app write one
JSON line per stall there (the UI benchmark does); off, it costs nothing.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

ENV = "TUI_CHAT_LAG_LOG"
# the first match, innermost frame outwards, names a sample's cause
CAUSES = (
    ("markdown parse", ("markdown_it", "mdit_py_plugins")),
    ("sqlite", ("sqlite3", "tui_chat/history.py", "tui_chat/recording.py")),
    ("syntax highlight", ("pygments",)),
    ("styles", ("textual/css/", "textual/_styles_cache.py")),
    ("layout", ("textual/_arrange.py", "textual/layouts/", "textual/_layout.py", "textual/_resolve.py")),
    ("render", ("rich/", "textual/_compositor.py", "textual/strip.py", "textual/content.py",
                "textual/_segment_tools.py")),
    ("mount", ("textual/_compose.py", "textual/dom.py")),
)
_PACKAGE = os.sep + "tui_chat" + os.sep


@dataclass(frozen=True, slots=True)
class Stall:
    at: float  # time.perf_counter() when the loop ran again
    late_s: float
    cause: str  # "gc", one of CAUSES, or "other"
    where: str  # the innermost frame of tui_chat seen in the samples ("" if none)
    samples: int
    hottest: str = ""  # the innermost frame seen most often, in any library ("rich/segment.py:divide")
    # the loop thread's CPU time since the tick before: far below late_s, it waited (a core, the GIL)
    cpu_s: float = 0.0


class LagMonitor:
    """Start it on the running loop; `stalls` fills as the loop runs late. `on_stall` gets each one."""

    def __init__(self, tick_s: float = 0.005, stall_s: float = 0.020,
                 on_stall: Callable[[Stall], object] | None = None) -> None:
        self.tick_s, self.stall_s = tick_s, stall_s
        self.on_stall = on_stall
        self.stalls: list[Stall] = []
        self.worst_s = 0.0
        self._due = 0.0
        self._cpu = 0.0  # the loop thread's CPU time at the last tick
        self._samples: list[tuple[str, str, str]] = []
        self._gc_started: float | None = None
        self._gc_s = 0.0
        self._stopped = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop_thread = threading.get_ident()

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._due = time.perf_counter() + self.tick_s
        self._cpu = time.thread_time()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        gc.callbacks.append(self._on_gc)
        threading.Thread(target=self._watch, name="lag-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._task is not None:
            self._task.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, self._due - time.perf_counter()))
            now, cpu = time.perf_counter(), time.thread_time()
            late = now - self._due
            self.worst_s = max(self.worst_s, late)
            if late >= self.stall_s:
                self._record(now, late, cpu - self._cpu)
            self._samples, self._gc_s, self._cpu = [], 0.0, cpu
            self._due = now + self.tick_s

    def _record(self, now: float, late: float, cpu: float) -> None:
        samples = self._samples
        causes = Counter(cause for cause, _, _ in samples)
        if self._gc_s >= late / 2:
            cause = "gc"
        else:
            cause = causes.most_common(1)[0][0] if causes else "other"
        where = next((frame for _, frame, _ in reversed(samples) if frame), "")
        hottest = Counter(inner for _, _, inner in samples).most_common(1)
        stall = Stall(now, late, cause, where, len(samples), hottest[0][0] if hottest else "", cpu)
        self.stalls.append(stall)
        if self.on_stall is not None:
            self.on_stall(stall)

    def _watch(self) -> None:
        interval = self.tick_s
        while not self._stopped.wait(interval):
            if time.perf_counter() - self._due > self.stall_s / 4:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    self._samples.append(classify(frame))

    def _on_gc(self, phase: str, _info: dict[str, int]) -> None:
        if threading.get_ident() != self._loop_thread:
            return
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self._gc_s += time.perf_counter() - self._gc_started
            self._gc_started = None


def classify(frame: FrameType) -> tuple[str, str, str]:
    """A stack's cause (the innermost frame that names one), its innermost frame in this package and
    its innermost frame (as "package/file.py:function")."""
    cause, where = "", ""
    inner = f"{_short(frame.f_code.co_filename)}:{frame.f_code.co_qualname}"
    current: FrameType | None = frame
    while current is not None:
        filename = current.f_code.co_filename.replace(os.sep, "/")
        if not cause:
            cause = next((name for name, marks in CAUSES if any(mark in filename for mark in marks)), "")
        if not where and _PACKAGE in current.f_code.co_filename and not filename.endswith("/lag.py"):
            where = f"{Path(filename).name}:{current.f_code.co_qualname}"
        current = current.f_back
    return cause or "other", where, inner


def _short(filename: str) -> str:
    parts = Path(filename).parts
    return "/".join(parts[-2:])


def monitor_from_env() -> LagMonitor | None:
    """A monitor writing each stall to the file TUI_CHAT_LAG_LOG names, or None when it is not set."""
    path = os.environ.get(ENV)
    if not path:
        return None
    log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the app's lifetime

    def write(stall: Stall) -> None:
        log.write(json.dumps(asdict(stall)) + "\n")

    return LagMonitor(on_stall=write)
