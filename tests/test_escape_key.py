"""Esc in a real terminal: a lone Esc byte can also start a key's escape sequence, so Textual waits ESCDELAY ms
for more before it says Esc. The app sets 25 (Textual's default is 100), and its input thread waits no longer
than that (Textual's looks again only every 100 ms). Real processes on a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import termios
import time

import pytest

from tui_chat.config import Config
from tui_chat.ui.app import ChatApp
from tui_chat.ui.textual_fixes import TimelyEscapeDriver

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX terminal")

# A Textual app that says when it saw Esc (its monotonic clock is the machine's), as the chat app runs
PROBE = """
import time
import tui_chat.ui
from textual.app import App
from tui_chat.ui.textual_fixes import terminal_driver

class Probe(App):
    BINDINGS = [("escape", "seen")]

    def __init__(self):
        super().__init__(driver_class=terminal_driver())

    def action_seen(self):
        self.exit(time.monotonic())

print("SEEN", Probe().run())
"""


def esc_seen_after(env: dict[str, str]) -> float:
    """Seconds from an Esc written to the probe's terminal to the probe's key event."""
    master, slave = pty.openpty()
    termios.tcsetwinsize(slave, (24, 80))
    probe = subprocess.Popen([sys.executable, "-c", PROBE], stdin=slave, stdout=slave, stderr=slave, env=env,
                             close_fds=True, start_new_session=True)
    os.close(slave)
    output = b""

    def read(timeout: float) -> None:
        nonlocal output
        while select.select([master], [], [], timeout)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            output += chunk

    try:
        deadline = time.monotonic() + 30
        while b"\x1b[?1049h" not in output and time.monotonic() < deadline:  # the app took the screen
            read(0.1)
        read(0.5)  # its input thread waiting in select
        written = time.monotonic()
        os.write(master, b"\x1b")
        probe.wait(timeout=30)
        read(0.2)
    finally:
        if probe.poll() is None:
            probe.kill()
        os.close(master)
    seen = re.search(rb"SEEN (\d+\.\d+)", output)
    assert seen, output[-500:]
    return float(seen[1]) - written


def test_esc_reaches_the_app_within_escdelay_not_textuals_100_ms():
    """ESCDELAY of 1 ms, so what is measured is the input thread: Textual's own took 100 ms or more here."""
    env = {**os.environ, "TERM": "xterm-256color", "ESCDELAY": "1"}
    assert esc_seen_after(env) < 0.08  # Textual's own: 0.1 at the least (its select timeout)


@pytest.mark.parametrize(("given", "delay"), [(None, 0.025), ("200", 0.2)])
def test_the_escdelay_is_25_ms_unless_the_user_set_one(given, delay):
    env = {name: value for name, value in os.environ.items() if name != "ESCDELAY"}
    if given is not None:
        env["ESCDELAY"] = given
    shown = subprocess.run([sys.executable, "-c", "import tui_chat.ui.app, textual.constants as c; "
                            "print(c.ESCAPE_DELAY)"], env=env, capture_output=True, text=True, check=True)
    assert float(shown.stdout) == delay


def test_the_chat_app_runs_on_the_timely_driver_in_a_terminal():
    assert ChatApp(Config(), lambda *args: None).driver_class is TimelyEscapeDriver
