"""What a tour of the app by a new user, a power user and a saboteur crashed (issue 25): a key pressed
twice, a bug's traceback, a models dir that takes no writes, a theme that is not there. The terminal's
modes after a crash are in test_guard.py, a read-only data dir in test_faults.py, a closed pipe and a
grammar that does not parse in test_cli.py."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from textual import events
from textual.widgets._toast import Toast

from test_guard import Terminal
from test_ui import loaded, reply_done, scripted_app, send
from tui_chat.config import config_path, log_dir
from tui_chat.guard import LOG_NAME
from tui_chat.hub.local import record_pull
from tui_chat.hub.names import parse_ref
from tui_chat.ui.app import DEFAULT_THEME
from tui_chat.ui.widgets.messages import ReplyMessage, UserMessage
from tui_chat.ui.widgets.prompt import PromptInput

CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


# --- Ctrl+G twice -------------------------------------------------------------------------------------


async def test_ctrl_g_twice_after_a_reply_keeps_the_app_and_the_draft():
    """Two Ctrl+G in one read of the terminal (tmux's send-keys, or a paste holding two BEL characters)
    both name the last turn; the second finds it gone and does nothing."""
    app = scripted_app()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hi there")
        await reply_done(pilot)
        for _ in range(2):  # as the driver posts keys it read together: no pause between them
            app.post_message(events.Key("ctrl+g", None))
        await pilot.pause()
        await pilot.pause()
        assert app.is_running and screen.session.turns == []
        assert not screen.query(UserMessage) and not screen.query(ReplyMessage)
        assert screen.query_one(PromptInput).text == "Hi there"


# --- a bug in the app ---------------------------------------------------------------------------------


def test_a_bug_in_the_app_is_one_line_and_a_failing_status_with_the_traceback_in_the_log(tiny_model):
    """The real `tui-chat` (watcher and app) on a pseudo-terminal, with an action that raises an error whose
    message is a hundred thousand characters long, as the repr of a turn with its token record was."""
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "tui-chat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'default_model = "{tiny_model}"\n')
    script = ("import sys\nfrom tui_chat.cli import entry\nfrom tui_chat.ui.chat.conversation import ConversationRoom\n"
              "def regenerate(self, how):\n    raise ValueError('Turn(' + 'x' * 100_000 + ') is not in list')\n"
              "ConversationRoom.action_reply = regenerate\nsys.exit(entry())\n")
    terminal = Terminal([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while b"Type a message" not in terminal.read(0.2) and time.monotonic() < deadline:
            pass
        os.write(terminal.master, b"\x12")  # Ctrl+R
        assert terminal.wait() == 1
    finally:
        terminal.close()
    after = CSI.sub("", terminal.output.rpartition(b"\x1b[?1049l")[2].decode("utf-8", "replace"))
    [line] = [line for line in after.split("\r\n") if line.strip()]
    log = log_dir() / LOG_NAME
    assert line.startswith("tui-chat: the app crashed with ValueError in regenerate (<string>): Turn(xxx")
    assert line.endswith(f"…. The chat so far is kept; details in {log}") and len(line) < 400
    assert b"Traceback" not in terminal.output and b"x" * 1000 not in terminal.output
    logged = log.read_text()
    assert "Traceback (most recent call last)" in logged and "ValueError: Turn(" in logged


# --- a data dir that takes no writes --------------------------------------------------------------------


def test_the_models_registry_is_lost_quietly_where_nothing_can_be_written(tmp_path):
    """Where the models dir cannot be written, even removing the unfinished registry file fails (on a
    read-only file system with EROFS; here, as root meets it too, under a plain file with ENOTDIR)."""
    in_the_way = tmp_path / "a file"
    in_the_way.write_text("where the data dir should be")
    record_pull(in_the_way / "models", parse_ref("owner/name:model-Q4_K_M.gguf"), "0123abcd")
    assert in_the_way.read_text() == "where the data dir should be"


# --- a theme the config names that is not there ---------------------------------------------------------


async def test_an_unknown_theme_in_the_config_is_said_on_the_chat_screen_and_the_apps_own_default_is_used():
    app = scripted_app(theme="no-such-theme")
    async with app.run_test(size=(100, 32), notifications=True) as pilot:
        await loaded(pilot)
        await pilot.pause()
        shown = [str(toast.render()) for toast in app.screen.query(Toast)]
        assert app.theme == DEFAULT_THEME
    said = (f"theme 'no-such-theme' in {config_path()} is not a theme tui-chat knows: using {DEFAULT_THEME} "
            "(Ctrl+P, then Theme, lists them)")
    assert [note for note in shown if "no-such-theme" in note] == [said]
