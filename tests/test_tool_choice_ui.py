"""Issue 44, item 14: with the server's switch off, F9's `required` sent a plain reply with no word that no tool
was on, and F9 reopened on `auto`. The choice stays the chat's, and both F9 and the reply say no tool is on."""

from __future__ import annotations

from textual.widgets import Select, Static, Switch

from conftest import TIME
from test_tools_ui import shown
from test_ui import SIZE, loaded, make_app, notified, reply_done, screen_open, send, wait_for
from tui_chat.tools.settings import McpSettings
from tui_chat.ui.screens.tools import ToolsScreen

NO_TOOL = "No tool is on for this chat: tool choice 'required' has nothing to call"


async def tools_listed(pilot) -> ToolsScreen:
    await pilot.press("f9")
    screen = await screen_open(pilot, ToolsScreen)
    await wait_for(pilot, lambda: len(screen.tools) == 2)
    await pilot.pause()
    return screen


async def test_required_with_no_tool_on_is_kept_and_said(tiny_model):
    app = make_app(str(tiny_model), mcp=McpSettings({"time": TIME}))
    async with app.run_test(size=SIZE) as pilot:
        chat = await loaded(pilot)
        screen = await tools_listed(pilot)
        assert not screen.query_one("#server-0", Switch).value
        note = screen.query_one("#no-tool", Static)
        assert not note.display, "auto with no tool on: nothing to say"
        screen.query_one("#choice", Select).value = "required"
        await wait_for(pilot, lambda: note.display)
        assert " ".join(shown(note).split()).startswith(NO_TOOL)
        await pilot.press("escape")
        await screen_open(pilot, type(chat))

        screen = await tools_listed(pilot)
        assert screen.query_one("#choice", Select).value == "required", "the choice stays the chat's"
        assert screen.query_one("#no-tool", Static).display
        await pilot.press("escape")
        await screen_open(pilot, type(chat))

        await send(pilot, "Hello there")
        await reply_done(pilot)
        assert chat.workspace.chat_tools is None
        assert any(line.startswith(NO_TOOL) for line in notified(app)), notified(app)


async def test_a_tool_switched_on_takes_the_kept_choice_and_the_note_goes(tiny_model):
    app = make_app(str(tiny_model), mcp=McpSettings({"time": TIME}))
    async with app.run_test(size=SIZE) as pilot:
        chat = await loaded(pilot)
        screen = await tools_listed(pilot)
        screen.query_one("#choice", Select).value = "required"
        await wait_for(pilot, lambda: screen.query_one("#no-tool", Static).display)
        await pilot.click("#server-0")
        await wait_for(pilot, lambda: chat.workspace.chat_tools is not None
                       and len(chat.workspace.chat_tools.tools) == 2)
        assert chat.workspace.chat_tools.choice == "required"
        assert not screen.query_one("#no-tool", Static).display


def test_a_tool_choice_made_with_no_tool_on_is_saved_with_the_chat(tmp_path):
    """Issue 44 item 14: reopened from Ctrl+L, such a chat's F9 showed `auto` again (nothing was saved)."""
    from tui_chat.history import History, ToolSwitches

    history = History(tmp_path / "history.sqlite3")
    try:
        chat = history.create(model="m", tools=ToolSwitches((), "required"))
        assert history.load(chat).tools == ToolSwitches((), "required")
        plain = history.create(model="m")
        assert history.load(plain).tools == ToolSwitches()
    finally:
        history.close()
