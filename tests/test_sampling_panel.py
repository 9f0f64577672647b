"""The sampling panel through Pilot: every sampler, the chain's order, the logit bias, the output format
and streaming; text fields that keep fast keys in order; sliders you can see focused and type into; the
note that says when a change applied."""

from __future__ import annotations

import json
import math

from textual import events
from textual.widgets import Checkbox, Collapsible, Input, Select

from conftest import GREEDY
from scripted import ScriptedBackend
from test_ui import SIZE, loaded, make_app, notified, palette, reply_done, scripted_app, send, wait_for
from tui_chat.config import Config
from tui_chat.engine.base import Stream
from tui_chat.engine.formats import TEXT, choose, grammar
from tui_chat.engine.params import DEFAULT_ORDER, PARAMS
from tui_chat.session import Turn, Writing
from tui_chat.ui.app import ChatApp
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.panel.output_format import SourceArea
from tui_chat.ui.panel.sampling import MAIN_PARAMS, MORE_PARAMS, SamplingPanel
from tui_chat.ui.panel.slider import Slider
from tui_chat.ui.widgets.messages import ReplyMessage
from tui_chat.ui.widgets.prompt import PromptInput


def burst(app, *keys: str) -> None:
    """Keys as a terminal delivers fast typing: all queued before the first is handled."""
    for key in keys:
        character = key if len(key) == 1 else {"space": " "}.get(key)
        app.post_message(events.Key(key, character))


def params(screen):
    return screen.live.snapshot()[1]


def lines(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def test_seed_and_stop_fields_keep_a_fast_burst_of_keys_in_order():
    """Issue 16: `11 quick Backspaces then Paris gave PPari`; `42, End, 4 Backspaces, 777 left it empty`.
    A character was inserted when the field got it, an edit key only once it had bubbled up to the app."""
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        stop = screen.query_one("#stop", Input)
        stop.value = "hello world"
        stop.focus()
        await pilot.pause()
        stop.cursor_position = len(stop.value)  # after the focus selected it all, as End would
        assert stop.selection.is_empty
        burst(app, *["backspace"] * 11, *"Paris", "enter")
        await wait_for(pilot, lambda: params(screen).stop == ("Paris",))
        assert stop.value == "Paris"
        seed = screen.query_one("#seed", Input)
        seed.focus()
        await pilot.pause()
        burst(app, "4", "2", "end", *["backspace"] * 4, "7", "7", "7", "enter")
        await wait_for(pilot, lambda: params(screen).seed == 777)
        assert seed.value == "777"
        assert screen.query_one(PromptInput).text == "", "nothing typed in a field leaks to the message box"


async def test_max_tokens_and_any_slider_can_be_typed():
    """Issue 16: Max tokens could not be typed. Digits on a focused slider start an entry; the setting's own
    range decides (max tokens goes past the slider's end), a bad number is one line and changes nothing."""
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        slider = screen.query_one("#max_tokens", Slider)
        slider.focus()
        await pilot.press("3", "0", "0")
        assert "300" in slider.render_line(0).text and params(screen).max_tokens == 32, "not set before Enter"
        await pilot.press("enter")
        assert params(screen).max_tokens == 300 and slider.value == 300
        assert "300" in str(screen.query_one("#label-max_tokens").render())
        await pilot.press(*"20000", "enter")
        assert params(screen).max_tokens == 20000 and slider.value == slider.maximum
        assert "20000" in str(screen.query_one("#label-max_tokens").render())
        await pilot.press(*"999999", "enter")
        await pilot.pause()
        assert params(screen).max_tokens == 20000
        assert "max_tokens must be between 1 and 131072 (got 999999)" in notified(app)[-1]
        await pilot.press("5", "escape")
        assert slider.typed is None and params(screen).max_tokens == 20000
        temperature = screen.query_one("#temperature", Slider)
        temperature.focus()
        await pilot.press("1", "minus", "minus", ".", "2", "5", "enter")
        assert params(screen).temperature == 1.25 and temperature.value == 1.25
        await pilot.press("h")
        assert screen.query_one(PromptInput).text == "h", "letters still go to the message box"


async def test_the_focused_control_is_marked_and_its_hint_shown():
    """Issue 16: slider focus was hard to see (a faint background only)."""
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        focused, other = screen.query_one("#row-top_p"), screen.query_one("#row-top_k")
        screen.query_one("#top_p", Slider).focus()
        await pilot.pause()
        shown = lines(app)
        marker = lambda row: shown[row.region.y][row.region.x]  # noqa: E731
        assert marker(focused) != " " and marker(other) == " "
        assert screen.query_one("#hint-top_p").display and not screen.query_one("#hint-top_k").region.height
        label = screen.query_one("#label-top_p")
        assert label.styles.text_style.bold and not screen.query_one("#label-top_k").styles.text_style.bold


async def test_the_change_note_is_under_the_control_and_on_screen_at_40_rows():
    """Issue 16: `✓ Applied from token N` sat at the end of the panel, off-screen at 40 rows."""
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        side = screen.query_one("#side")
        for name in ("max_tokens", "temperature"):
            screen.query_one(f"#{name}", Slider).focus()
            await pilot.press("right")
            await pilot.pause()
            note = screen.query_one(f"#note-{name}")
            assert "next reply" in str(note.render())
            assert side.region.contains_region(note.region), f"the note under {name} is on screen"
        assert not screen.query_one("#note-max_tokens").display, "one note: the last change's"


async def test_no_stale_waiting_note_when_idle():
    """Issue 16: `Change waiting for the next token` showed while no reply was being written."""
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        panel = screen.query_one(SamplingPanel)
        note = screen.query_one("#note-top_k")
        screen.query_one("#top_k", Slider).focus()
        await pilot.press("right")
        assert str(note.render()) == "Right: Top-k → 41\n✓ Set: the next reply uses it"
        assert panel.pending_version is None
        screen.reply = Writing(Turn("question"), Stream(), [], None)  # a reply is being written
        await pilot.press("right")
        assert "Waiting for the next token" in str(note.render()) and panel.pending_version == screen.live.version
        screen.reply = None  # the reply ended before a token was drawn with it
        assert str(note.render()) == "Right: Top-k → 42\n✓ Set: the next reply uses it"
        assert panel.pending_version is None


async def test_a_change_mid_reply_says_from_which_token_it_applied(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=3000), n_ctx=4096)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) > 5)
        writing = screen.reply  # kept: the tiny model may finish before the note shows
        screen.query_one("#top_k", Slider).focus()
        await pilot.press("right")
        note = screen.query_one("#note-top_k")
        await wait_for(pilot, lambda: "Applied from token" in str(note.render()))
        assert screen.query_one("#side").region.contains_region(note.region)
        token = int(str(note.render()).rsplit(" ", 1)[1])
        assert writing.tokens[token - 1].params_version == screen.live.version
        await pilot.press("ctrl+n")  # the reply is abandoned mid-way: nothing is being written after it
        screen.query_one("#top_k", Slider).focus()
        await pilot.press("right")
        assert str(note.render()).endswith("\n✓ Set: the next reply uses it")


async def test_every_sampler_has_a_control_and_the_rare_ones_are_folded():
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await loaded(pilot)
        assert {*MAIN_PARAMS, *MORE_PARAMS} == {spec.name for spec in PARAMS}
        more = screen.query_one("#more", Collapsible)
        assert more.collapsed and more.title == "More samplers"
        assert all(not screen.query_one(f"#{name}").region.height for name in MORE_PARAMS)
        more.collapsed = False
        await pilot.pause()
        slider = screen.query_one("#dry_multiplier", Slider)
        slider.focus()
        await pilot.press("right", "right")
        assert params(screen).dry_multiplier == 0.02
        assert more.title == "More samplers · 1 changed"
        assert "DRY 0.02" in str(screen.query_one("#sampler_order").render()), "the order row shows DRY on"
        assert screen.query_one("#side").region.contains_region(slider.region)


async def test_the_order_row_rearranges_the_chain_with_keys():
    app = ChatApp(Config(n_ctx=1024), lambda _name: ScriptedBackend(), "scripted")  # llama.cpp's defaults
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        bar = screen.query_one("#sampler_order")
        bar.focus()
        shown = str(bar.render())
        assert shown.startswith("penalties › DRY › top-nσ › top-k")
        assert "runs: repeat penalty 1.1 → top-k 40 → top-p 0.9 → min-p 0.05 → temperature 0.7 → the draw" in shown
        await pilot.press("right", "right", "right", "shift+left")  # top-k before top-nσ
        assert params(screen).sampler_order[:4] == ("penalties", "dry", "top_k", "top_n_sigma")
        await pilot.press("space")  # top-k left out of the chain
        assert "top_k" not in params(screen).sampler_order
        assert "out: top-k" in str(bar.render()) and "top-k 40 →" not in str(bar.render())
        await pilot.press("end")
        for _ in range(8):
            await pilot.press("right")
        await pilot.press("space")  # back, at the end of the chain
        assert params(screen).sampler_order[-1] == "top_k"
        await pilot.press("d")
        assert params(screen).sampler_order == DEFAULT_ORDER
        assert "✓ Set" in str(screen.query_one("#note-sampler_order").render())


async def test_the_logit_bias_list_adds_edits_and_removes_entries():
    app = scripted_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await loaded(pilot)
        group = screen.query_one("#bias-group", Collapsible)
        group.collapsed = False
        field = screen.query_one("#bias-add", Input)
        field.focus()
        await pilot.press(*" Paris=-inf", "enter")
        await pilot.press(*"the=2.5", "enter")
        assert params(screen).logit_bias == ((" Paris", -math.inf), ("the", 2.5))
        assert group.title == "Logit bias · 2"
        await pilot.press(*"Rome=lots", "enter")
        assert "the logit bias of 'Rome' must be between -100 and 100, or -inf" in notified(app)[-1]
        assert field.value == "Rome=lots", "a bad entry stays in the field to fix"
        field.value = ""
        entries = screen.query_one("#bias-entries")
        entries.focus()
        entries.highlighted = 1
        await pilot.press("enter")
        assert field.value == "the=2.5" and field.has_focus
        await pilot.press("backspace", "backspace", "backspace", *"-3", "enter")
        assert params(screen).logit_bias == ((" Paris", -math.inf), ("the", -3.0))
        entries.focus()
        entries.highlighted = 0
        await pilot.press("delete")
        assert params(screen).logit_bias == (("the", -3.0),)
        assert '"the"' in str(entries.get_option_at_index(0).prompt)


async def test_a_banned_word_never_appears_in_the_chat(tiny_model):
    """The bias reaches the engine: the word the tiny model writes most, banned with -inf, is gone."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        first = await reply_done(pilot)
        counts: dict[int, int] = {}
        for token in first.reply.tokens:
            counts[token.token_id] = counts.get(token.token_id, 0) + 1
        banned = max(counts, key=counts.get)
        piece = next(t.piece for t in first.reply.tokens if t.token_id == banned)
        screen.query_one(SamplingPanel)._apply("logit_bias", logit_bias=[(piece, -math.inf)])
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.reply is None and len(first.branches) == 2)
        assert banned not in [t.token_id for t in first.reply.tokens]


async def choose_format(pilot, kind: str, source: str = "") -> None:
    screen = pilot.app.screen
    screen.query_one("#format-kind", Select).value = kind
    await pilot.pause()
    if source:
        screen.query_one(SourceArea).text = source
        screen.query_one(SourceArea).focus()
        await pilot.press("ctrl+s")
        await pilot.pause()


async def test_the_format_is_kept_per_conversation_and_reopens_with_it(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=200))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await choose_format(pilot, "json")
        assert screen.session.output_format == choose("json")
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        if "incomplete" not in reply.reply.footer:
            json.loads(reply.text)
        assert "Grammar" in str(screen.query_one(MetricsPanel).query_one("#speed").render())
        saved = screen.session.conversation_id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert screen.session.output_format == TEXT
        assert screen.query_one("#format-kind", Select).value == "text"
        await screen.rooms["chats"].open_conversation(saved)
        await pilot.pause()
        assert screen.session.output_format == choose("json")
        assert screen.query_one("#format-kind", Select).value == "json"


async def test_a_grammar_that_cannot_end_says_the_output_is_incomplete(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=12))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await choose_format(pilot, "grammar", 'root ::= "a"{30}')
        assert screen.session.output_format == grammar('root ::= "a"{30}')
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        assert reply.text == "a" * 12
        assert reply.reply.footer.startswith("max tokens · 12 tokens") and "incomplete" in reply.reply.footer


async def test_bad_formats_are_one_line_and_nothing_is_lost(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await choose_format(pilot, "json_schema", "{not json")
        state = screen.query_one("#format-state")
        assert str(state.render()).startswith("the JSON schema is not valid JSON") and state.has_class("-error")
        assert screen.query_one(SourceArea).text == "{not json" and screen.session.output_format == TEXT
        await choose_format(pilot, "grammar", 'root ::= "yes" | foo')  # parses only when a reply starts
        await send(pilot, "Is Paris in France?")
        await wait_for(pilot, lambda: screen.reply is None and any("does not parse" in n for n in notified(app)))
        await pilot.pause()
        assert screen.query_one(PromptInput).text == "Is Paris in France?" and not screen.session.turns
        await choose_format(pilot, "grammar", 'root ::= "yes" | "no"')
        await send(pilot, "Is Paris in France?")
        assert (await reply_done(pilot)).text in ("yes", "no")


async def test_what_of_a_schema_is_not_enforced_is_said_where_it_is_chosen(tiny_model):
    """The engine compiles the schema when it is chosen (off the UI thread): what it only checks when the
    reply is done, or where it adds no bounds, is one line under the picker; a schema it refuses says why
    before any reply; one it enforces whole says nothing."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        note = screen.query_one("#format-note")

        async def said(schema: dict) -> str:
            await choose_format(pilot, "json_schema", json.dumps(schema))
            await app.workers.wait_for_complete()
            await pilot.pause()
            return str(note.render()) if note.display else ""

        unique = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
        assert await said(unique) == ('⚠ Not enforced while writing, checked when the reply is done: '
                                      '"uniqueItems" at $.tags')
        assert not note.has_class("-error")
        assert await said({"allOf": [{"type": "object", "properties": {"name": {"type": "string"}}}]}) == (
            '⚠ No length bounds added while writing ("allOf" at $): a reply may run to max tokens')
        assert (await said({"properties": {"code": {"pattern": "(?<!x)y"}}})).startswith(
            "✗ The JSON schema cannot be enforced: $.code: pattern '(?<!x)y'") and note.has_class("-error")
        assert await said({"type": "object", "properties": {"name": {"type": "string"}}}) == ""
        await choose_format(pilot, "json_schema", json.dumps(unique))
        await send(pilot, "Hello there")  # a chat is saved with its first message
        await reply_done(pilot)
        saved = screen.session.conversation_id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not note.display
        await screen.rooms["chats"].open_conversation(saved)  # a reopened chat's schema is checked again
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert str(note.render()).startswith("⚠ Not enforced while writing")


async def test_streaming_off_holds_the_reply_and_compares_the_wait(tiny_model):
    app = make_app(str(tiny_model), sampling=GREEDY.with_changes(max_tokens=3000), n_ctx=4096)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        screen.query_one("#stream", Checkbox).value = False
        await pilot.pause()
        await send(pilot, "Hello there")
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) > 20)
        widget = screen.query(ReplyMessage).last()
        await wait_for(pilot, lambda: "Writing, streaming off:" in str(widget.query_one(".status").render()))
        assert "tokens ·" in str(widget.query_one(".status").render())
        assert widget._tail == "", "nothing of the reply is drawn while it is held"
        await pilot.press("escape")
        reply = await reply_done(pilot)
        assert reply.text.strip() and not reply.query(".status"), "the whole reply is shown at the end"
        assert "first word after" in reply.reply.footer and "when streaming; you waited" in reply.reply.footer
        assert reply.reply.footer.startswith("stopped")
        assert screen.session.streaming is False
        await pilot.press("ctrl+n")
        assert screen.session.streaming is False, "the toggle holds for new chats"


async def test_esc_in_the_format_box_leaves_it_even_while_a_reply_is_written(starter_model):
    """Issue 38: after Ctrl+S in the schema box the first Esc stopped the reply being written, and the next
    message went into the schema box. Esc stops the reply and takes the focus back to the message box."""
    app = make_app(str(starter_model), sampling=GREEDY.with_changes(max_tokens=600))  # seconds: long enough
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Count from 1 to 1000: 1, 2, 3, 4,")
        await wait_for(pilot, lambda: screen.reply is not None)
        await choose_format(pilot, "json_schema", '{"type": "object"}')
        assert screen.focused is screen.query_one(SourceArea)
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.reply is None)
        assert screen.focused is screen.query_one(PromptInput)
        await pilot.press("h", "i")
        assert screen.query_one(PromptInput).text == "hi"


async def test_the_palette_reaches_the_output_format(tiny_model):
    """Issue 38: the command palette had no entry for the output format (~18 Tabs into the panel)."""
    async with make_app(str(tiny_model)).run_test(size=(80, 24)) as pilot:
        screen = await loaded(pilot)
        await palette(pilot, "Output format")
        await wait_for(pilot, lambda: screen.focused is screen.query_one("#format-kind", Select))
        assert screen.query_one("#side").display, "the panel is shown where it was hidden (80 columns)"
