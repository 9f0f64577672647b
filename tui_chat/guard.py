"""A small watcher process, so that a crash inside llama.cpp is never the user's first sign of trouble.

llama.cpp can take the whole process down (a signal in a CPU kernel, a GGML_ASSERT abort) where no
Python code can catch it. The app therefore runs in a forked child; this process only waits. When the
child dies of a signal, the watcher puts the terminal back (the alternate screen, mouse reporting and
a hidden cursor would otherwise stay) and says in one line what happened and where the log is. The
history needs nothing more: a reply that was streaming reopens as interrupted, as after `kill -9`.

In the child, file descriptor 2 goes to `stderr.log`: what llama.cpp's C code prints there (including
its last words before an abort) and Python's stack at a fatal signal (faulthandler) land in the file,
never across the screen; Python's own `sys.stderr` keeps the terminal. A bug in the app's Python code
ends the same way: its traceback goes to that file and the terminal gets one line (`exception_line`).
Every process appends to the one file (the app and `tui-chat run` may run at once), each entry under a
line naming its process; the crash line reads only its own process's part.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from .safetext import terminal_safe

LOG_NAME = "stderr.log"
MAX_LOG_BYTES = 1024 * 1024  # past this, a process starting moves the log aside to `stderr.log.1`
_PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# What the terminal needs back after a full-screen app (what Textual's driver sets on start): main
# screen, cursor, no mouse reports (pixels neither), no bracketed paste, no focus events, no in-band
# resize reports, no synchronized output, the keyboard protocol popped, autowrap on (Textual turns it
# off: without it every long line later in that shell is cut at the margin), attributes reset.
RESTORE = ("\x1b[<u\x1b[?1049l\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1015l\x1b[?1016l"
           "\x1b[?2004l\x1b[?1004l\x1b[?2048l\x1b[?2026l\x1b[?7h\x1b[0m\r\n")
DOING = {  # the innermost function on the crashed thread's Python stack, said plainly
    "step": "while decoding a token",
    "sample": "while sampling a token",
    "prefill": "while reading the prompt",
    "_decode": "while reading the prompt",
    "__init__": "while loading the model",
    "self_test": "while testing the CPU path",
}
_ABORT_LINE = re.compile(r"^.*(?:GGML_ASSERT|GGML_ABORT|\.(?:c|cpp|h):\d+: ).*$", re.MULTILINE)  # ggml_abort's format
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)', re.MULTILINE)


def watch(log_dir: Path) -> None:
    """Fork: the child returns and runs the app; this process waits for it and exits with its status."""
    if not hasattr(os, "fork"):
        return
    terminal = _terminal_attributes()
    log = log_dir / LOG_NAME
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    child = os.fork()
    if child == 0:
        _die_with(os.getppid())
        _become_the_app(log)
        return
    forwarded: set[int] = set()
    status = _wait(child, forwarded)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(exit_code(status, terminal, log, child, forwarded))


def exit_code(status: int, terminal: list[Any] | None, log: Path, pid: int,
              forwarded: AbstractSet[int] = frozenset()) -> int:
    """The shell's convention: the child's own code, or 128 + the signal that killed it. A signal the
    user sent (and this process passed on) is no crash: the terminal comes back without a word."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    number = os.WTERMSIG(status)
    restore_terminal(terminal)
    if number not in forwarded:
        print(crash_line(number, own_part(read_tail(log), pid), log), file=sys.stderr, flush=True)
    return 128 + number


def entry_line(pid: int, what: str) -> str:
    """The line above each entry in the shared log: which process, what, when."""
    return f"{_entry_mark(pid)}{what} {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n"


def _entry_mark(pid: int) -> str:
    return f"--- tui-chat process {pid}: "


def own_part(log_text: str, pid: int) -> str:
    """What process `pid` wrote since it started, and whatever other processes wrote after it (their
    lines are not marked; a crash's own dump is the last): never an earlier run's crash. Where its start
    line has left the tail already read, the tail is all its own."""
    start = log_text.rfind(f"{_entry_mark(pid)}started ")
    return log_text if start < 0 else log_text[start:]


def crash_line(number: int, log_text: str, log: Path) -> str:
    """One line: who crashed, with which signal, doing what, llama.cpp's last words if any, the log."""
    who, what, where, said = crash_parts(number, log_text)
    return _line(who, what, where, said, f"details in {log}")


def crash_parts(number: int, log_text: str, engine: bool = False) -> tuple[str, str, str, str]:
    """Who died of signal `number` (llama.cpp or the app), the signal by name, what it was doing, and
    llama.cpp's last words (""), from the crashed process's part of the log. In the `engine` process the
    main thread only waits on the app's socket: a signal it took came from outside, and what the process
    was doing is what its busy thread was doing (decoding, reading), or nothing."""
    try:
        signal_name = f"{signal.Signals(number).name} ({signal.strsignal(number)})"
    except ValueError:
        signal_name = f"signal {number}"
    frames = _crashed_frames(log_text)
    who, where = "the app", ""
    if frames and _in_engine(frames[0]):
        who, where = "llama.cpp", DOING.get(frames[0]["function"], f"in {frames[0]['function']}")
    elif engine:
        busy = next((frame for frame in _other_threads_frames(log_text) if frame["function"] in DOING), None)
        where = DOING[busy["function"]] if busy else ""
    elif frames:
        where = f"in {frames[0]['function']} ({Path(frames[0]['file']).name})"
    last_words = _ABORT_LINE.findall(log_text)
    return who, signal_name, where, one_said(last_words[-1] if last_words else "")


def exception_line(error: BaseException, log: Path) -> str:
    """A bug in the app's Python code, said as a crash by a signal is: its traceback (without the values
    of locals: a chat's whole token record is one) is added to the log, and one line names it."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f"in {frames[-1].name} ({Path(frames[-1].filename).name})" if frames else ""
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as handle:
            handle.write(entry_line(os.getpid(), type(error).__name__) + "".join(traceback.format_exception(error)))
        details = f"details in {log}"
    except OSError as failure:
        details = f"no details: the log {log} cannot be written ({failure.strerror or failure})"
    return _line("the app", type(error).__name__, where, str(error), details)


def one_said(said: str) -> str:
    """What a crashed process said last, as one safe line of at most 160 characters."""
    said = terminal_safe(said.strip().splitlines()[0] if said.strip() else "")
    return f"{said[:160]}{'…' if len(said) > 160 else ''}"


def _line(who: str, what: str, where: str, said: str, details: str) -> str:
    said = f": {one_said(said)}" if said.strip() else ""
    return (f"tui-chat: {who} crashed with {what}{' ' + where if where else ''}{said}. "
            f"The chat so far is kept; {details}")


def restore_terminal(attributes: list[Any] | None) -> None:
    """Only where a terminal is attached: a log file or a pipe gets no escape codes."""
    for fd in (2, 1):
        if os.isatty(fd):
            with contextlib.suppress(OSError):
                os.write(fd, RESTORE.encode())
            break
    if attributes is not None:
        import termios

        with contextlib.suppress(OSError, termios.error):
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSANOW, attributes)


def _die_with(watcher: int) -> None:
    """`kill -9` of the tui-chat process (the watcher) must end the app too, as it did before there
    were two: Linux delivers SIGKILL to the child when its parent dies."""
    if sys.platform != "linux":
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != watcher:  # the watcher died before the request was in place
        os._exit(128 + signal.SIGKILL)


def _become_the_app(log: Path) -> None:
    """The child: C-level stderr to the log file, Python's stderr (and Textual's screen) to the terminal."""
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        move_aside_when_large(log)
        # appending, never truncating: another tui-chat process (the app beside `tui-chat run`) writes here too
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        handle = os.fdopen(os.open(log, flags, 0o644), "w", encoding="utf-8", buffering=1)
        handle.write(entry_line(os.getpid(), "started"))
    except OSError:
        return  # no log: stderr stays as it was, and the watcher still restores the terminal
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding, errors=sys.stderr.errors)
    os.dup2(handle.fileno(), 2)
    sys.stderr = terminal
    sys.__stderr__ = terminal  # type: ignore[misc]  # Final in typeshed; Textual draws on it, so it moves too
    faulthandler.enable(file=handle, all_threads=True)


def move_aside_when_large(log: Path) -> None:
    """Keeps the log's size bounded without losing a running process's entries: a process that has the
    file open goes on writing into `stderr.log.1`, under its new name."""
    with contextlib.suppress(OSError):
        if log.stat().st_size > MAX_LOG_BYTES:
            os.replace(log, log.with_name(f"{log.name}.1"))


def _wait(child: int, forwarded: set[int]) -> int:
    """Wait, passing on what should reach the app: Ctrl+C already does (same process group); a stopped
    app (Ctrl+Z, or its own suspend) stops this process too, so the shell gets the terminal back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for number in FORWARDED:
        signal.signal(number, lambda received, _frame: _forward(child, received, forwarded))
    while True:
        try:
            _, status = os.waitpid(child, os.WUNTRACED)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if not os.WIFSTOPPED(status):
            return status
        os.kill(os.getpid(), signal.SIGSTOP)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)


def _forward(child: int, number: int, forwarded: set[int]) -> None:
    forwarded.add(number)
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, number)


def _terminal_attributes() -> list[Any] | None:
    try:
        import termios

        return termios.tcgetattr(sys.stdin.fileno()) if os.isatty(sys.stdin.fileno()) else None
    except (ImportError, OSError, ValueError):
        return None


def _crashed_frames(log_text: str) -> list[dict[str, str]]:
    """faulthandler's frames for the thread that crashed (most recent call first)."""
    _, found, after = log_text.rpartition("Current thread ")
    return [match.groupdict() for match in _FRAME.finditer(after.split("\n\n")[0])] if found else []


def _other_threads_frames(log_text: str) -> list[dict[str, str]]:
    """The engine's own frames of the last dump's other threads, innermost first: what they were doing."""
    dump = log_text[log_text.rfind("Fatal Python error"):]
    before_current = dump.partition("Current thread ")[0]
    return [frame for frame in (match.groupdict() for match in _FRAME.finditer(before_current)) if _in_engine(frame)]


def _in_engine(frame: dict[str, str]) -> bool:
    return f"tui_chat{os.sep}engine" in frame["file"]


def read_tail(log: Path, size: int = 64 * 1024) -> str:
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - size))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
