"""Copying under tmux: with its default settings a terminal copy never arrives, so the text goes to
tmux's paste buffer and a file, and the message says so. A real tmux server on a private socket."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from test_ui import SIZE, loaded, reply_done, scripted_app, send
from tui_chat.config import data_dir
from tui_chat.ui.clipboard import tmux_clipboard

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def tmux(tmp_path, monkeypatch):
    """A tmux server of the test's own; TMUX points at it as it would inside a tmux pane."""
    socket = tmp_path / "tmux.sock"

    def command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", str(socket), *args], capture_output=True, text=True, check=False)

    command("new-session", "-d", "-s", "test", "-x", "80", "-y", "24")
    monkeypatch.setenv("TMUX", f"{socket},{os.getpid()},0")
    yield command
    command("kill-server")


@pytest.mark.parametrize("setting", ["external", "off"])
async def test_a_copy_inside_tmux_that_drops_it_lands_in_its_buffer_and_a_file(tmux, setting):
    tmux("set-option", "-g", "set-clipboard", setting)
    assert tmux_clipboard() == setting
    app = scripted_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await send(pilot, "Name three colours")
        reply = await reply_done(pilot)
        await pilot.press("f3")
        await pilot.pause()
        [note] = [n.message for n in app._notifications if "tmux" in n.message]
    assert f"set-clipboard {setting}" in note and "tmux set -g set-clipboard on" in note
    assert tmux("show-buffer").stdout == reply.text
    assert (data_dir() / "exports" / "copied.txt").read_text() == reply.text


async def test_with_set_clipboard_on_the_terminal_gets_it(tmux):
    tmux("set-option", "-g", "set-clipboard", "on")
    app = scripted_app()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await send(pilot, "Name three colours")
        await reply_done(pilot)
        await pilot.press("f3")
        await pilot.pause()
        assert any(n.message == "Copied to the clipboard (through tmux)" for n in app._notifications)
