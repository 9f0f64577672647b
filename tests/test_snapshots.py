"""Every screen and dialog photographed, at 120x40 and at 80x24, on the scripted backend (the same reply and
figures on every machine). Paths, dates and the clock are fixed, so a picture changes only when the look does:
`pytest tests/test_snapshots.py --snapshot-update` after a change made on purpose, and look at the report."""

from __future__ import annotations

import concurrent.futures
import shutil
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from scripted import METRICS, REPLY, scripted_token
from test_ui import loaded, reply_done, screen_open, scripted_app, send
from tui_chat.config import history_path
from tui_chat.engine.base import ToolCall
from tui_chat.history import History
from tui_chat.session import Branch, Turn
from tui_chat.ui.screens.ask import AskText
from tui_chat.ui.screens.consent import ConsentScreen
from tui_chat.ui.screens.conversations import ConversationsScreen
from tui_chat.ui.screens.help import HelpScreen
from tui_chat.ui.screens.inspector import InspectorScreen
from tui_chat.ui.screens.lab import LabScreen
from tui_chat.ui.screens.models import ConfirmScreen, ModelsScreen
from tui_chat.ui.screens.open_model import OpenModelScreen
from tui_chat.ui.screens.tools import ToolsScreen
from tui_chat.ui.widgets.messages import ReplyMessage

SIZES = {"120x40": (120, 40), "80x24": (80, 24)}
FIXED = Path("/tmp/tui-chat-snapshots")  # shown in some screens (the config's path): the same in every run
QUESTION = "Name three colours of the rainbow."
ANSWER = "".join(piece for piece, _, _ in REPLY)
Surface = Callable[..., Awaitable[None]]


@pytest.fixture(autouse=True)
def fixed_places(monkeypatch: pytest.MonkeyPatch) -> None:
    """Config, data and state under one fixed, emptied folder; dates in UTC."""
    shutil.rmtree(FIXED, ignore_errors=True)
    for name, folder in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state")):
        monkeypatch.setenv(name, str(FIXED / folder))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


async def settle(pilot) -> None:
    """Every cursor steady (a blinking one makes the pictures differ), then a pause for the last layout."""
    for field in pilot.app.screen.query("Input, TextArea"):
        field.cursor_blink = False
    await pilot.pause(0.3)


async def reply_shown(pilot) -> None:
    await loaded(pilot)
    await send(pilot, QUESTION)
    await reply_done(pilot)


async def shown(pilot, turns: list[Turn]) -> None:
    """A chat of these turns on screen, as a reopened one is shown."""
    screen = await loaded(pilot)
    screen.session.turns = turns
    await screen.view.show(screen.session)


def scripted_branch(**fields) -> Branch:
    tokens = [scripted_token(index, 0) for index in range(len(REPLY))]
    return Branch(ANSWER, "end of text · 6 tokens · 60.0 tok/s · TTFT 0.05 s", tokens=tokens, metrics=METRICS,
                  model="scripted", **fields)


# --- the surfaces ------------------------------------------------------------------------------------------


async def empty_chat(pilot) -> None:
    await loaded(pilot)


async def after_a_reply(pilot) -> None:
    await reply_shown(pilot)


async def panel_toggled(pilot) -> None:
    await reply_shown(pilot)
    await pilot.press("f2")


async def heatmap(pilot) -> None:
    await reply_shown(pilot)
    await pilot.press("ctrl+t")
    pilot.app.screen.query(ReplyMessage).last().focus()
    await pilot.press("right", "right")


async def inspector(pilot) -> None:
    await heatmap(pilot)
    await pilot.press("enter")
    await screen_open(pilot, InspectorScreen)


async def drafted_underline(pilot) -> None:
    """Tokens the drafter guessed and the model kept, underlined in the heatmap."""
    branch = scripted_branch()
    branch.tokens = [replace(token, drafted=index in (2, 3, 4)) for index, token in enumerate(branch.tokens)]
    await shown(pilot, [Turn(QUESTION, [branch])])
    await pilot.press("ctrl+t")


async def thinking(pilot) -> None:
    await shown(pilot, [Turn(QUESTION, [scripted_branch(reasoning="The rainbow runs red, orange, yellow, green, "
                                                                  "blue, indigo, violet: the first three.",
                                                        thought="thought for 1.2 s · 18 tokens")])])


async def folded_tool_call(pilot) -> None:
    call = ToolCall("time", "get_current_time", {"timezone": "Asia/Tokyo"}, approved=True, ms=3.0,
                    result='{"timezone": "Asia/Tokyo", "datetime": "2026-11-29T07:00:00+09:00"}')
    await shown(pilot, [Turn("What time is it in Tokyo?", [scripted_branch(tool_calls=[call])])])


async def two_branches(pilot) -> None:
    await shown(pilot, [Turn(QUESTION, [scripted_branch(), scripted_branch(cut=2)], active=1)])


async def help_keys(pilot) -> None:
    await loaded(pilot)
    await pilot.press("f1")
    await screen_open(pilot, HelpScreen)


async def system_prompt(pilot) -> None:
    await loaded(pilot)
    await pilot.press("f6")
    await screen_open(pilot, AskText)


async def open_model(pilot) -> None:
    await loaded(pilot)
    await pilot.press("ctrl+o")
    await screen_open(pilot, OpenModelScreen)


async def models(pilot) -> None:
    await loaded(pilot)
    await pilot.press("f5")
    await screen_open(pilot, ModelsScreen)


async def saved_chats(pilot) -> None:
    with History(history_path()) as history:
        for title in ("Colours of the rainbow", "A haiku about rain", "The capital of France"):
            chat = history.create(model="scripted", title=title)
            history.add_user_message(chat, title, None)
        with sqlite3.connect(history_path()) as db:
            db.execute("UPDATE conversations SET created_at = 1795000000 + id * 86400, "
                       "updated_at = 1795000000 + id * 86400")
    await loaded(pilot)
    await pilot.press("ctrl+l")
    await screen_open(pilot, ConversationsScreen)


async def confirm_delete(pilot) -> None:
    await loaded(pilot)
    pilot.app.push_screen(ConfirmScreen("Delete gemma-3-270m-q4_k_m.gguf (253.1 MB) and its 2 saved KV caches?"))
    await screen_open(pilot, ConfirmScreen)


async def tools_none_configured(pilot) -> None:
    await loaded(pilot)
    await pilot.press("f9")
    await screen_open(pilot, ToolsScreen)


async def consent(pilot) -> None:
    await loaded(pilot)
    call = ToolCall("time", "get_current_time", {"timezone": "Asia/Tokyo"})
    pilot.app.push_screen(ConsentScreen(call, concurrent.futures.Future()))
    await screen_open(pilot, ConsentScreen)


async def lab(pilot) -> None:
    await reply_shown(pilot)
    await pilot.press("f10")
    await screen_open(pilot, LabScreen)
    await pilot.press("ctrl+r")


SURFACES: list[Surface] = [empty_chat, after_a_reply, panel_toggled, heatmap, inspector, drafted_underline, thinking,
                           folded_tool_call, two_branches, help_keys, system_prompt, open_model, models, saved_chats,
                           confirm_delete, tools_none_configured, consent, lab]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("surface", SURFACES, ids=[surface.__name__ for surface in SURFACES])
def test_snapshot(snap_compare, surface: Surface, size: str):
    async def before(pilot) -> None:
        await surface(pilot)
        await settle(pilot)

    assert snap_compare(scripted_app(), terminal_size=SIZES[size], run_before=before)
