"""llama.cpp logs go to a file, never to the terminal the UI draws on.

The ctypes callback object lives at module level: llama.cpp keeps the raw pointer, and a collected
callback crashes the process the next time it logs (e.g. while rejecting a truncated model).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import llama_cpp

from ...guard import move_aside_when_large

_LEVEL_ERROR = 4  # GGML_LOG_LEVEL_ERROR
# ggml says this when it cannot have AMX, which is what the no-amx CPU path asks for: said plainly instead
AMX_DENIED = "AMX is not ready to be used"
AMX_DENIED_NOTE = "tui-chat: AMX is off on purpose on this CPU path (no-amx: see `tui-chat info`); not an error\n"

_lock = threading.Lock()
_sink: TextIO | None = None
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_installed = False
_collected: list[str] | None = None  # every line while `collecting`


def _on_log(level: int, text: bytes | None, _user_data: object) -> None:
    """Called by llama.cpp: an exception here would be printed over the UI, so a log file that cannot be
    written (a full disk) is simply given up."""
    if not text:
        return
    line = text.decode("utf-8", errors="replace")
    denied = AMX_DENIED in line
    line = AMX_DENIED_NOTE if denied else line
    with _lock:
        if _collected is not None:
            _collected.append(line)
        if level == _LEVEL_ERROR and line.strip() and not denied:
            _recent_errors.append(line.strip())
        if _sink is not None:
            try:
                _sink.write(line)
            except OSError:
                _close_sink()


def _close_sink() -> None:
    """Close the log file even if its last lines cannot be written (held under `_lock`)."""
    global _sink
    if _sink is not None:
        with contextlib.suppress(OSError):
            _sink.close()
    _sink = None


_CALLBACK = llama_cpp.llama_log_callback(_on_log)


def install(log_dir: Path | None) -> Path | None:
    """Route llama.cpp's logs to `log_dir/llama.log` (or nowhere when it cannot be written)."""
    global _sink, _installed
    path = None
    with _lock:
        if _sink is not None:
            _close_sink()
        if log_dir is not None:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                path = log_dir / "llama.log"
                move_aside_when_large(path)  # rolled over as stderr.log is: a crash's last words stay readable
                _sink = path.open("a", encoding="utf-8", buffering=1)
            except OSError:
                path = None
    if not _installed:
        llama_cpp.llama_log_set(_CALLBACK, None)
        _installed = True
    return path


@contextlib.contextmanager
def collecting() -> Iterator[list[str]]:
    """The lines llama.cpp logs meanwhile (a load's: what it allocated where), besides the file."""
    global _collected
    lines: list[str] = []
    with _lock:
        _collected = lines
    try:
        yield lines
    finally:
        with _lock:
            _collected = None


def take_errors() -> list[str]:
    """The error lines llama.cpp logged since the last call: the reason behind a failed load."""
    with _lock:
        errors = list(_recent_errors)
        _recent_errors.clear()
    return errors


def note(line: str) -> None:
    """One line of tui-chat's own, beside llama.cpp's: something skipped that the user need not be shown."""
    with _lock:
        if _sink is not None:
            try:
                _sink.write(f"tui-chat: {line}\n")
            except OSError:
                _close_sink()


def record_exception(error: BaseException) -> None:
    """A bug caught at the worker's edge: its traceback goes to the same log file as llama.cpp's."""
    text = "".join(traceback.format_exception(error))
    with _lock:
        if _sink is not None:
            _sink.write(f"tui-chat internal error:\n{text}")
