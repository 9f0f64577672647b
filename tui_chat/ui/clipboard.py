"""Copying text out of a terminal app, and saying honestly what happened.

A terminal app copies with OSC 52: the terminal is asked to set its clipboard. Inside tmux that only
arrives when tmux's `set-clipboard` is `on` (its default, `external`, drops what applications send), so
there the text goes into tmux's own paste buffer instead, and to a file the user can open, and the
message says how to let copies through.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from textual.app import App

TMUX_TIMEOUT_S = 2.0


def tmux_clipboard() -> str | None:
    """tmux's `set-clipboard` setting when running inside tmux (None outside, or when tmux does not answer)."""
    if not os.environ.get("TMUX"):
        return None
    try:
        done = subprocess.run(["tmux", "show-options", "-gv", "set-clipboard"], capture_output=True, text=True,
                              timeout=TMUX_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def copy(app: App[object], text: str, spill: Path) -> str:
    """Copy `text` the way that can reach the user here; returns what to tell them."""
    setting = tmux_clipboard()
    if setting is None or setting == "on":
        app.copy_to_clipboard(text)
        return "Copied to the clipboard" + (" (through tmux)" if setting else "")
    into_tmux = _tmux_buffer(text)
    saved = _spill(text, spill)
    where = [part for part in ("tmux's paste buffer (prefix ])" if into_tmux else "", saved) if part]
    if not where:
        return "tmux drops the clipboard here (set-clipboard is off) and nothing else could take the text"
    return (f"tmux drops terminal copies (set-clipboard {setting}): put in {' and '.join(where)}; "
            "`tmux set -g set-clipboard on` lets copies through")


def _tmux_buffer(text: str) -> bool:
    try:
        done = subprocess.run(["tmux", "load-buffer", "-"], input=text, text=True, capture_output=True,
                              timeout=TMUX_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _spill(text: str, path: Path) -> str:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError:
        return ""
    return str(path)
