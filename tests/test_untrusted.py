"""Untrusted text (model output, server answers, hub and file names, chat titles) on every surface that
shows it: what reaches the terminal shows markup as written and carries no control sequence of its own.

"What reaches the terminal" is the whole screen as Textual would write it (`render_segments`), so a
raw ESC, an OSC 8 hyperlink made from a Markdown link, or a bidi override anywhere on screen fails.
"""

from __future__ import annotations

import ast
import os
import pty
import shutil
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from textual import events
from textual.widgets import Input, OptionList
from textual.widgets._toast import Toast

import tui_chat.ui
from fake_openai import BEHAVIOURS, fake_server
from hostile import FILE_SAFE, HOSTILE, MARKUP, SHOWN, SHOWN_CANDIDATES, unsafe_in
from test_history_ui import chats_open
from test_models_screen import open_models
from test_ui import SIZE, finished_reply, loaded, make_app, reply_done, send, streaming_reply, wait_for
from tui_chat.config import RemoteProfile, history_path
from tui_chat.history import History
from tui_chat.safetext import terminal_safe
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.screens.ask import AskText
from tui_chat.ui.screens.inspector import InspectorScreen
from tui_chat.ui.widgets.prompt import PromptInput

WIDE = (230, 50)  # wide enough that no piece of HOSTILE wraps in the chat pane
SHOWN_FILE_SAFE = tuple(piece.replace("/", "∕") for piece in SHOWN if piece != r"a\x00b")


def terminal_output(app) -> str:
    """Everything the terminal is sent to draw the screen now: modals and notifications included."""
    return app.screen._compositor.render_full_update().render_segments(app.console)


def screen_lines(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def assert_literal_on_screen(app, shown=SHOWN, times: int = 1) -> None:
    lines = screen_lines(app)
    missing = [piece for piece in shown if sum(line.count(piece) for line in lines) < times]
    assert not missing, f"not shown as written: {missing}\n" + "\n".join(lines)
    assert unsafe_in(terminal_output(app)) == []


def plain(widget) -> str:
    return widget.render().plain


def toasts(app) -> str:
    return "\n".join(plain(toast) for toast in app.screen.query(Toast))


async def click_on(pilot, text: str, nth: int = 0) -> None:
    """Click the middle of the `nth` place the screen shows `text`."""
    places = [(line.index(text), y) for y, line in enumerate(screen_lines(pilot.app)) if text in line]
    assert len(places) > nth, f"{text!r} is not on screen {nth + 1} times"
    x, y = places[nth]
    await pilot.click(offset=(x + len(text) // 2, y))
    await pilot.pause()


def remote_app(server, model: str = ""):
    return make_app(f"@lab:{model}" if model else "@lab", remotes={"lab": RemoteProfile("lab", server.base_url)})


@asynccontextmanager
async def hostile_reply(model: str = "hostile"):
    """The app on the fake server's `model` (by default HOSTILE, word by word with probabilities),
    asked once; the reply finished."""
    with fake_server() as server:
        app = remote_app(server, model)
        async with app.run_test(size=WIDE, notifications=True) as pilot:
            await loaded(pilot)
            await send(pilot, "hi")
            yield pilot, await reply_done(pilot)


async def test_a_streamed_and_a_finished_reply_show_it_as_written():
    async with hostile_reply() as (pilot, reply):
        app = pilot.app
        assert reply.text == HOSTILE
        assert_literal_on_screen(app)
        streaming = streaming_reply()
        await app.screen.query_one("#log").mount(streaming)
        for start in range(0, len(HOSTILE), 3):  # pieces that cut escape sequences in two
            await streaming.append(HOSTILE[start : start + 3])
        await wait_for(pilot, lambda: "\n".join(screen_lines(app)).count("a\\x00b") == 2)
        assert_literal_on_screen(app, times=2)
        await click_on(pilot, "[@click=app.quit]quit[/]")
        assert app.is_running, "markup in a reply is not an action"


async def test_markdown_links_in_a_reply_show_their_target_and_open_nothing():
    """A Markdown link is honest formatting, but its text may lie about where it goes: the finished
    reply shows the target, and no terminal hyperlink (OSC 8) or click opens it."""
    link = "See [the docs](https://evil.example/x) or <https://evil.example/y>."
    with fake_server() as server:
        app = remote_app(server, "words")
        async with app.run_test(size=WIDE, notifications=True) as pilot:
            screen = await loaded(pilot)
            opened: list[str] = []
            app.open_url = lambda url, **kwargs: opened.append(url)
            streaming, finished = streaming_reply(), finished_reply(link)
            await screen.query_one("#log").mount(streaming, finished)
            await streaming.append(link)
            await wait_for(pilot, lambda: "\n".join(screen_lines(app)).count("the docs") == 2)
            assert "the docs (https://evil.example/x)" in "\n".join(screen_lines(app))
            assert unsafe_in(terminal_output(app)) == [], "no OSC 8 hyperlink"
            for nth in range(2):  # the streamed reply, then the finished one
                await click_on(pilot, "the docs", nth)
            assert opened == []
            assert app.is_running


async def test_the_heatmap_and_the_inspector_show_tokens_and_candidates_as_written():
    async with hostile_reply() as (pilot, reply):
        app = pilot.app
        assert len(reply.reply.tokens) == len(HOSTILE.split(" "))
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert_literal_on_screen(app)
        reply.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, InspectorScreen))
        inspector = app.screen
        for index in range(len(reply.reply.tokens)):
            await pilot.pause()
            assert_literal_on_screen(app, SHOWN_CANDIDATES)
            assert inspector.index == index
            await pilot.press("right")
        facts = plain(inspector.query_one("#facts"))
        assert facts.startswith(r'" a\x00b"'), facts


async def test_the_metrics_panel_shows_a_servers_model_name_as_written():
    with fake_server(served=(HOSTILE, *BEHAVIOURS)) as server:
        app = remote_app(server)
        async with app.run_test(size=WIDE, notifications=True) as pilot:
            screen = await loaded(pilot)
            title = plain(screen.query_one(MetricsPanel).query_one("#model-title"))
            assert all(piece in title for piece in SHOWN), title
            assert unsafe_in(terminal_output(app)) == []
            await send(pilot, "hi")  # the server has no such model to chat with: its 404 quotes the name
            await wait_for(pilot, lambda: "No reply" in toasts(app))
            assert "[bold red]x[/]" in toasts(app)
            assert unsafe_in(terminal_output(app)) == []
            # "hi" is given back to the prompt and counted over HTTP: let the count land before the app quits
            await wait_for(pilot, lambda: "token" in plain(screen.query_one("#draft")))


async def test_the_metrics_panel_shows_a_model_file_name_as_written(tmp_path, tiny_model):
    model = tmp_path / f"{FILE_SAFE}.gguf"
    shutil.copyfile(tiny_model, model)
    app = make_app(str(model))
    async with app.run_test(size=WIDE, notifications=True) as pilot:
        screen = await loaded(pilot)
        title = plain(screen.query_one(MetricsPanel).query_one("#model-title"))
        assert all(piece in title for piece in SHOWN_FILE_SAFE), title
        assert unsafe_in(terminal_output(app)) == []


async def test_a_notification_quoting_a_file_name_shows_it_as_written(tmp_path, tiny_model):
    app = make_app(str(tmp_path / f"{FILE_SAFE}.gguf"))  # no such file: the error names it
    async with app.run_test(size=WIDE, notifications=True) as pilot:
        await wait_for(pilot, lambda: "Model not loaded" in toasts(app))
        shown = toasts(app)
        pieces = ("[bold red]x[∕]", "[@click=app.quit]quit[∕]", r"\x1b]0;pwned\x07")
        assert all(piece in shown for piece in pieces), shown
        assert unsafe_in(terminal_output(app)) == []
        status = plain(app.screen.query_one("#status"))
        assert "[bold red]x[∕]" in status and r"\u202egnp.exe" in status


async def test_a_server_error_mid_reply_is_shown_as_written():
    async with hostile_reply("hostile-error") as (pilot, reply):
        app = pilot.app
        assert reply.text == "Paris"
        await wait_for(pilot, lambda: "Reply cut short" in toasts(app))
        assert all(piece in toasts(app) for piece in MARKUP)
        assert_literal_on_screen(app)  # the footer quotes it too


async def test_the_models_screen_shows_local_and_hub_names_as_written(models, fake_hub, tiny_model):
    models.mkdir(parents=True)
    shutil.copyfile(tiny_model, models / f"{FILE_SAFE}.gguf")
    fake_hub.add_repo(f"evil/{FILE_SAFE}", {"model-Q4_K_M.gguf": b"GGUF"}, downloads=5)
    fake_hub.add_repo("evil/files", {"[bold red]x[∕] [@click=app.quit]quit[∕].gguf": b"GGUF"}, downloads=1)
    app = make_app(str(tiny_model))
    async with app.run_test(size=WIDE, notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_models(pilot)
        assert_literal_on_screen(app, ["[bold red]x[∕]", r"\x1b[2J"])
        await pilot.press("s", *"evil", "enter")
        await wait_for(pilot, lambda: screen.query_one("#repos").row_count == 2)
        assert_literal_on_screen(app, ["[bold red]x[∕]", r"\x1b[2J"])
        await pilot.press("enter")  # a repo name the hub API could never serve: the error quotes it
        await wait_for(pilot, lambda: "Listing" not in plain(screen.query_one("#hub-status")))
        assert_literal_on_screen(app, ["[bold red]x[∕]", r"\x1b[2J"])
        await pilot.press("down", "enter")  # evil/files: a file named with markup (control characters are refused)
        await wait_for(pilot, lambda: screen.query_one("#files").display)
        assert_literal_on_screen(app, ["[bold red]x[∕] [@click=app.quit]quit[∕]"])


async def test_the_chats_list_rename_box_and_notices_show_a_title_as_written(tiny_model):
    with History(history_path()) as history:
        chat = history.create(title=HOSTILE, model=str(tiny_model))
        history.add_user_message(chat, HOSTILE, None)
    app = make_app(str(tiny_model))
    async with app.run_test(size=WIDE, notifications=True) as pilot:
        await loaded(pilot)
        chats = await chats_open(pilot)
        assert chats.query_one(OptionList).option_count == 1
        assert_literal_on_screen(app)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, AskText))
        assert app.screen.query_one(Input).value == terminal_safe(HOSTILE), "the title, its controls made visible"
        assert unsafe_in(terminal_output(app)) == []
        await pilot.press("enter")  # saved unchanged: the title is not rewritten with the escapes
        await pilot.pause()
        assert [summary.title for summary in chats.shown] == [HOSTILE]
        await pilot.press("ctrl+d")
        await pilot.pause()
        assert "[@click=app.quit]quit[/]" in toasts(app)
        assert unsafe_in(terminal_output(app)) == []
        await click_on(pilot, "[@click=app.quit]quit[/]")
        assert app.is_running
        await pilot.press("enter")
        await wait_for(pilot, lambda: "Opened" in toasts(app))
        assert "[link=https://evil]click[/link]" in toasts(app)
        assert_literal_on_screen(app)


def read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other end closed
            return out
        if not chunk:
            return out
        out += chunk


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
def test_headless_output_is_made_safe_on_a_terminal_and_kept_whole_in_a_pipe(tty):
    with fake_server() as server:
        command = [sys.executable, "-m", "tui_chat", "run", "--backend", "openai", "--base-url", server.base_url,
                   "--model", "hostile", "-p", "hi"]
        if not tty:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            assert done.stdout == HOSTILE + "\n", "a script gets the text exactly"
            return
        primary, secondary = pty.openpty()
        process = subprocess.Popen(command, stdout=secondary, stderr=subprocess.PIPE)
        os.close(secondary)
        shown = read_all(primary).decode().replace("\r\n", "\n")
        os.close(primary)
        assert process.wait(timeout=60) == 0, process.stderr.read()
        process.stderr.close()
    assert all(piece in shown for piece in SHOWN), shown
    assert unsafe_in(shown) == [], shown


def test_every_notification_that_quotes_text_refuses_markup():
    """Textual reads a notification as markup unless told not to: `[@click=app.quit]` in an error
    message would be a button. A notify(...) call whose message is not a fixed string must say markup=False."""
    unguarded = []
    for path in Path(tui_chat.ui.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "notify"):
                continue
            passed_on = isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", "") == "super"
            fixed = passed_on or not node.args or isinstance(node.args[0], ast.Constant)
            refused = any(k.arg == "markup" and isinstance(k.value, ast.Constant) and k.value.value is False
                          for k in node.keywords)
            if not fixed and not refused:
                unguarded.append(f"{path.name}:{node.lineno}")
    assert unguarded == []


async def test_a_paste_into_the_message_box_drops_terminal_controls(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        prompt = screen.query_one(PromptInput)
        prompt.focus()
        await pilot.pause()
        prompt.post_message(events.Paste("look \x1b]0;pwned\x07at\r\nthis \u202egnp.exe [b]x[/b]"))
        await pilot.pause()
        assert prompt.text == "look at\nthis gnp.exe [b]x[/b]"
