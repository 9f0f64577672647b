"""Tools in the chat, driven through Pilot on real parts: the real starter model, the real `mcp-server-time`
from PyPI, and a server that does not start. The Tools screen (F9) lists the servers and their tools and
switches them on for the chat; the consent dialog runs a call once, always, or not at all; each call is a
folded block in the reply. Greedy decoding with `required`: the model's first step is a call."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from textual.widgets import Select, Static, Switch

from conftest import GREEDY, TIME
from test_ui import SIZE, assert_help_lists, loaded, make_app, screen_open, send, wait_for
from tui_chat.config import config_path, history_path
from tui_chat.engine.base import ToolCall
from tui_chat.history import History
from tui_chat.session import Branch, Turn, turns_of
from tui_chat.tools.settings import McpSettings, ServerSpec
from tui_chat.ui.chat.screen import ChatScreen
from tui_chat.ui.screens.consent import ConsentScreen
from tui_chat.ui.screens.conversations import ConversationsScreen
from tui_chat.ui.screens.inspector import InspectorScreen
from tui_chat.ui.screens.tools import ToolsScreen
from tui_chat.ui.widgets.chat_log import ChatLog
from tui_chat.ui.widgets.messages import ReplyMessage
from tui_chat.ui.widgets.tool_calls import DRAWN_RESULT, ToolCallBlock

BROKEN = ServerSpec("broken", "tui-chat-no-such-server")
QUESTION = "What time is it in Tokyo?"


def tools_app(starter_model, *servers: ServerSpec):
    return make_app(str(starter_model), sampling=GREEDY.with_changes(max_tokens=48),
                    mcp=McpSettings({spec.name: spec for spec in servers or (TIME,)}))


def shown(widget: Static) -> str:
    return "\n".join("".join(s.text for s in widget.render_line(y)).rstrip() for y in range(widget.size.height))


async def toggle(pilot, switch: Switch) -> None:
    """A switch flipped as a keyboard user does: focused, then Enter."""
    switch.focus()
    await pilot.press("enter")


async def time_tools_on(pilot, choice: str = "required") -> None:
    """The time server's tools on for the chat, as the Tools screen turns them on (started here: a test may
    wait)."""
    screen = await loaded(pilot)
    workspace = screen.workspace
    tools = workspace.start_tool_server("time")
    workspace.use_tools(tools, choice)


async def answered(pilot, button: str) -> tuple[ReplyMessage, list[str]]:
    """The reply to QUESTION, every consent it asks for answered with `button`; the dialogs' texts."""
    chat = pilot.app.screen
    await send(pilot, QUESTION)
    asked: list[str] = []
    while not (chat.reply is None and chat.query(ReplyMessage)):
        if isinstance(pilot.app.screen, ConsentScreen):
            dialog = pilot.app.screen
            await pilot.pause()
            asked.append(shown(dialog.query_one("#what", Static)))
            if button == "escape":
                await pilot.press("escape")
            else:
                await pilot.click(f"#{button}")
            await wait_for(pilot, lambda dialog=dialog: pilot.app.screen is not dialog)
        await pilot.pause(0.05)
    await pilot.pause()
    return chat.query(ReplyMessage).last(), asked


async def test_the_tools_screen_lists_the_servers_tools_and_switches_them_on_for_the_chat(starter_model):
    app = tools_app(starter_model, TIME, BROKEN)
    async with app.run_test(size=SIZE) as pilot:
        chat = await loaded(pilot)
        await pilot.press("f9")
        screen = await screen_open(pilot, ToolsScreen)
        await wait_for(pilot, lambda: "tool" in shown(screen.query_one("#state-0", Static))
                       and "-error" in screen.query_one("#state-1", Static).classes)
        assert shown(screen.query_one("#state-0", Static)) == "2 tools"
        failed = " ".join(shown(screen.query_one("#state-1", Static)).split())  # one line, wrapped to the width
        assert failed.startswith("MCP server 'broken' (tui-chat-no-such-server) did not start: no such program")
        assert {tool.name for tool in screen.tools.values()} == {"get_current_time", "convert_time"}
        assert chat.workspace.chat_tools is None  # off until switched on

        # Switched from the keyboard: a click is placed by the last layout, which under a loaded CI machine had not
        # yet followed the rows mounted beside the switch (the click went astray once in a whole suite).
        await toggle(pilot, screen.query_one("#server-0", Switch))
        await wait_for(pilot, lambda: all(switch.value for switch in screen.tools) and chat.workspace.chat_tools
                       and len(chat.workspace.chat_tools.tools) == 2)
        assert {tool.name for tool in chat.workspace.chat_tools.tools} == {"get_current_time", "convert_time"}
        screen.query_one("#choice", Select).value = "get_current_time"
        await wait_for(pilot, lambda: chat.workspace.chat_tools.choice == "get_current_time")

        convert = next(switch for switch, tool in screen.tools.items() if tool.name == "convert_time")
        await toggle(pilot, convert)
        await wait_for(pilot, lambda: [tool.name for tool in chat.workspace.chat_tools.tools] == ["get_current_time"])
        assert screen.query_one("#server-0", Switch).value  # on while one of its tools is
        get_time = next(switch for switch in screen.tools if switch is not convert)
        await toggle(pilot, get_time)
        await wait_for(pilot, lambda: chat.workspace.chat_tools is None
                       and not screen.query_one("#server-0", Switch).value)

        await pilot.press("escape")
        await screen_open(pilot, type(chat))


async def test_run_once_runs_the_call_and_the_reply_shows_it_folded(starter_model):
    app = tools_app(starter_model)
    async with app.run_test(size=SIZE) as pilot:
        await time_tools_on(pilot)
        reply, asked = await answered(pilot, "once")
        assert asked and asked[0].splitlines() == ["Server: time", "Tool:   get_current_time"]
        block = reply.query(ToolCallBlock).first()
        call = block.call
        assert call.approved and call.result is not None and call.name == "get_current_time"
        folded = shown(block)
        whole = (f"▸ tool time/get_current_time · {call.ms:,.0f} ms · {len(call.result):,} characters · "
                 f"{json.dumps(call.arguments)}")
        assert len(folded.splitlines()) == 1 and whole.startswith(folded.removesuffix("…"))  # cut at the width
        assert folded.startswith(whole[:55])
        block.focus()
        await pilot.press("enter")
        await pilot.pause()
        unfolded = shown(block)
        assert unfolded.startswith("▾ tool") and "arguments:" in unfolded
        assert json.loads(call.result)["datetime"] in unfolded  # the whole result
        assert reply.reply.tool_calls[0] is call
        m = reply.reply.metrics
        assert m.tool_call_tokens > 0 and m.tool_result_tokens > 0
        tokens = shown(pilot.app.screen.query_one("#tokens", Static))
        assert f"\nTools    in {m.tool_result_tokens:,} · out {m.tool_call_tokens:,}\n" in tokens
        assert "\n  of it calls $" in shown(pilot.app.screen.query_one("#cost", Static))  # billed as output

        _, again = await answered(pilot, "once")
        assert again  # once is for that call only: the next one asks again


async def test_always_asks_once_for_that_tool_in_this_chat(starter_model):
    app = tools_app(starter_model)
    async with app.run_test(size=SIZE) as pilot:
        await time_tools_on(pilot)
        reply, asked = await answered(pilot, "always")
        tools = [text.split()[-1] for text in asked]
        assert tools[0] == "get_current_time" and len(set(tools)) == len(tools)  # each tool asked about once
        assert all(call.approved for call in reply.reply.tool_calls)
        assert pilot.app.screen.workspace.chat_tools.always == set(tools)
        reply, asked = await answered(pilot, "always")
        assert asked == [] and reply.reply.tool_calls and all(call.approved for call in reply.reply.tool_calls)


async def test_deny_and_escape_run_nothing_and_the_reply_goes_on(starter_model):
    app = tools_app(starter_model)
    async with app.run_test(size=SIZE) as pilot:
        await time_tools_on(pilot)
        for button in ("deny", "escape"):
            reply, asked = await answered(pilot, button)
            assert asked
            calls = reply.reply.tool_calls
            assert len(calls) == len(asked) == len(reply.query(ToolCallBlock))
            assert not any(call.approved or call.result is not None for call in calls)
            call = calls[0]
            assert "not approved" in (call.error or "")
            assert shown(reply.query(ToolCallBlock).first()).startswith(f"▸ tool time/{call.name} · not run: not")
            assert reply.finished


async def test_f1_lists_the_tools_key_the_call_block_and_the_consent_dialog(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await assert_help_lists(pilot, [
            ("Chat", "f9                     Tools"),
            ("A reply's tool call", "enter                  Show or hide the call's arguments"),
            ("Asked to run a tool", "escape                 Deny: the model is told"),
        ])


async def test_a_call_block_and_the_consent_dialog_show_hostile_text_literally(tiny_model):
    """Arguments are the model's and results the server's: escapes visible, no markup, a huge result drawn in part."""
    hostile = {"text": "[b]bold[/b] \x1b]0;owned\x07 \u202egnp.exe"}
    call = ToolCall("faults", "echo", hostile, approved=True, result="x" * (DRAWN_RESULT + 5), ms=3.0)
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        chat = await loaded(pilot)
        reply = ReplyMessage(Turn("question", [Branch("answer", "end of text", tool_calls=[call])]))
        await chat.query_one(ChatLog).mount(reply)
        await pilot.pause()
        block = reply.query_one(ToolCallBlock)
        assert shown(block).startswith("▸ tool faults/echo · 3 ms · 100,005 characters · {")
        block.focus()
        await pilot.press("enter")
        await pilot.pause()
        unfolded = shown(block)
        assert '"text": "[b]bold[/b] \\u001b]0;owned\\u0007 \\u202egnp.exe"' in unfolded  # JSON escapes; bidi shown
        assert unfolded.endswith("… 5 more characters not drawn")

        answer: concurrent.futures.Future[str] = concurrent.futures.Future()
        app.push_screen(ConsentScreen(call, answer))
        dialog = await screen_open(pilot, ConsentScreen)
        assert "\\u001b]0;owned\\u0007 \\u202egnp.exe" in shown(dialog.query_one("#arguments Static", Static))
        assert pilot.app.focused is dialog.query_one("#deny")  # a stray Enter says no
        await pilot.press("enter")
        assert answer.result(timeout=5) == "deny"
        await screen_open(pilot, type(chat))


async def test_the_first_key_on_the_tools_screen_reaches_the_servers_switch(starter_model):
    """The switch is disabled while its server starts, so the screen's first focus passes it by; once the
    server lists its tools the focus moves to it, and Space (a keyboard user's first key) turns it on."""
    app = tools_app(starter_model)
    async with app.run_test(size=SIZE) as pilot:
        chat = await loaded(pilot)
        await pilot.press("f9")
        screen = await screen_open(pilot, ToolsScreen)
        await wait_for(pilot, lambda: screen.focused is screen.query_one("#server-0", Switch))
        await pilot.press("space")
        await wait_for(pilot, lambda: chat.workspace.chat_tools is not None
                       and len(chat.workspace.chat_tools.tools) == 2)


async def test_reopening_the_tools_screen_keeps_the_chats_tools_and_choice(starter_model):
    """Found in tmux: F9, the server on, `required`, Esc; F9 again to look, Esc; the question then got a plain
    reply, no consent asked and no call: the choice list announces its value when it is mounted, before any
    server has listed its tools again, and that change was applied as "no tool on"."""
    app = tools_app(starter_model)
    async with app.run_test(size=SIZE) as pilot:
        chat = await loaded(pilot)
        for choice in ("required", "get_current_time"):
            await pilot.press("f9")
            screen = await screen_open(pilot, ToolsScreen)
            await wait_for(pilot, lambda screen=screen: screen.focused is screen.query_one("#server-0", Switch))
            if chat.workspace.chat_tools is None:
                await pilot.press("space")
                await wait_for(pilot, lambda: chat.workspace.chat_tools is not None)
            screen.query_one("#choice", Select).value = choice
            await wait_for(pilot, lambda choice=choice: chat.workspace.chat_tools.choice == choice)
            await pilot.press("escape")
            await screen_open(pilot, type(chat))

            await pilot.press("f9")  # only to look
            screen = await screen_open(pilot, ToolsScreen)
            await wait_for(pilot, lambda screen=screen: len(screen.tools) == 2)
            await pilot.pause()
            assert all(switch.value for switch in screen.tools)
            assert screen.query_one("#choice", Select).value == choice
            await pilot.press("escape")
            await screen_open(pilot, type(chat))
            use = chat.workspace.chat_tools
            assert use is not None and len(use.tools) == 2 and use.choice == choice

        reply, asked = await answered(pilot, "escape")
        assert asked and asked[0].splitlines()[-1] == "Tool:   get_current_time"
        assert reply.query(ToolCallBlock)


async def test_a_calls_tokens_show_in_the_heatmap_and_open_the_inspector_and_consent_is_timed_apart(starter_model):
    """The call's step, drawn token by token under the heatmap in its unfolded block (every token under the
    grammar: `required`), picked with → and inspected with `i`; the user's 0.5 s before saying yes is shown
    apart from TTFT, in the panel and the footer."""
    app = tools_app(starter_model)
    async with app.run_test(size=SIZE) as pilot:
        await time_tools_on(pilot)
        chat = pilot.app.screen
        sent = time.perf_counter()
        await send(pilot, QUESTION)
        dialog = await screen_open(pilot, ConsentScreen)
        asked = time.perf_counter() - sent  # the model's first token came before this
        await pilot.pause(0.5)
        await pilot.click("#once")
        await wait_for(pilot, lambda: pilot.app.screen is not dialog)
        while not (chat.reply is None and chat.query(ReplyMessage)):  # any later call: at once
            if isinstance(pilot.app.screen, ConsentScreen) and pilot.app.screen.query("#once"):
                await pilot.click("#once")  # a dialog being mounted or dismissed has no buttons yet, or no more
            await pilot.pause(0.05)
        await pilot.pause()
        reply = chat.query(ReplyMessage).last()
        m = reply.reply.metrics
        assert m.consent_s >= 0.45 and m.ttft_s is not None and m.ttft_s < asked
        assert f"Consent  {m.consent_s:.2f} s waited" in shown(chat.query_one("#speed", Static))
        assert f"waited {m.consent_s:.1f} s for consent" in reply.reply.footer

        block = reply.query(ToolCallBlock).first()
        tokens = block.call.tokens
        assert tokens and all(token.prob is not None and token.grammar is not None for token in tokens)
        await pilot.press("ctrl+t")
        block.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert block.heat_shown
        drawn = shown(block)
        assert 'as the model wrote it:' in drawn and '"name": "get_current_time"' in drawn
        await pilot.press("right", "i")
        inspector = await screen_open(pilot, InspectorScreen)
        assert inspector.tokens is tokens and inspector.index == 1


FAULTS = ServerSpec("faults", sys.executable, (str(Path(__file__).parent / "mcp_faults.py"),))


def faults_app(starter_model):
    return make_app(str(starter_model), sampling=GREEDY.with_changes(max_tokens=48),
                    mcp=McpSettings({"faults": FAULTS}, call_timeout_s=30))


async def hang_asked(pilot) -> ChatScreen:
    """The fault server's `hang` on, its first call asked for (the consent dialog up)."""
    screen = await loaded(pilot)
    tools = screen.workspace.start_tool_server("faults")
    screen.workspace.use_tools(tools, "hang")
    await send(pilot, "Wait for me")
    await screen_open(pilot, ConsentScreen)
    return screen


async def test_esc_during_a_running_call_cancels_it_and_the_turn_stays_with_the_call(starter_model):
    """Issue 38: Esc did nothing while a call ran; at the timeout the whole turn vanished, call and all."""
    async with faults_app(starter_model).run_test(size=SIZE) as pilot:
        screen = await hang_asked(pilot)
        await pilot.click("#once")
        writing = screen.session.writing
        await wait_for(pilot, lambda: bool(writing.tool_calls) and writing.tool_calls[-1].approved)  # running
        await pilot.pause(0.3)
        pressed = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.reply is None)
        assert time.monotonic() - pressed < 2, "within a second or so, not at the 30 s timeout"
        [turn] = screen.session.turns
        [call] = turn.reply.tool_calls
        assert call.name == "hang" and call.approved and call.error == "cancelled: the reply was stopped while it ran"
        assert screen.view.prompt.text == "" and screen.query(ReplyMessage), "the turn stays on screen"
        folded = shown(screen.query(ToolCallBlock).first())
        assert folded.startswith("▸ tool faults/hang · ") and " ms · error: cancelled: the reply" in folded
        [conversation] = [History(history_path()).load(summary.id) for summary in
                          History(history_path()).conversations()]
        assert conversation.path[-1].tool_calls[0].error == call.error


async def test_a_call_waiting_for_consent_is_kept_when_the_app_is_killed(starter_model):
    """Issue 38: after a kill -9 during consent the reply reopened as `(no text)` with no trace of its call.
    The call is saved as it is asked; a reply whose writer is gone reopens with it, never run."""
    async with faults_app(starter_model).run_test(size=SIZE) as pilot:
        screen = await hang_asked(pilot)
        conversation_id = screen.session.conversation_id
        history = History(history_path())
        reply = history.load(conversation_id).path[-1]
        assert reply.state == "streaming" and [call.name for call in reply.tool_calls] == ["hang"]
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()  # a process that no longer exists
        with sqlite3.connect(history_path()) as db:
            db.execute("UPDATE messages SET writer = ? WHERE id = ?", (f"{socket.gethostname()}:{gone}", reply.id))
        reopened = turns_of(history.load(conversation_id))[-1].reply
        [call] = reopened.tool_calls
        assert call.name == "hang" and not call.approved and call.result is None
        assert call.error == "never run: the app stopped while it waited for consent"
        await pilot.press("escape")


async def test_a_chats_tools_and_choice_come_back_with_it(tiny_model):
    """Issue 38: a reopened chat had its tool switches and tool choice off again."""
    app = make_app(str(tiny_model), mcp=McpSettings({"time": TIME}))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        tools = screen.workspace.start_tool_server("time")
        screen.workspace.use_tools(tools[:1], "none")
        await send(pilot, "Hello there")
        await wait_for(pilot, lambda: screen.reply is None and screen.query(ReplyMessage))
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert screen.workspace.chat_tools is None, "a new chat starts with no tools"
        await pilot.press("ctrl+l")
        await screen_open(pilot, ConversationsScreen)
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.workspace.chat_tools is not None)
        use = screen.workspace.chat_tools
        assert [tool.name for tool in use.tools] == ["get_current_time"] and use.choice == "none"
        [stored] = History(history_path()).conversations()
        assert History(history_path()).load(stored.id).tools.on == (("time", "get_current_time"),)


async def test_f9_reads_servers_added_to_the_config_while_the_app_runs(tiny_model):
    """Issue 38: a server added to config.toml while the app ran: F9 said none is configured."""
    async with make_app(str(tiny_model)).run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("f9")
        screen = await screen_open(pilot, ToolsScreen)
        assert not screen.servers
        await pilot.press("escape")
        config_path().parent.mkdir(parents=True, exist_ok=True)
        config_path().write_text(f'[mcp.servers.time]\ncommand = {json.dumps(sys.executable)}\n'
                                 'args = ["-m", "mcp_server_time"]\n', encoding="utf-8")
        await pilot.pause()
        await pilot.press("f9")
        screen = await screen_open(pilot, ToolsScreen)
        assert screen.servers == ["time"]
        await wait_for(pilot, lambda: len(screen.tools) == 2)
