"""The watcher process: a child that dies of a signal gives the terminal back with one line, and the
reply it was writing reopens as interrupted. Real processes on a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import signal
import sqlite3
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tui_chat.config import history_path, log_dir
from tui_chat.guard import MAX_LOG_BYTES, RESTORE, crash_line
from tui_chat.history import History

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the watcher forks")
MODE_DEFAULTS = {"7": "h", "25": "h"}  # a terminal's private modes are off at start, but autowrap and the cursor


class Terminal:
    """A process on a pseudo-terminal of 100x30, its output read as it comes."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        termios.tcsetwinsize(slave, (30, 100))
        self.process = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                        env={**os.environ, "TERM": "xterm-256color", **(env or {})},
                                        start_new_session=True)
        os.close(slave)
        self.output = b""

    def read(self, timeout: float = 0.2) -> bytes:
        import select

        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], left)
            if not ready:
                break
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.output += chunk
        return self.output

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self.read(0.1)
        self.read(0.2)
        return self.process.wait(timeout=1)

    def child_pid(self) -> int:
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)


def watched_script(body: str, log: Path) -> list[str]:
    return [sys.executable, "-c", f"from pathlib import Path\nfrom tui_chat.guard import watch\n"
                                  f"watch(Path({str(log)!r}))\n{body}"]


@pytest.mark.parametrize("number", [signal.SIGSEGV, signal.SIGABRT])
def test_a_child_killed_by_a_signal_gets_the_terminal_back_and_one_line(tmp_path, number):
    body = ("import os, signal, sys\nsys.stdout.write('\\x1b[?1049h\\x1b[?1003h\\x1b[?25l'); sys.stdout.flush()\n"
            f"os.kill(os.getpid(), {int(number)})")
    terminal = Terminal(watched_script(body, tmp_path))
    try:
        assert terminal.wait() == 128 + number
        output = terminal.output.decode("utf-8", "replace")
    finally:
        terminal.close()
    assert RESTORE.strip() in output
    lines = [line for line in output.split("\r\n") if "crashed" in line]
    assert len(lines) == 1 and signal.Signals(number).name in lines[0] and str(tmp_path / "stderr.log") in lines[0]
    assert "Fatal Python error" in (tmp_path / "stderr.log").read_text()


def test_a_normal_exit_passes_through_untouched(tmp_path):
    terminal = Terminal(watched_script("import sys; print('fine'); sys.exit(3)", tmp_path))
    try:
        assert terminal.wait() == 3
    finally:
        terminal.close()
    assert b"fine" in terminal.output and RESTORE.strip().encode() not in terminal.output


def test_a_signal_sent_to_the_watcher_reaches_the_app_and_is_no_crash(tmp_path):
    body = "import time\nprint('ready', flush=True)\ntime.sleep(30)"
    terminal = Terminal(watched_script(body, tmp_path))
    try:
        deadline = time.monotonic() + 10
        while b"ready" not in terminal.read(0.1) and time.monotonic() < deadline:
            pass
        terminal.process.send_signal(signal.SIGTERM)
        assert terminal.wait() == 128 + signal.SIGTERM
    finally:
        terminal.close()
    assert b"crashed" not in terminal.output


def test_native_stderr_goes_to_the_log_and_python_keeps_the_terminal(tmp_path):
    body = "import os, sys\nos.write(2, b'from C\\n')\nprint('from Python', file=sys.stderr, flush=True)"
    terminal = Terminal(watched_script(body, tmp_path))
    try:
        assert terminal.wait() == 0
    finally:
        terminal.close()
    assert b"from Python" in terminal.output and b"from C" not in terminal.output
    assert "from C" in (tmp_path / "stderr.log").read_text()


def test_the_crash_line_names_llama_cpp_what_it_was_doing_and_its_last_words():
    log = ("/src/ggml/src/ggml-cpu/ops.cpp:4203: GGML_ASSERT(ne0 > 0) failed\nFatal Python error: Aborted\n\n"
           "Thread 0x02 (most recent call first):\n  File \"/x/textual/app.py\", line 1 in run\n\n"
           "Current thread 0x01 (most recent call first):\n"
           f"  File \"/x/tui_chat{os.sep}engine{os.sep}llamacpp.py\", line 214 in step\n"
           "  File \"/x/tui_chat/engine/llama.py\", line 353 in _decode\n\nExtension modules: numpy\n")
    line = crash_line(signal.SIGABRT, log, Path("/logs/stderr.log"))
    assert line == ("tui-chat: llama.cpp crashed with SIGABRT (Aborted) while decoding a token: "
                    "/src/ggml/src/ggml-cpu/ops.cpp:4203: GGML_ASSERT(ne0 > 0) failed. "
                    "The chat so far is kept; details in /logs/stderr.log")
    assert crash_line(signal.SIGSEGV, "", Path("/l")).startswith("tui-chat: the app crashed with SIGSEGV")


def app_on_a_terminal(config: str) -> tuple[Terminal, float]:
    """The real app under its watcher on a pseudo-terminal, with `config`, once its message box is drawn;
    and the deadline the caller's waits share."""
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "tui-chat" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(config)
    terminal = Terminal([sys.executable, "-m", "tui_chat"])
    deadline = time.monotonic() + 30
    while b"Type a message" not in terminal.read(0.2) and time.monotonic() < deadline:
        pass
    return terminal, deadline


def test_the_app_killed_mid_reply_restores_the_terminal_and_the_reply_reopens_interrupted(tiny_model):
    terminal, deadline = app_on_a_terminal(
        f'default_model = "{tiny_model}"\nn_ctx = 32768\n[sampling]\nmax_tokens = 100000\n')
    try:
        time.sleep(1.0)  # the model loads in the background
        os.write(terminal.master, b"Hello there\r")
        streaming = None
        while streaming is None and time.monotonic() < deadline + 30:
            terminal.read(0.2)
            streaming = _streaming_reply()
        assert streaming is not None, terminal.output[-2000:]
        os.kill(terminal.child_pid(), signal.SIGSEGV)
        assert terminal.wait() == 128 + signal.SIGSEGV
    finally:
        terminal.close()
    tail = terminal.output[-3000:].decode("utf-8", "replace")
    assert "\x1b[?1049l" in tail and "crashed with SIGSEGV" in tail and str(log_dir() / "stderr.log") in tail
    with History(history_path()) as history:
        conversation = history.load(history.conversations()[0].id)
    assert conversation.messages[-1].state == "interrupted" and conversation.messages[-1].content


def test_kill_9_of_the_app_gives_back_every_mode_it_set_autowrap_too(tiny_model):
    """Whatever the real app set on the terminal (Textual's driver: alternate screen, mouse reports,
    bracketed paste, focus events, autowrap off, the keyboard protocol), the watcher sets back after
    `kill -9` of the app, so the crash line and every later line in that shell wrap."""
    terminal, _ = app_on_a_terminal(f'default_model = "{tiny_model}"\n')
    try:
        mark = len(terminal.read(0.5))
        os.kill(terminal.child_pid(), signal.SIGKILL)
        assert terminal.wait() == 128 + signal.SIGKILL
        before, after = (part.decode("utf-8", "replace") for part in (terminal.output[:mark], terminal.output[mark:]))
    finally:
        terminal.close()
    modes = {}
    for mode, state in re.findall(r"\x1b\[\?(\d+)([hl])", before):
        modes[mode] = state
    left = {mode: state for mode, state in modes.items() if state != MODE_DEFAULTS.get(mode, "l")}
    assert "7" in left and "1049" in left, "the app turned autowrap off and used the alternate screen"
    for mode in left:
        assert f"\x1b[?{mode}{MODE_DEFAULTS.get(mode, 'l')}" in after, f"mode {mode} left as the app set it"
    if re.search(r"\x1b\[>\d+u", before):
        assert "\x1b[<u" in after, "the keyboard protocol the app pushed is popped"
    assert after.index("\x1b[?7h") < after.index("crashed with SIGKILL"), "the line itself wraps"


def _streaming_reply() -> int | None:
    try:
        with sqlite3.connect(history_path()) as db:
            row = db.execute("SELECT id FROM messages WHERE role = 'assistant' AND state = 'streaming' "
                             "AND content != ''").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def test_kill_9_of_the_watcher_ends_the_app_too(tmp_path):
    terminal = Terminal(watched_script("import time\nprint('ready', flush=True)\ntime.sleep(60)", tmp_path))
    try:
        deadline = time.monotonic() + 10
        while b"ready" not in terminal.read(0.1) and time.monotonic() < deadline:
            pass
        app = terminal.child_pid()
        terminal.process.kill()
        terminal.process.wait()
        deadline = time.monotonic() + 5
        while Path(f"/proc/{app}").exists() and "Z" not in _state(app) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{app}").exists() or "Z" in _state(app)
    finally:
        terminal.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


# --- one log shared by every process --------------------------------------------------------------------


def test_two_processes_keep_each_others_entries_in_the_log(tmp_path):
    """The app and `tui-chat run` at once: the second to start neither truncates nor hides the first's lines."""
    first_body = ("import os, sys\nos.write(2, b'first before\\n')\nprint('ready', flush=True)\n"
                  "sys.stdin.readline()\nos.write(2, b'first after\\n')")
    first = subprocess.Popen(watched_script(first_body, tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert first.stdout.readline() == b"ready\n"
        second = subprocess.run(watched_script("import os\nos.write(2, b'second\\n')", tmp_path), timeout=30)
        first.stdin.write(b"go\n")
        first.stdin.close()
        assert second.returncode == 0 and first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    log = (tmp_path / "stderr.log").read_text()
    assert all(line in log for line in ("first before\n", "second\n", "first after\n"))
    starts = re.findall(r"^--- tui-chat process (\d+): started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ---$", log, re.MULTILINE)
    assert len(set(starts)) == 2


def test_the_crash_line_never_reads_an_earlier_runs_crash(tmp_path):
    (tmp_path / "stderr.log").write_text(
        "--- tui-chat process 1: started 2026-01-01 00:00:00 ---\n"
        "/src/ggml.c:1: GGML_ASSERT(old) failed\nFatal Python error: Aborted\n\nCurrent thread 0x01 (most recent "
        f"call first):\n  File \"/x/tui_chat{os.sep}engine{os.sep}llamacpp.py\", line 214 in step\n\n")
    terminal = Terminal(watched_script("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", tmp_path))
    try:
        assert terminal.wait() == 128 + signal.SIGKILL
    finally:
        terminal.close()
    [line] = [line for line in terminal.output.decode().split("\r\n") if "crashed" in line]
    assert line.startswith("tui-chat: the app crashed with SIGKILL (Killed). The chat so far is kept")
    assert "GGML_ASSERT(old)" in (tmp_path / "stderr.log").read_text()


def test_a_large_log_is_moved_aside_not_cut(tmp_path):
    (tmp_path / "stderr.log").write_bytes(b"x" * (MAX_LOG_BYTES + 1))
    subprocess.run(watched_script("import os\nos.write(2, b'new\\n')", tmp_path), check=True, timeout=30)
    assert (tmp_path / "stderr.log.1").stat().st_size == MAX_LOG_BYTES + 1
    assert (tmp_path / "stderr.log").read_text().endswith("---\nnew\n")


def test_llama_cpps_log_is_rolled_over_as_stderr_log_is_not_emptied(tmp_path):
    """Issue 44 item 13: past its limit llama.log was opened with "w": a crash's llama.cpp lines could vanish."""
    from tui_chat.engine.local import logs

    (tmp_path / "llama.log").write_text("the last crash's words\n" + "x" * MAX_LOG_BYTES)
    try:
        assert logs.install(tmp_path) == tmp_path / "llama.log"
        logs._on_log(2, b"a new start\n", None)
    finally:
        logs.install(None)
    assert (tmp_path / "llama.log.1").read_text().startswith("the last crash's words\n")
    assert (tmp_path / "llama.log").read_text() == "a new start\n"


def test_ggml_refusing_amx_on_the_no_amx_path_is_said_as_what_it_means(tmp_path):
    """Issue 44 item 13: every no-AMX start logged ggml's `AMX is not ready to be used!`, read as an error."""
    from tui_chat.engine.local import logs

    try:
        logs.install(tmp_path)
        logs.take_errors()
        logs._on_log(4, b"AMX is not ready to be used!\n", None)
        assert logs.take_errors() == []
    finally:
        logs.install(None)
    assert (tmp_path / "llama.log").read_text() == logs.AMX_DENIED_NOTE
