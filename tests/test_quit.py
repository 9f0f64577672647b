"""Issue 44, item 16: Ctrl+Q with an MCP server running left the app and its watcher alive for ~5 s: the exit
waited for the server to end, the SDK's grace (2 s after its input closes) and then SIGTERM. The real
`mcp-server-time`, made slow to end as a loaded machine makes it: it lingers SLOW_EXIT_S once its input closes."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from test_guard import _state, app_on_a_terminal
from test_ui import SIZE, loaded, make_app, reply_done, send
from tui_chat.config import history_path
from tui_chat.history import History
from tui_chat.tools.settings import McpSettings, ServerSpec

SLOW_EXIT_S = 3
SLOW_TO_END = ServerSpec("time", sys.executable, (
    "-c", f"import atexit, time; atexit.register(time.sleep, {SLOW_EXIT_S}); from mcp_server_time import main; main()"))
APP_QUITS_WITHIN_S = 0.5  # in the app: Ctrl+Q to the app's end, Textual's own shutdown included
PROCESS_QUITS_WITHIN_S = 2.0  # the watcher's exit, the interpreter's own shutdown included (on 2 busy cores)


async def test_ctrl_q_waits_for_the_chat_to_be_saved_not_for_the_mcp_server(tiny_model):
    app = make_app(str(tiny_model), mcp=McpSettings({"time": SLOW_TO_END}))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        screen.workspace.start_tool_server("time")
        await pilot.press("ctrl+q")
        asked = time.monotonic()
    took = time.monotonic() - asked
    assert took < APP_QUITS_WITHIN_S, f"the app took {took:.2f} s to quit"
    with History(history_path()) as history:
        [chat] = history.conversations()
        assert chat.messages == 2, "the chat was saved before the app ended"


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or _state(pid) == "Z"


def mcp_server_of(app: int, deadline: float) -> int:
    """The time server's process, once the app has started it."""
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{app}/task").iterdir():
            for child in (task / "children").read_text().split():
                if b"mcp_server_time" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
        time.sleep(0.1)
    raise AssertionError("the MCP server did not start")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the watcher forks")
def test_ctrl_q_ends_the_app_and_its_watcher_at_once_and_the_server_ends_behind(tiny_model):
    terminal, deadline = app_on_a_terminal(
        f'default_model = "{tiny_model}"\n[mcp.servers.time]\ncommand = {json.dumps(SLOW_TO_END.command)}\n'
        f'args = {json.dumps(list(SLOW_TO_END.args))}\n')
    try:
        app = terminal.child_pid()
        os.write(terminal.master, b"\x1b[20~")  # F9: the server starts as the screen lists it
        server = mcp_server_of(app, deadline)
        while b"2 tools" not in terminal.read(0.2) and time.monotonic() < deadline:
            pass
        os.write(terminal.master, b"\x11")  # Ctrl+Q
        asked = time.monotonic()
        while terminal.process.poll() is None and time.monotonic() < asked + 10:
            terminal.read(0.02)
        took = time.monotonic() - asked
    finally:
        terminal.close()
    assert took < PROCESS_QUITS_WITHIN_S, f"the watcher took {took:.2f} s to end"
    assert gone(app)
    while not gone(server) and time.monotonic() < asked + SLOW_EXIT_S + 3:
        time.sleep(0.05)
    assert gone(server), "the MCP server outlived the app"
