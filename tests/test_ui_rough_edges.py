"""The chat screen's rough edges a new user met (issue 25): keys that did nothing where the focus was,
focus that was hard to steer, settings that did not stick with their chat, figures that did not add up.
Driven through Pilot on the real tiny model."""

from __future__ import annotations

import asyncio
import ctypes
import io
import re
from collections.abc import Callable
from dataclasses import replace as dataclass_replace

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text
from textual.actions import parse as parse_action
from textual.widgets import Input, Select, Sparkline, Static

from conftest import GREEDY, run_cli
from test_session import finish, new_session
from test_ui import (
    SIZE,
    assert_help_lists,
    chat,
    finished_reply,
    focused_slider,
    loaded,
    make_app,
    notified,
    reply_done,
    screen_open,
    send,
    wait_for,
)
from tui_chat.config import history_path
from tui_chat.engine.base import Candidate, EngineError, Message, TurnMetrics
from tui_chat.engine.context import fit_context
from tui_chat.engine.params import SamplingParams
from tui_chat.history import History
from tui_chat.pricing import format_usd
from tui_chat.safetext import screen_safe, terminal_safe
from tui_chat.session import Branch, Turn
from tui_chat.ui.chat.screen import ChatScreen
from tui_chat.ui.keys import CHAT_KEYS
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.panel.sampling import SETTINGS_SAVED_AFTER_S
from tui_chat.ui.screens.help import HelpScreen
from tui_chat.ui.widgets.chat_log import ChatLog
from tui_chat.ui.widgets.heatmap import REOPENED_NOTE
from tui_chat.ui.widgets.messages import ChatMessage, ReplyMessage, UserMessage
from tui_chat.ui.widgets.prompt import PromptInput

# --- keys ----------------------------------------------------------------------------------------------------


async def test_every_chat_key_works_from_the_message_box(tiny_model):
    """The message box (a TextArea) binds F6 and F7 itself: F7 once did nothing from it."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        ran: list[tuple[object, ...]] = []
        screen.action_room = lambda name, action, *argument: ran.append((name, action, *argument))  # every chat key's
        box = screen.query_one(PromptInput)
        for binding in CHAT_KEYS:
            # Esc stops a reply being written, else goes to the box
            screen.set_reactive(ChatScreen.reply, object() if binding.id == "stop" else None)
            box.focus()
            await pilot.pause()
            await pilot.press(binding.key)
            await pilot.pause()
            assert ran[-1:] == [parse_action(binding.action)[2]], f"{binding.key} from the message box"
            assert box.text == "", f"{binding.key} typed nothing"


async def test_thinking_on_a_model_that_does_not_think_says_so(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await pilot.press("f7")
        await pilot.pause()
        said = [message for message in notified(app) if "does not think" in message]
        assert len(said) == 1 and said[0].startswith("tiny does not think (its chat template names no thinking")
        assert screen.session.thinking is False, "the switch is still kept with the chat"
    run = run_cli("run", "-m", str(tiny_model), "-p", "Hi", "--max-tokens", "4", "--n-ctx", "512", "--thinking", "on")
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("does not think") == 1, run.stderr


# --- steering the focus ---------------------------------------------------------------------------------------


async def test_esc_with_no_reply_being_written_goes_back_to_the_message_box(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        slider = await focused_slider(pilot, "temperature")
        await pilot.press("1", "escape")
        assert screen.focused is slider and slider.typed is None, "Esc first drops a number being typed"
        await pilot.press("escape")
        assert screen.focused is screen.query_one(PromptInput)


async def test_tab_skips_the_messages_and_alt_arrows_walk_them(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chat(pilot, "One", "Two")
        box = screen.query_one(PromptInput)
        visited = []
        for _ in range(200):
            await pilot.press("tab")
            if screen.focused is box:
                break
            visited.append(screen.focused)
        assert screen.focused is box, "Tab comes back round to the message box"
        assert not [widget for widget in visited if isinstance(widget, ChatMessage)]
        messages = list(screen.query(ChatMessage))
        await pilot.press("alt+up")
        assert screen.focused is messages[-1], "Alt+↑ from the box: the latest message"
        await pilot.press("alt+up", "alt+up")
        assert screen.focused is messages[-3]
        assert messages[-3].styles.border_left[0] == "double", "the focused message is marked by shape too"
        assert messages[-2].styles.border_left[0] != "double"
        await pilot.press("tab")
        assert screen.focused is box, "Tab from a message goes on to the message box"
        await pilot.press("alt+up", "alt+down")
        assert screen.focused is box, "past the latest message, Alt+↓ comes back to the box"
        assert box.styles.border_top[0] == "heavy"


async def test_a_key_that_moves_a_slider_says_what_it_did(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await focused_slider(pilot, "repeat_penalty")
        await pilot.press("end")
        await pilot.pause()
        note = str(screen.query_one("#note-repeat_penalty").render())
        assert note.startswith("End: Repeat penalty → 2.00\n✓ Set"), note
        await pilot.press("left")
        await pilot.pause()
        assert str(screen.query_one("#note-repeat_penalty").render()).startswith("Left: Repeat penalty → 1.99\n")


async def test_f1_lists_the_keys_of_the_inspector_the_order_the_bias_list_and_the_chats(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await assert_help_lists(pilot, [("Token inspector", "x                      X-ray"),
                                        ("Token inspector", "enter                  Branch the reply here"),
                                        ("Sampler order", "shift+left, <          Move earlier"),
                                        ("Logit bias", "delete, backspace      Remove"),
                                        ("Saved chats", "ctrl+r                 Rename"),
                                        ("Chat", "escape                 Back to the message box"),
                                        ("Chat", "alt+up                 Focus the message above")])


# --- settings that stick with their chat ---------------------------------------------------------------------


def test_a_regenerate_or_a_branch_keeps_the_settings_it_was_written_with(tiny):
    with History(history_path()) as history:
        session = new_session(history)
        session.live.update(stop=["bread"])
        session.ask("Hello there", tiny.generate)
        finish(session)
        assert history.load(session.conversation_id).sampling.stop == ("bread",)
        session.live.update(stop=[])
        session.regenerate(tiny.generate)
        finish(session)
        assert history.load(session.conversation_id).sampling.stop == ()
        session.live.update(top_p=0.77)
        reply = session.turns[-1].reply
        session.branch(2, reply.tokens[2].top[1] if reply.tokens[2].top else Candidate(1, "x", 0.1), tiny.generate)
        finish(session)
        assert history.load(session.conversation_id).sampling.top_p == 0.77


async def test_a_setting_changed_after_the_last_reply_is_there_when_the_chat_reopens(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4, stop=("bread",)))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        stop = screen.query_one("#stop", Input)
        stop.focus()
        stop.value = ""
        await pilot.press("enter")
        slider = await focused_slider(pilot, "top_p")
        await pilot.press("pagedown")
        assert slider.value == 0.8
        conversation = screen.session.conversation_id
        await pilot.pause(SETTINGS_SAVED_AFTER_S)

        def saved() -> SamplingParams:
            with History(history_path()) as history:
                return history.load(conversation).sampling

        await wait_for(pilot, lambda: saved().stop == () and saved().top_p == 0.8, timeout=5)  # once they rest
        await pilot.press("left", "ctrl+n")  # at once: the change is still waiting to be saved
        await pilot.pause()
        assert screen.live.snapshot()[1].stop == ("bread",), "a new chat: the config's settings"
        await focused_slider(pilot, "top_p")
        await pilot.press("end")  # the new chat's, not the one before
    reopened = make_app(str(tiny_model), sampling=GREEDY)
    async with reopened.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await screen.rooms["chats"].open_conversation(conversation)
        await pilot.pause()
        params = screen.live.snapshot()[1]
        assert params.stop == () and params.top_p == 0.79
        assert screen.query_one("#stop", Input).value == ""


async def test_quitting_right_after_a_change_keeps_it(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        await focused_slider(pilot, "temperature")
        await pilot.press("end")
        conversation = screen.session.conversation_id
    with History(history_path()) as history:
        assert history.load(conversation).sampling.temperature == 2.0


# --- a long chat: reopened at its end, left at once ----------------------------------------------------------


def saved_long_chat(model: str, turns: int = 40) -> int:
    """A chat long enough to scroll, a regenerated reply every fifth turn."""
    with History(history_path()) as history:
        conversation = history.create(model=model, sampling=GREEDY)
        parent = None
        for n in range(turns):
            question = history.add_user_message(conversation, f"question {n}", parent)
            for branch in range(2 if n % 5 == 0 else 1):
                reply = history.start_reply(conversation, question)
                reply.finish(f"answer {n}.{branch}\n\n" + "word " * 60, "eos")
            parent = reply.id
        return conversation


async def test_a_long_chat_with_branches_reopens_at_its_latest_turn(tiny_model):
    conversation = saved_long_chat(str(tiny_model))
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        log = screen.query_one(ChatLog)
        for _ in range(2):  # the second time the log had been scrolled up by hand
            await screen.rooms["chats"].open_conversation(conversation)
            await pilot.pause(0.2)
            assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y
            assert log.messages()[-1].text.startswith("answer 39.0")
            log.scroll_home(animate=False)
            await pilot.pause()


async def test_a_new_chat_clears_the_old_one_at_once_and_fills_after(tiny_model, monkeypatch):
    """Under load, taking a hundred messages down takes seconds: the old chat must not stay on screen
    with its old title meanwhile."""
    conversation = saved_long_chat(str(tiny_model))
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await screen.rooms["chats"].open_conversation(conversation)
        await pilot.pause()
        taken_down = ChatLog.remove_children

        async def slowly(log, widgets):
            await asyncio.sleep(3.0)  # a busy machine (the pause below overran 1 s once, under the whole suite)
            await taken_down(log, widgets)

        monkeypatch.setattr(ChatLog, "remove_children", slowly)
        sparkline = screen.query_one("#decode-sparkline", Sparkline)
        sparkline.data = [30.0, 31.0]  # the old chat's decode rates
        new_chat = asyncio.create_task(screen.rooms["chats"].action_new_chat())  # as Ctrl+N, not waiting for it
        await pilot.pause(0.3)
        assert screen.query(UserMessage), "still being taken down"
        assert sparkline.data == []
        shown = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "question" not in shown and "answer" not in shown, "the old chat is off the screen at once"
        assert str(screen.query_one("#chat-title").render()).startswith("New chat · ")
        await new_chat
        assert not screen.query(UserMessage)


# --- what reads without colour, and figures that add up -------------------------------------------------------


async def test_stream_replies_reads_on_and_off_without_colour(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        box = screen.query_one("#stream")
        shown = {}
        for _ in range(2):
            shown[box.value] = box.render().plain
            box.toggle()
            await pilot.pause()
        assert "✓" in shown[True] and "✓" not in shown[False] and "X" not in shown[False]
        assert shown[True].replace("✓", "") == shown[False].replace(" ", "", 1), "only the mark differs"


async def test_the_heatmap_says_that_reopened_replies_stay_plain(tiny_model):
    conversation = saved_long_chat(str(tiny_model), turns=2)
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4), inspector_top=5)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        await pilot.press("ctrl+t")
        legend = screen.query_one("#legend")
        assert "Heatmap" in legend.render().plain and REOPENED_NOTE not in legend.render().plain
        await screen.rooms["chats"].open_conversation(conversation)
        await pilot.pause()
        assert REOPENED_NOTE in legend.render().plain.replace("\n", " ")
        screen.query(ReplyMessage).last().focus()
        await pilot.press("enter")
        assert f"Nothing to inspect. {REOPENED_NOTE}" in notified(app)


async def test_shrinking_the_terminal_puts_the_panels_figures_on_the_top_line_at_once(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hi")
        await reply_done(pilot)
        title = screen.query_one("#chat-title")
        assert "KV" not in str(title.render())
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        assert "tok/s · KV " in str(title.render()), "the panel is hidden: its key figures on top"
        await pilot.resize_terminal(120, 40)
        await pilot.pause(0.2)
        assert "KV" not in str(title.render())


EMOJI = ["\u26a0\ufe0f", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
         "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f469\U0001f3fd\u200d\U0001f4bb", "1\ufe0f\u20e3", "\U0001f3fd"]


def test_emoji_sequences_are_drawn_as_parts_every_terminal_measures_alike():
    """Rich counts an emoji sequence as one 2-cell grapheme; tmux 3.3 draws "⚠️" in 1 cell, "👍🏽" in 4
    (measured with its cursor): the row shifts over the panel. Drawn as parts, per code point and per
    grapheme agree."""
    for text in EMOJI:
        shown = screen_safe(text)
        assert cell_len(shown) == sum(cell_len(character) for character in shown) > 0 or not shown, ascii(text)
        assert terminal_safe(text) == text, "only what a widget draws: run's output and copies keep them"


async def test_a_reply_with_emoji_sequences_keeps_the_panels_edge_in_its_column(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        text = "Done " + " ".join(EMOJI) + " ok"
        await screen.query_one(ChatLog).mount(finished_reply(text))
        await pilot.pause(0.2)
        lines = [strip.text for strip in app.screen._compositor.render_strips()]
        [row] = [line for line in lines if "Done" in line]
        assert not any(character in row for character in "\u200d\ufe0f\U0001f3fd")
        assert cell_len(row) == sum(cell_len(character) for character in row) == SIZE[0]
        assert screen.query(ReplyMessage).last().text == text, "the reply itself keeps them (copy, history)"
        app.notify(f"Opened “{text}”")  # a chat's title in a notification: drawn over the rows too
        await pilot.pause()
        assert notified(app)[-1] == f"Opened “{screen_safe(text)}”"


async def test_the_panels_money_has_one_format_as_the_session_passes_a_cent(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        panel = screen.query_one(MetricsPanel)
        reply = TurnMetrics(prompt_tokens=1_000, completion_tokens=300)  # $0.0055 at GPT-4o's prices
        screen.query_one("#price", Select).value = "GPT-4o"
        screen.session.turns = [Turn(f"question {n}", [Branch("answer", "end of text", metrics=reply)])
                                for n in range(3)]
        panel.update_metrics(reply)
        await pilot.pause()
        figures = re.findall(r"\$[\d,.]+", str(screen.query_one("#cost").render()))
        assert "$0.005500" in figures and "$0.016500" in figures, figures
        assert all(re.fullmatch(r"\$[\d,]+\.\d{6}", figure) for figure in figures), figures


def test_a_branch_label_never_wraps_inside_its_keys():
    reply = ReplyMessage(Turn("question", [Branch("one", "end of text"), Branch("two", "end of text")], active=1))
    label = reply._branch_label()
    assert label.endswith("branch 2/2 ([/])")
    for width in range(8, 40):
        console = Console(width=width, file=io.StringIO())
        console.print(Text("end of text · 6 tokens · 97.1 tok/s" + label))
        lines = console.file.getvalue().splitlines()
        assert any(line.strip().endswith("([/])") or line.strip() == "([/])" for line in lines), (width, lines)


async def test_the_delete_prompt_counts_one_turn_after_it_in_the_singular(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        for text in ("One", "Two", "Three"):
            await send(pilot, text)
            await reply_done(pilot)
        for index, said in [(1, "Delete this message and the turn after it?"),
                            (0, "Delete this message and the 2 turns after it?"), (2, "Delete this message?")]:
            screen.query(UserMessage)[index].focus()
            await pilot.pause()
            await pilot.press("delete")
            # by its text, not by a count: an earlier note may time out as this one comes (seen in CI)
            await wait_for(pilot, lambda said=said: any(note.startswith(said) for note in notified(app)))


async def test_a_deleted_turns_reply_leaves_the_panels_chat_cost(tiny_model):
    """The panel sums the chat's replies (issue 26): a turn deleted takes its reply's cost with it, at once (what
    the session spent stays: issue 44)."""
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=4))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chat(pilot, "One", "Two")
        panel = screen.query_one(MetricsPanel)

        def session_line() -> str:
            return next(line for line in str(panel.query_one("#cost").render()).splitlines()
                        if line.startswith("Chat"))

        both = session_line()
        screen.query(UserMessage)[1].focus()
        await pilot.press("delete", "delete")
        await wait_for(pilot, lambda: len(screen.session.turns) == 1)
        await pilot.pause()
        assert session_line() != both and session_line() == f"Chat     {format_usd(panel.chat_cost(), fine=True)}"
        assert len(screen.session.spent()) == 1


def test_the_context_size_in_an_error_has_thousands_separators():
    with pytest.raises(EngineError, match="needs 5,000 tokens with the system prompt, but the context holds 4,096"):
        fit_context([Message("user", "long")], lambda _messages: 5_000, 4_096, 100)
    with pytest.raises(EngineError, match="the context holds 4,096: shorten the message"):
        fit_context([Message("user", "long")], lambda _messages: 3_500, 4_096, 1_000)


async def test_a_copied_reply_has_no_blank_lines_or_spaces_around_it(tiny_model, monkeypatch):
    copied = []
    monkeypatch.setattr("tui_chat.ui.widgets.messages.copy", lambda _app, text, _file: copied.append(text) or "Copied")
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await screen.query_one(ChatLog).mount(finished_reply("\n\n  Paris is the capital.  \n"))
        await pilot.press("f3")
        assert copied == ["Paris is the capital."]


WIDE_SCRIPTS = ["नमस्ते दुनिया रीत क्षि", "বাংলা স্ত্রী ভাষা", "ເລື່ອງ ກ່ ພາສາລາວ", "தமிழ் கா", "ไทย น้ำ"]


def _wcwidth() -> Callable[[str], int]:
    """The C library's wcwidth under a UTF-8 locale: how tmux, xterm and VTE measure a character."""
    libc = ctypes.CDLL(None)
    libc.setlocale.restype = ctypes.c_char_p
    if libc.setlocale(6, b"C.UTF-8") is None:  # LC_ALL
        pytest.skip("no C.UTF-8 locale to measure with")
    return lambda character: libc.wcwidth(ctypes.c_wchar(character))


async def test_a_reply_in_wide_scripts_keeps_the_panels_edge_in_its_column(tiny_model):
    """Issue 38: Devanagari, Bengali and Lao in a reply pushed the panel's edge off those rows in tmux: Rich
    measured a spacing mark (ी, ি) as 0 cells, the terminal as 1. Every row is as wide as the terminal draws it."""
    wcwidth = _wcwidth()
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await screen.query_one(ChatLog).mount(finished_reply("\n\n".join(WIDE_SCRIPTS)))
        await pilot.pause(0.2)
        rows = [strip.text for strip in app.screen._compositor.render_strips()]
        written = [row for row in rows if any(ord(character) > 0x900 for character in row)]
        assert len(written) >= len(WIDE_SCRIPTS)
        for row in written:
            assert sum(max(wcwidth(character), 0) for character in row) == SIZE[0], row


async def test_at_80x24_the_panels_facts_break_between_parts_f1_wraps_under_its_descriptions_toasts_stay_whole(
        tiny_model):
    """Issue 38: the panel's `… · 1` / `thread` broke a fact in two; F1's wrapped descriptions restarted at
    column 0; a long toast was cut at 40 columns."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        screen = await loaded(pilot)
        await pilot.press("f2")
        await pilot.pause(0.3)
        facts = screen.query_one("#model-facts", Static)
        lines = str(facts.render()).splitlines()
        assert all(len(line) <= facts.content_size.width for line in lines), lines
        assert not any(line.strip() in ("thread", "threads", "MiB KV") for line in lines), lines
        panel = screen.query_one(MetricsPanel)
        amx = "AVX-512 · AMX off (self-test crashed)"  # issue 44: broke as `… (crashed` / `its self-test)`
        panel.show_model(dataclass_replace(panel.info, cpu=amx))
        await pilot.pause(0.1)
        parts = {panel.info.quantization, "CPU AVX-512", "AMX off (self-test crashed)"}
        hardware = [line for line in str(facts.render()).splitlines() if "AVX-512" in line or "AMX" in line]
        assert hardware and all(set(line.split(" · ")) <= parts | {line.split(" · ")[-1]} for line in hardware)
        assert all(len(line) <= facts.content_size.width for line in hardware), (hardware, facts.content_size.width)
        await pilot.press("f2", "f1")
        help_screen = await screen_open(pilot, HelpScreen)
        text = str(help_screen.query_one(Static).render()).splitlines()
        indented = [line for line in text if line.startswith(" ")]
        assert any(line.startswith(" " * 25) for line in indented), "some descriptions wrap at 80 columns"
        assert all(line.startswith(" " * 25) or line[2] != " " for line in indented), "under their description"
        assert max(len(line) for line in text) <= help_screen.query_one(Static).content_size.width
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen)
        app.notify("A long line of a notification that says what happened and what to do next, in words " * 2)
        await wait_for(pilot, lambda: bool(screen.query("Toast")))
        await pilot.pause(0.2)
        assert screen.query_one("Toast").size.width > 40
