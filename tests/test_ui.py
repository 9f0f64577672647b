"""The chat screen driven through Pilot, on the real tiny model and the real starter model."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from textual import events
from textual.widgets import Select

from conftest import GREEDY, ask
from scripted import ScriptedBackend
from tui_chat.commands.common import opener_for
from tui_chat.config import Config, config_path, history_path, load_config
from tui_chat.engine.base import Message, Stream
from tui_chat.engine.models import STARTER_NAME
from tui_chat.engine.params import SamplingParams
from tui_chat.history import History
from tui_chat.pricing import PRESETS, format_usd, turn_cost
from tui_chat.session import Branch, Turn, Writing
from tui_chat.ui.app import ChatApp
from tui_chat.ui.chat.screen import ChatScreen
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.panel.sampling import SamplingPanel
from tui_chat.ui.panel.slider import Slider
from tui_chat.ui.screens.help import HelpScreen
from tui_chat.ui.screens.inspector import InspectorScreen
from tui_chat.ui.widgets.chat_log import MAX_MOUNTED, ChatLog
from tui_chat.ui.widgets.messages import ReplyMessage, UserMessage
from tui_chat.ui.widgets.prompt import PromptInput

SIZE = (100, 32)
LONG_REPLY = "Count from 1 to 100, separated by commas."  # the starter runs on until max tokens at temperature 0


def make_app(model: str, sampling: SamplingParams = GREEDY, n_ctx: int = 1024, **config) -> ChatApp:
    settings = Config(sampling=sampling, n_ctx=n_ctx, **config)
    return ChatApp(settings, opener_for(settings)[0], model)


def streaming_reply() -> ReplyMessage:
    """A reply widget as one looks while it is written (what it shows is fed to `append`)."""
    turn = Turn("question")
    return ReplyMessage(turn, Writing(turn, Stream(), [], None))


def finished_reply(text: str) -> ReplyMessage:
    return ReplyMessage(Turn("question", [Branch(text, "end of text")]))


def scripted_app(**config) -> ChatApp:
    """For snapshots: the same reply and figures on every machine (see scripted.py)."""
    return ChatApp(Config(sampling=GREEDY, n_ctx=1024, **config), lambda _name: ScriptedBackend(), "scripted")


def said(screen: ChatScreen) -> list[Message]:
    """The conversation as the model will see it, without the system prompt."""
    return [message for message in screen.session.messages() if message.role != "system"]


def notified(app) -> list[str]:
    """What the app said in its notifications, oldest first."""
    return [str(note.message) for note in app._notifications]


async def palette(pilot, command: str) -> None:
    """Ctrl+P, the command typed, Enter: as a user runs a palette command."""
    await pilot.press("ctrl+p")
    await pilot.pause(0.3)
    await pilot.press(*command)
    await pilot.pause(0.3)
    await pilot.press("enter")


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


async def screen_open(pilot, kind: type):
    """Wait until a screen of `kind` is on top, and hand it back."""
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, kind))
    await pilot.pause()
    return pilot.app.screen


async def loaded(pilot) -> ChatScreen:
    screen = pilot.app.screen
    assert isinstance(screen, ChatScreen)
    await wait_for(pilot, lambda: screen.workspace.backend is not None)
    screen.query_one(PromptInput).cursor_blink = False  # a blinking cursor makes screenshots differ
    return screen


async def send(pilot, text: str) -> None:
    prompt = pilot.app.screen.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")


async def reply_done(pilot, timeout: float = 60.0) -> ReplyMessage:
    screen = pilot.app.screen
    await wait_for(pilot, lambda: screen.reply is None and screen.query(ReplyMessage), timeout)
    await pilot.pause()
    return screen.query(ReplyMessage).last()


async def assert_help_lists(pilot, rows: list[tuple[str, str]]) -> None:
    """F1's help holds each (section, line): the line within that section's block."""
    await pilot.press("f1")
    help_screen = await screen_open(pilot, HelpScreen)
    text = str(help_screen.query_one("Static").render())
    for section, line in rows:
        assert line in f"\n{text}".split(f"\n{section}\n")[1].split("\n\n")[0], (section, line)


async def chat(pilot, *texts: str) -> None:
    """Each message sent once the reply to the one before has ended."""
    for text in texts:
        await send(pilot, text)
        await reply_done(pilot)


async def focused_slider(pilot, name: str) -> Slider:
    slider = pilot.app.screen.query_one(f"#{name}", Slider)
    slider.focus()
    await pilot.pause()
    return slider


def footer(message: ReplyMessage) -> str:
    return message.reply.footer


async def test_send_streams_a_reply_from_the_tiny_model(tiny, tiny_model):
    expected = ask(tiny, "Hello there").text
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        assert reply.text == expected
        assert footer(reply).startswith("max tokens · 32 tokens")
        assert [m.role for m in said(screen)] == ["user", "assistant"]
        assert screen.query_one(PromptInput).text == ""
        assert screen.query_one("#model-title").render().plain == "tiny"


@pytest.mark.starter
async def test_starter_model_answers_in_the_chat(starter_model):
    app = make_app(STARTER_NAME, n_ctx=2048)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "What is the capital of France?")
        reply = await reply_done(pilot)
        assert reply.text.strip() == "The capital of France is Paris."
        assert footer(reply).startswith("stop sequence")
        panel_text = str(screen.query_one("#speed").render())
        assert "Decode" in panel_text and "tok/s" in panel_text


@pytest.mark.starter
async def test_escape_stops_and_keeps_the_partial_reply(starter_model):
    app = make_app(STARTER_NAME, sampling=GREEDY.with_changes(max_tokens=400), n_ctx=2048)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, LONG_REPLY)
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) >= 5)
        await pilot.press("escape")
        reply = await reply_done(pilot)
        assert reply.text.strip()
        assert footer(reply).startswith("stopped")
        assert said(screen)[-1].content == reply.text


@pytest.mark.starter
async def test_stopping_before_the_first_token_gives_the_text_back(starter_model):
    long_text = "Summarise: " + "The quick brown fox jumps over the lazy dog. " * 150
    app = make_app(STARTER_NAME, n_ctx=4096)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, long_text)
        status = lambda: str(screen.query_one(ReplyMessage).query_one(".status").render())  # noqa: E731
        await wait_for(pilot, lambda: screen.query(ReplyMessage)
                       and "Reading prompt 0" not in status() and "/" in status())
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.reply is None)
        await pilot.pause()
        assert not screen.query(ReplyMessage) and not screen.query(UserMessage)
        assert said(screen) == []
        assert screen.query_one(PromptInput).text == long_text
    with History(history_path()) as history:
        [chat] = history.conversations()
        assert history.load(chat.id).messages == (), "a turn taken back leaves nothing in the history"


async def test_regenerate_and_edit_last(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        first = (await reply_done(pilot)).text
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.reply is None and len(said(screen)) == 2)
        second = await reply_done(pilot)
        assert second.text == first
        assert len(screen.query(ReplyMessage)) == 1
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert said(screen) == []
        assert not screen.query(UserMessage)
        assert screen.query_one(PromptInput).text == "Hello there"


async def test_slider_by_keyboard_and_mouse_changes_live_params(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await focused_slider(pilot, "temperature")
        await pilot.press("right", "right")
        assert screen.live.snapshot()[1].temperature == pytest.approx(0.1)
        assert "0.10" in str(screen.query_one("#label-temperature").render())
        top_p = screen.query_one("#top_p", Slider)
        screen.query_one("#side").scroll_to_widget(top_p, animate=False)
        await pilot.pause()
        await pilot.click(top_p, offset=(0, 0))
        await pilot.pause()
        assert screen.live.snapshot()[1].top_p == 0.0


@pytest.mark.starter
async def test_mid_reply_change_reaches_the_engine_before_the_next_token(starter_model, monkeypatch):
    """Judged by the engine's own clock (each token's draw time and settings version), so a busy
    screen lagging behind the stream cannot blur it: at most the token in flight keeps old settings."""
    app = make_app(STARTER_NAME, sampling=GREEDY.with_changes(max_tokens=200), n_ctx=2048)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        changed_at = []
        update = screen.live.update
        monkeypatch.setattr(screen.live, "update", lambda **c: changed_at.append(time.perf_counter()) or update(**c))
        await send(pilot, LONG_REPLY)
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) >= 3)
        writing = screen.reply  # kept: at temperature 2 the reply may end before the note shows
        screen.query_one("#temperature", Slider).focus()
        await pilot.press("end")
        assert screen.live.snapshot()[1].temperature == 2.0
        new_version = screen.live.version
        applied = screen.query_one("#note-temperature")
        await wait_for(pilot, lambda: "Applied from token" in str(applied.render()))
        drawn = list(writing.tokens)
        after_change = [token for token in drawn if token.at > changed_at[0]]
        assert after_change, "the reply went on after the change"
        assert sum(token.params_version < new_version for token in after_change) <= 1
        assert all(token.params_version < new_version for token in drawn if token.at < changed_at[0])
        token_number = int(str(applied.render()).rsplit(" ", 1)[1])
        assert drawn[token_number - 1].params_version == new_version
        await pilot.press("escape")
        await reply_done(pilot)


async def test_theme_switch_persists(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert app.theme == "tui-chat-dusk"
        app.theme = "tui-chat-paper"
        await pilot.pause()
    assert load_config().theme == "tui-chat-paper"
    again = make_app(str(tiny_model), theme=load_config().theme)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert again.theme == "tui-chat-paper"


async def test_user_theme_file_is_offered(tiny_model):
    user_themes = config_path().parent / "themes"
    user_themes.mkdir(parents=True)
    (user_themes / "mine.toml").write_text('name = "mine"\nprimary = "#ff0000"\ndark = true\n')
    (user_themes / "broken.toml").write_text('name = 3')
    app = make_app(str(tiny_model), theme="mine")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "mine"


async def test_model_load_failure_keeps_the_app_usable(tmp_path, tiny_model):
    app = make_app(str(tmp_path / "missing.gguf"))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        status = screen.query_one("#status")
        await wait_for(pilot, lambda: "Model not loaded" in str(status.render()))
        assert "model file not found" in str(status.render())
        await send(pilot, "Hello")
        await pilot.pause()
        assert said(screen) == [] and screen.query_one(PromptInput).text == "Hello"
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press(*str(tiny_model), "enter")
        await wait_for(pilot, lambda: screen.workspace.backend is not None)
        await send(pilot, "Hello")
        assert (await reply_done(pilot)).text


async def test_draft_token_count_uses_the_model_tokenizer(tiny, tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        screen.query_one(PromptInput).text = "Hello world Paris"
        expected = tiny.count_tokens("Hello world Paris")
        draft = screen.query_one("#draft")
        await wait_for(pilot, lambda: str(draft.render()).startswith(f"{expected} tokens"))


async def test_help_lists_rebound_keys(tiny_model):
    app = make_app(str(tiny_model), keys={"regenerate": "f5"})
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one("Static").render())
        assert "f5" in text and "Regenerate" in text and "ctrl+j, shift+enter" in text
        await pilot.press("escape")
        await send(pilot, "Hello")
        await reply_done(pilot)
        await pilot.press("f5")
        await wait_for(pilot, lambda: screen.reply is not None or len(said(screen)) == 2)
        await reply_done(pilot)
        assert len(said(screen)) == 2


async def test_preset_from_the_panel(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        screen.query_one(SamplingPanel).apply_preset("Creative")
        await pilot.pause()
        params = screen.live.snapshot()[1]
        assert params.temperature == 1.1 and params.top_k == 100
        assert screen.query_one("#temperature", Slider).value == pytest.approx(1.1)


async def test_at_80x24_the_chat_has_the_width_and_the_panel_comes_on_f2(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await loaded(pilot)
        side = screen.query_one("#side")
        assert not side.display and screen.query_one(PromptInput).size.width >= 70
        def footer() -> str:
            return "\n".join(strip.text for strip in app.screen._compositor.render_strips()[-1:])

        # drawn once its keys are known, a frame or two after the screen (a busy machine: a few)
        await wait_for(pilot, lambda: "f1 Help" in footer(), timeout=10)
        assert "f2 Panel" in footer(), "the footer keeps what a newcomer needs"
        await send(pilot, "Hi")
        await reply_done(pilot)
        title = str(screen.query_one("#chat-title").render())
        assert title.startswith("Hi · tiny · ") and "tok/s · KV " in title, "the panel's key figures on top"
        await pilot.press("f2")
        await pilot.pause()
        assert side.display
        assert "KV" not in str(screen.query_one("#chat-title").render())


async def test_model_output_renders_literally(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        hostile = "[bold red]arr[i][/] \x1b]0;pwned\x07 \x1b[2J"
        streaming = streaming_reply()
        await screen.query_one("#log").mount(streaming, finished_reply(hostile))
        await streaming.append(hostile)
        await pilot.pause(0.2)
        lines = [strip.text for strip in app.screen._compositor.render_strips()]
        shown = [line for line in lines if "arr[i]" in line]
        assert len(shown) == 2, "both the streaming and the finished reply show the text"
        for line in shown:
            assert "[bold red]arr[i][/]" in line
            assert "\\x1b]0;pwned\\x07" in line
        assert "\x1b" not in "".join(lines)


def test_snapshot_help_screen(snap_compare):
    async def ready(pilot):
        await loaded(pilot)
        await pilot.press("f1")
        await pilot.pause(0.2)

    assert snap_compare(scripted_app(), terminal_size=(100, 32), run_before=ready)


def test_snapshot_main_screen(snap_compare):
    async def ready(pilot):
        await loaded(pilot)
        await pilot.pause(0.2)

    assert snap_compare(scripted_app(), terminal_size=(100, 32), run_before=ready)


def test_snapshot_after_a_reply(snap_compare):
    async def chat(pilot):
        await loaded(pilot)
        await send(pilot, "Name three colours of the rainbow.")
        await reply_done(pilot)
        await pilot.pause(0.2)

    assert snap_compare(scripted_app(), terminal_size=(100, 32), run_before=chat)


async def test_narrow_screen_hides_the_panel_until_asked(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=(60, 20)) as pilot:
        screen = await loaded(pilot)
        side = screen.query_one("#side")
        assert not side.display
        await pilot.press("f2")
        assert side.display
        await pilot.press("f2")
        assert not side.display


async def test_typing_anywhere_goes_to_the_message_box(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        slider = await focused_slider(pilot, "temperature")
        await pilot.press("plus", "h", "i")
        assert slider.value == pytest.approx(0.05), "keys bound on the focused slider stay with it"
        assert screen.query_one(PromptInput).text == "hi"
        assert screen.focused is screen.query_one(PromptInput)


async def test_a_burst_of_keys_in_the_message_box_is_sent_whole(tiny_model):
    """Fast typing arrives in one read: Enter is queued behind the characters and must not overtake them."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        for character in "What is it?":
            app.post_message(events.Key("space" if character == " " else character, character))
        app.post_message(events.Key("enter", "\r"))
        await wait_for(pilot, lambda: screen.query(UserMessage))
        assert screen.query_one(UserMessage).text == "What is it?"
        # nothing typed after Enter is left behind; the box clears once the reply has started (its widget shows first)
        await wait_for(pilot, lambda: screen.query_one(PromptInput).text == "", 5)
        await reply_done(pilot)


async def test_a_burst_of_keys_typed_on_a_focused_reply_is_sent_whole(tiny_model):
    """A terminal delivers fast typing (or a paste) in one read: every key is queued before the first
    is handled. The message box must get all of them, Enter included, not the reply that had focus."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        reply.focus()
        await pilot.pause()
        for key, character in (("n", "n"), ("e", "e"), ("x", "x"), ("t", "t"), ("enter", "\r")):
            app.post_message(events.Key(key, character))
        await wait_for(pilot, lambda: len(screen.query(UserMessage)) == 2)
        assert screen.query(UserMessage).last().text == "next"
        assert not isinstance(app.screen, InspectorScreen)
        await reply_done(pilot)


async def test_command_palette_offers_every_action_and_the_presets(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        commands = {command.title: command for command in app.get_system_commands(screen)}
        for binding in ChatScreen.BINDINGS:
            assert binding.tooltip in commands
        wanted = {"Preset: Precise", "Preset: Balanced", "Preset: Creative", "Theme", "Price: GPT-4o mini"}
        assert wanted <= set(commands)
        commands["Preset: Creative"].callback()
        await pilot.pause()
        assert screen.live.snapshot()[1].temperature == pytest.approx(1.1)
        commands["Price: GPT-4o mini"].callback()
        await pilot.pause()
        assert screen.workspace.price.name == "GPT-4o mini"
        await commands["Show or hide the side panel"].callback()
        await pilot.pause()
        assert not screen.query_one("#side").display


async def test_f2_hides_and_shows_the_panel_restyling_no_widget_and_a_narrow_screen_keeps_its_choice(monkeypatch):
    """F2 once set a class on the screen, and Textual styled every widget of it again (~190, 160-200 ms: the worst
    stall of F2 mid-stream); it sets the panel's display alone now. Until F2, the width decides (narrow: hidden);
    after it, the user's choice holds at any width, and the title carries the panel's figures while it is hidden."""
    from textual.css.stylesheet import Stylesheet

    restyled: list[int] = []
    update_nodes = Stylesheet.update_nodes
    monkeypatch.setattr(Stylesheet, "update_nodes",
                        lambda self, nodes, animate=False: restyled.append(len(nodes := list(nodes))) or update_nodes(
                            self, nodes, animate))
    app = scripted_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        side = screen.query_one("#side")
        assert side.display
        restyled.clear()
        await pilot.press("f2")
        await pilot.pause()
        assert not side.display and sum(restyled) < 60, restyled  # a few, one at a time: not the screen's ~190
        assert "KV " in str(screen.view.get_child_by_id("chat-title").render())  # the panel's figures, on the title
        await pilot.resize_terminal(80, SIZE[1])
        await pilot.pause()
        assert not side.display
        await pilot.press("f2")
        await pilot.pause()
        assert side.display, "shown on a narrow screen once asked for"
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        assert side.display


async def test_panel_costs_match_the_pricing_module(tiny, tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chat(pilot, "Hello there", "And then?")
        panel = screen.query_one(MetricsPanel)
        first, second = screen.session.spent()
        assert second.cached_tokens > 0

        def shown() -> str:
            return str(screen.query_one("#cost").render())

        for name in ("GPT-4o", "Claude Sonnet 4"):
            price = PRESETS[name]
            last = turn_cost(price, second.prompt_tokens, second.cached_tokens, second.completion_tokens)
            session = sum(turn_cost(price, t.prompt_tokens, t.cached_tokens, t.completion_tokens).total
                          for t in (first, second))
            uncached = sum(price.cost(t.prompt_tokens, 0, t.completion_tokens) for t in (first, second))
            assert f"Reply    {format_usd(last.total, fine=True)}" in shown()
            assert f" cached  {format_usd(last.cached_input, fine=True)}" in shown()
            assert f" output  {format_usd(last.output, fine=True)}" in shown()
            assert f"Session  {format_usd(session, fine=True)}" in shown()
            assert f"Saved    {format_usd(uncached - session, fine=True)}" in shown()
            screen.query_one("#price", Select).value = "Claude Sonnet 4"
            await pilot.pause()
        assert load_config().price == "Claude Sonnet 4"

        screen.query_one(PromptInput).text = "Hello world"
        draft = screen.query_one("#draft")
        sonnet = PRESETS["Claude Sonnet 4"]
        context = panel.metrics.context_tokens  # billed as the reply will be: the provider's caching rule applies
        sending = turn_cost(sonnet, tiny.count_tokens("Hello world") + context, context, 0).total
        await wait_for(pilot, lambda: f"sending ≈ {format_usd(sending)}" in str(draft.render()))
        assert f"up to {format_usd(sonnet.cost(0, 0, GREEDY.max_tokens))} out on Claude Sonnet 4" in str(draft.render())


@pytest.mark.starter
async def test_the_log_follows_the_reply_until_the_user_scrolls_up(starter_model):
    app = make_app(STARTER_NAME, sampling=GREEDY.with_changes(max_tokens=300), n_ctx=2048)
    async with app.run_test(size=(100, 20)) as pilot:
        screen = await loaded(pilot)
        log = screen.query_one("#log")
        await send(pilot, LONG_REPLY)
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) >= 200)
        await pilot.pause(0.1)
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y, "following the reply"
        log.scroll_home(animate=False)
        await pilot.pause()
        seen = len(screen.reply.tokens)
        await wait_for(pilot, lambda: len(screen.reply.tokens) >= seen + 20)
        assert log.scroll_y == 0, "scrolled up: the reply no longer pulls the view down"
        await pilot.press("escape")
        await reply_done(pilot)


async def test_a_long_chat_mounts_only_recent_messages(tiny_model):
    turns = [Turn(f"question {n}", [Branch(f"answer {n}", "end of text")]) for n in range(115)]
    app = make_app(str(tiny_model), n_ctx=8192)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        screen.session.turns = turns
        await screen.view.show(screen.session)
        log = screen.query_one(ChatLog)
        assert len(log.messages()) == MAX_MOUNTED and len(log.hidden) == 190
        assert log.messages()[0].text == "question 95" and len(said(screen)) == 230
        assert "190 earlier messages" in str(screen.query_one("#earlier").label)
        await pilot.press("f4")
        assert len(log.messages()) == 90 and log.messages()[0].text == "question 70"
        await send(pilot, "Hello there")
        await wait_for(pilot, lambda: len(said(screen)) == 232 and screen.reply is None)
        assert len(log.messages()) == MAX_MOUNTED and len(log.hidden) == 192
        assert log.messages()[-1].text == said(screen)[-1].content
        await pilot.press("ctrl+n")
        assert log.messages() == [] and log.hidden == [] and not screen.query_one("#earlier").display


async def test_regenerate_and_edit_wait_for_the_reply_and_the_footer_says_so(starter_model):
    """On the starter, whose reply to LONG_REPLY runs on for minutes: the tiny model writes 3,000 tokens
    before the keys below arrive, now that the screen keeps up with it."""
    app = make_app(str(starter_model), sampling=GREEDY.with_changes(max_tokens=3000), n_ctx=4096)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        assert app.active_bindings["escape"].binding.id == "to_box", "nothing to stop: not offered"
        await send(pilot, LONG_REPLY)
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) > 10)
        bindings = app.active_bindings
        assert not bindings["ctrl+r"].enabled and not bindings["ctrl+g"].enabled
        assert bindings["escape"].enabled and bindings["escape"].binding.id == "stop"
        await pilot.press("ctrl+r", "ctrl+g")
        assert screen.reply is not None and [t.question for t in screen.session.turns] == [LONG_REPLY]
        assert len(screen.session.turns[0].branches) == 0, "no regeneration started"
        await pilot.press("escape")
        await reply_done(pilot)
        assert app.active_bindings["ctrl+r"].enabled and app.active_bindings["ctrl+g"].enabled


async def test_the_draft_meter_keeps_the_conversation_after_a_reply_stopped_before_its_first_token(tiny, tiny_model):
    """Esc before the first token gives the question back to the box: the draft's estimate still bills the
    conversation it would be sent with (issue 25, item 6: it dropped to the draft alone)."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        context = screen.session.spent()[-1].context_tokens
        assert context > 0
        generate = screen.workspace.backend.generate

        def stopped_at_once(request):  # as Esc pressed before the first token
            stream = generate(request)
            stream.cancel()
            return stream

        screen.workspace.backend.generate = stopped_at_once
        await send(pilot, "And then?")
        await wait_for(pilot, lambda: screen.reply is None and screen.query_one(PromptInput).text == "And then?")
        price = screen.query_one(MetricsPanel).price
        draft = screen.query_one("#draft")
        sending = turn_cost(price, tiny.count_tokens("And then?") + context, context, 0).total
        await wait_for(pilot, lambda: f"sending ≈ {format_usd(sending)}" in str(draft.render()))
