"""How fast tui-chat starts: `--help` and `--version` against a bare `python -c pass`, and the real app in a
pseudo-terminal until its chat screen is drawn and a typed key shows in the message box.

Why: a command-line tool that takes a quarter of a second to print its help feels broken, and a chat app
should take keys at once while its model loads in the background. Targets: `--help` and `--version` within
150 ms of `python -c pass`; the chat screen drawn and a key shown within 1 s of launch. Each app launch is a
process of its own in a pseudo-terminal (120 x 40, as a terminal would give it), with a home of its own
(XDG dirs: no history, the starter model unpacked there by the first launch, which is reported apart). The
key is typed the moment the screen is drawn. It prints numbers and asserts nothing.

    python benchmarks/startup.py [--runs 20] [--launches 5] [--home DIR] [--json]
"""

from __future__ import annotations

import argparse
import codecs
import fcntl
import json
import os
import platform
import re
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

from shared import median

from tui_chat.engine.local.cpu import cpu_model

SIZE = (40, 120)  # rows, columns
DRAWN = "Type a message"  # the message box's placeholder: the chat screen is on the terminal
KEY = "Ω"  # typed once drawn: nothing else on an empty chat screen shows it
LAUNCH_TIMEOUT_S = 60.0
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: cursor, colours, modes
                      r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1bP[^\x1b]*\x1b\\"  # OSC, DCS
                      r"|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


def command() -> list[str]:
    """`tui-chat` as installed beside this Python, else the module."""
    script = Path(sys.executable).with_name("tui-chat")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tui_chat"]


def time_commands(runs: int) -> dict[str, list[float]]:
    """Wall time of each command, in ms; the three alternate, so background load hits them alike."""
    commands = {"python -c pass": [sys.executable, "-c", "pass"], "tui-chat --help": [*command(), "--help"],
                "tui-chat --version": [*command(), "--version"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            started = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append((time.perf_counter() - started) * 1000)
    return times


def home_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor", LINES=str(SIZE[0]), COLUMNS=str(SIZE[1]))
    for name in ("CONFIG", "DATA", "STATE", "CACHE"):
        env[f"XDG_{name}_HOME"] = str(home / name.lower())
    return env


class Terminal:
    """The app on the slave side of a pseudo-terminal; what it draws is read from the master."""

    def __init__(self, env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[0], SIZE[1], 0, 0))
        self.started = time.perf_counter()
        self.process = subprocess.Popen(command(), stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True, close_fds=True)
        os.close(slave)
        self.output = ""  # as written, escape sequences and all
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def wait_for(self, wanted: str, after: int = 0) -> float | None:
        """Seconds from launch until `wanted` shows (escapes aside) in what was written past `after`; None when
        it does not within LAUNCH_TIMEOUT_S."""
        deadline = self.started + LAUNCH_TIMEOUT_S
        while wanted not in _ESCAPES.sub("", self.output[after:]):
            if time.perf_counter() > deadline or not self.read(deadline - time.perf_counter()):
                return None
        return time.perf_counter() - self.started

    def read(self, timeout: float) -> bool:
        """What the app wrote within `timeout` seconds; False once it is gone."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, timeout))
        if not ready:
            return True
        try:
            data = os.read(self.master, 1 << 16)
        except OSError:
            return False
        self.output += self._decoder.decode(data)
        return bool(data)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        self.type("\x11")  # Ctrl+Q
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        os.close(self.master)


def launch(home: Path) -> dict[str, float | None]:
    """One app launch: ms until the chat screen is drawn, until the key typed then shows, and between the two."""
    terminal = Terminal(home_env(home))
    drawn = shown = typed = None
    try:
        drawn = terminal.wait_for(DRAWN)
        if drawn is not None:
            mark, typed = len(terminal.output), time.perf_counter() - terminal.started
            terminal.type(KEY)
            shown = terminal.wait_for(KEY, after=mark)
    finally:
        terminal.close()
    return {"screen_drawn_ms": _ms(drawn), "key_shown_ms": _ms(shown),
            "key_latency_ms": _ms(shown - typed) if shown is not None else None}


def _ms(seconds: float | None) -> float | None:
    return _tenths(None if seconds is None else seconds * 1000)


def _tenths(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each command (default 20)")
    parser.add_argument("--launches", type=int, default=5, help="app launches after the first (default 5)")
    parser.add_argument("--home", type=Path, help="the XDG home to launch in (default: a new temporary one)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = parser.parse_args()

    times = time_commands(args.runs)
    base = statistics.median(times["python -c pass"])
    commands = {name: {"median_ms": round(statistics.median(values), 1), "min_ms": round(min(values), 1),
                       "minus_python_ms": round(statistics.median(values) - base, 1),
                       "ratio": round(statistics.median(values) / base, 2)}
                for name, values in times.items()}

    home = args.home or Path(tempfile.mkdtemp(prefix="tui-chat-startup-"))
    try:
        first = launch(home)  # unpacks the starter model into this home when it is new
        later = [launch(home) for _ in range(args.launches)]
    finally:
        if args.home is None:
            shutil.rmtree(home, ignore_errors=True)
    app = {"first_launch": first, "launches": len(later),
           **{name: _tenths(median([run[name] for run in later])) for name in first},
           "runs": later}
    report = {"cpu": cpu_model() or platform.processor(), "logical_cpus": os.cpu_count(),
              "python": platform.python_version(), "runs": args.runs, "commands": commands, "app": app}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"CPU {report['cpu']} · {report['logical_cpus']} logical CPUs · Python {report['python']} · "
          f"{args.runs} runs each, alternating")
    print(f"{'command':<20} {'median ms':>10} {'min ms':>8} {'- python ms':>12} {'× python':>9}")
    for name, row in commands.items():
        print(f"{name:<20} {row['median_ms']:>10.1f} {row['min_ms']:>8.1f} {row['minus_python_ms']:>12.1f} "
              f"{row['ratio']:>9.2f}")
    print(f"\nthe app in a {SIZE[1]}x{SIZE[0]} pseudo-terminal, median of {len(later)} launches (first launch apart):")
    for name, label in (("screen_drawn_ms", "chat screen drawn"), ("key_shown_ms", "typed key shown"),
                        ("key_latency_ms", "key typed → shown")):
        print(f"  {label:<20} {app[name] if app[name] is not None else 'never':>8} ms   "
              f"(first launch {first[name] if first[name] is not None else 'never'} ms)")


if __name__ == "__main__":
    main()
