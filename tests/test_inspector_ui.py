"""The confidence heatmap, the token inspector and branches, driven through Pilot on real models."""

from __future__ import annotations

import os
import re
import signal

import pytest
from textual.color import Color
from textual.widgets import OptionList

from conftest import GREEDY
from test_ui import SIZE, loaded, make_app, reply_done, said, screen_open, scripted_app, send, streaming_reply, wait_for
from tui_chat.commands.common import opener_for
from tui_chat.config import Config
from tui_chat.engine.base import Message, XRay
from tui_chat.engine.models import STARTER_NAME
from tui_chat.engine.params import SamplingParams
from tui_chat.ui.app import ChatApp
from tui_chat.ui.keys import room
from tui_chat.ui.screens.inspector import InspectorScreen, candidate_lines
from tui_chat.ui.widgets.heatmap import BANDS, band_colors, band_of
from tui_chat.ui.widgets.xray import xray_text

BUILT_IN_THEMES = ("textual-dark", "textual-light", "nord", "gruvbox", "solarized-light")


def contrast(a: Color, b: Color) -> float:
    """WCAG 2 contrast ratio."""

    def luminance(color: Color) -> float:
        channels = [c / 255 for c in color.rgb]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


async def test_heatmap_bands_are_legible_in_every_shipped_and_built_in_theme(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        shipped = [name for name in app.available_themes if name.startswith("tui-chat")]
        assert len(shipped) == 3
        for theme in (*shipped, *BUILT_IN_THEMES):
            app.theme = theme
            await pilot.pause()
            colors = band_colors(app.get_css_variables())
            assert colors[0] is None  # likely tokens stay plain
            fills = [fill for _, fill in colors[1:]]
            assert len(set(fills)) == len(fills), f"{theme}: two bands look the same"
            for band, (text, fill) in zip(BANDS[1:], colors[1:], strict=True):
                assert contrast(text, fill) >= 4.5, f"{theme}: band {band.label} is hard to read"


async def test_toggling_the_panel_and_the_heatmap_mid_stream_keeps_every_token(starter_model):
    """Issue 46: F2 and Ctrl+T while a reply streams (the starter: slow enough on a CPU to be caught mid-reply; their
    actions run directly, since Pilot's key presses wait for an idle app, which a stream never is): the reply goes
    on, and ends with every token drawn in the heatmap."""
    app = make_app(str(starter_model), sampling=GREEDY.with_changes(max_tokens=200), n_ctx=2048)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Count from 1 to 100, separated by commas.")
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.text) > 20, 60)
        for action in (room("panel", "toggle_panel"), room("conversation", "toggle_heatmap"),
                       room("panel", "toggle_panel")):  # F2, Ctrl+T, F2
            await screen.run_action(action)
            assert screen.reply is not None, "toggled mid-stream"
            await pilot.pause(0.2)
        reply = await reply_done(pilot)
        assert screen.query_one("#side").display and screen.query_one("#legend").display
        body = reply.query_one(".heatmap")
        drawn = {segment.style.meta.get("token") for y in range(body.size.height) for segment in body.render_line(y)
                 if segment.style and segment.text.strip()} - {None}
        assert drawn == {i for i, t in enumerate(reply.reply.tokens) if t.piece.strip()}
        assert len(reply.reply.tokens) > 100


async def test_heatmap_colours_each_token_by_its_probability(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        assert len(reply.reply.tokens) > 3 and all(t.prob is not None and len(t.top) == 10 for t in reply.reply.tokens)
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert screen.query_one("#legend").display
        assert "underlined" not in str(screen.query_one("#legend").render()), "no drafting, no underline to name"
        body = reply.query_one(".heatmap")
        segments = [segment for y in range(body.size.height) for segment in body.render_line(y)]
        colors = band_colors(app.get_css_variables())
        drawn = set()
        for segment in segments:
            index = segment.style.meta.get("token") if segment.style else None
            if index is None or not segment.text.strip():
                continue
            drawn.add(index)
            pair = colors[band_of(reply.reply.tokens[index].prob)]
            if pair is not None:
                assert segment.style.bgcolor.triplet == pair[1].rich_color.triplet
        assert drawn == {i for i, t in enumerate(reply.reply.tokens) if t.piece.strip()}
        bands = {band_of(t.prob) for t in reply.reply.tokens}
        assert len(bands) > 1, "the tiny model's reply should span several bands"
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not reply.query(".heatmap") and not screen.query_one("#legend").display


async def test_keys_pick_a_token_the_inspector_shows_it_and_a_branch_rewinds_to_it(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        original, original_tokens = reply.text, list(reply.reply.tokens)
        await pilot.press("ctrl+t")
        reply.focus()
        await pilot.press("right", "right", "right", "enter")
        inspector = await screen_open(pilot, InspectorScreen)
        assert inspector.index == 3
        options = inspector.query_one(OptionList)
        assert options.option_count == 10
        assert str(options.get_option_at_index(options.highlighted).prompt).split()[1] == "▶"
        await pilot.press("left")
        assert inspector.index == 2
        await pilot.press("right", "down", "enter")
        await wait_for(pilot, lambda: screen.is_current and screen.reply is None and len(reply.branches) == 2)
        await pilot.pause()
        alternative = [c for c in original_tokens[3].top if c.token_id != original_tokens[3].token_id][0]
        expected = [t.token_id for t in original_tokens[:3]] + [alternative.token_id]
        assert [t.token_id for t in reply.reply.tokens[:4]] == expected
        assert reply.reply.tokens[3].forced and reply.reply.tokens[3].prob == alternative.prob
        assert all(not t.forced and t.prob is not None for t in reply.reply.tokens[4:])
        assert reply.text.startswith("".join(t.piece for t in original_tokens[:3]) + alternative.text)
        assert "branched at token 4, 1 token read" in reply.reply.footer
        last = reply.query_one(".last")
        assert "branch 2/2" in "".join(last.render_line(y).text for y in range(last.size.height))
        assert said(screen)[-1] == Message("assistant", reply.text)
        branched = reply.text

        reply.focus()
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert reply.text == original and reply.reply.tokens == original_tokens
        assert said(screen)[-1] == Message("assistant", original)
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert said(screen)[-1] == Message("assistant", branched)

        await send(pilot, "And then?")
        await reply_done(pilot)
        assert said(screen)[1] == Message("assistant", branched)
        assert len(said(screen)) == 4


async def test_clicking_a_token_opens_the_inspector_at_it(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()
        body = reply.query_one(".heatmap")
        line = list(body.render_line(0))
        x = 0
        for segment in line:
            if segment.style and segment.style.meta.get("token") is not None and segment.text.strip():
                target = segment.style.meta["token"]
                break
            x += segment.cell_length
        await pilot.click(body, offset=(x - body.region.x + body.content_region.x, 0))
        inspector = await screen_open(pilot, InspectorScreen)
        assert inspector.index == target


async def test_inspector_marks_what_the_current_settings_would_keep(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        token = reply.reply.tokens[0]
        lines = [str(line) for line in candidate_lines(token, screen.live.snapshot()[1])]
        assert lines[0].rstrip().endswith("kept") and all(line.rstrip().endswith("cut") for line in lines[1:])
        wide = screen.live.snapshot()[1].with_changes(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
        lines = [str(line) for line in candidate_lines(token, wide)]
        assert [line.rstrip().endswith("kept") for line in lines] == [True] * 3 + [False] * 7
        cumulative = [float(line.split("Σ")[1].split("%")[0]) for line in lines]
        assert cumulative == sorted(cumulative)
        assert cumulative[-1] == pytest.approx(sum(c.prob for c in token.top) * 100, abs=0.1)


async def test_only_the_latest_reply_can_be_branched(tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        first = await reply_done(pilot)
        await send(pilot, "Again")
        await reply_done(pilot)
        first.focus()
        await pilot.press("enter")
        inspector = await screen_open(pilot, InspectorScreen)
        await pilot.press("down", "enter")
        await pilot.pause()
        assert pilot.app.screen is inspector and len(first.branches) == 1
        assert "Only the latest reply" in str(list(app._notifications)[-1].message)
        await pilot.press("escape")
        assert len(said(screen)) == 4


async def test_regenerate_keeps_the_earlier_reply_as_a_branch(tiny_model):
    app = make_app(str(tiny_model), sampling=SamplingParams(temperature=1.0, seed=-1, max_tokens=12))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        first = reply.text
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.reply is None and len(reply.branches) == 2)
        assert reply.active == 1
        reply.focus()
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert reply.text == first and said(screen)[-1].content == first


@pytest.mark.parametrize("keys", [("right", "right"), ("right", "right", "enter")], ids=["heatmap", "inspector"])
def test_snapshot_heatmap_and_inspector(snap_compare, keys):
    async def pick_a_token(pilot):
        await loaded(pilot)
        await send(pilot, "Name three colours of the rainbow.")
        reply = await reply_done(pilot)
        await pilot.press("ctrl+t")
        reply.focus()
        await pilot.press(*keys)
        if "enter" in keys:
            await screen_open(pilot, InspectorScreen)
        await pilot.pause(0.2)

    assert snap_compare(scripted_app(), terminal_size=(100, 32), run_before=pick_a_token)


SAMPLED = SamplingParams(temperature=0.8, seed=5, max_tokens=16)


async def open_inspector(pilot, reply, keys=()):
    await pilot.press("ctrl+t")
    reply.focus()
    await pilot.press(*keys, "enter")
    return await screen_open(pilot, InspectorScreen)


async def inspect_a_reply(pilot, keys=()):
    """Send a message, then open the inspector on its reply at the token `keys` pick."""
    screen = await loaded(pilot)
    await send(pilot, "Hello there")
    reply = await reply_done(pilot)
    return screen, reply, await open_inspector(pilot, reply, keys)


async def test_the_xray_shows_each_stage_of_the_chain_and_the_verdict(tiny_model):
    app = make_app(str(tiny_model), sampling=SAMPLED)
    async with app.run_test(size=SIZE) as pilot:
        _, reply, inspector = await inspect_a_reply(pilot, ("right", "right"))
        shown = inspector.query_one("#xray")
        assert not shown.display, "computed only when asked"
        await pilot.press("x")
        await wait_for(pilot, lambda: "drawn at rank" in str(shown.render()))
        text = str(shown.render())
        expected = inspector.probe.xray(2).result()  # the same question, asked again of the engine
        assert expected.verdict in text
        rows = [line for line in text.splitlines()[2:] if line and not line.startswith(("  ↳", "'", '"'))]
        assert [row[:20].strip() for row in rows[: len(expected.stages)]] == [s.label for s in expected.stages]
        assert [s.name for s in expected.stages] == ["penalties", "top_k", "top_p", "min_p", "temperature"]
        for row, stage in zip(rows, expected.stages, strict=False):  # rows go on past the stages
            assert f"{stage.kept:,}" in row and f"{stage.rank} · p" in row
        await pilot.press("left")  # the X-ray follows the picked token
        expected = inspector.probe.xray(1).result()
        await wait_for(pilot, lambda: expected.verdict in str(shown.render()))
        assert expected.token_id == reply.reply.tokens[1].token_id


async def test_an_xray_after_an_engine_death_says_the_model_loads_again(tiny_model):
    """It said "recomputing this position…" through the whole reload, as if nothing had happened."""
    settings = Config(sampling=SAMPLED, n_ctx=1024)
    app = ChatApp(settings, opener_for(settings, engine_process=True)[0], str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen, _, inspector = await inspect_a_reply(pilot, ("right",))
        os.kill(screen.workspace.backend.pid, signal.SIGKILL)
        await wait_for(pilot, lambda: screen.workspace.backend.pid is None)
        shown = inspector.query_one("#xray")
        await pilot.press("x")
        await wait_for(pilot, lambda: "X-ray: Loading the model again: the engine process was killed" in
                       str(shown.render()))
        await wait_for(pilot, lambda: "drawn at rank" in str(shown.render()), 30)


def test_the_xray_says_when_its_recomputed_figure_parts_from_the_recorded_one():
    """llama.cpp's figures move with how a position was computed (a reply's first token read with its prompt,
    a cache restored from disk): where the X-ray's recomputation differs from the record, both are shown."""
    xray = XRay(7, " sea", 0.0132, 2, (), "' sea' drawn at rank 2 with p = 0.013", 0.02)
    assert "recorded" not in str(xray_text(xray, recorded=0.01321))
    shown = str(xray_text(xray, recorded=0.0121))
    assert "recomputed p = 1.3%; the reply recorded 1.2% when it drew it" in shown


async def test_ask_about_any_word_shows_its_exact_probability_beside_the_alternatives(tiny_model):
    app = make_app(str(tiny_model), sampling=SAMPLED)
    async with app.run_test(size=SIZE) as pilot:
        _, reply, inspector = await inspect_a_reply(pilot)
        asked = inspector.query_one("#asked")
        top = reply.reply.tokens[0].top[0]
        inspector.query_one("#ask").focus()
        await pilot.press(*top.text, "enter")
        await wait_for(pilot, lambda: "rank" in str(asked.render()))
        assert re.search(r"rank 1\b", str(asked.render())) and f"{top.prob:.1%}" in str(asked.render())
        for word in (" zebra crossing", "Paris"):
            inspector.query_one("#ask").value = ""
            await pilot.press(*word, "enter")
            await wait_for(pilot, lambda word=word: word.strip()[:5] in str(asked.render())
                           and "rank" in str(asked.render()))
            answer = inspector.probe.word(0, word).result()
            shown = str(asked.render())
            assert f"rank {answer.rank:,}" in shown
            assert ("(not top 10)" in shown) == (answer.rank > 10)
            if len(answer.tokens) > 1:
                assert " × " in shown, "a phrase is the product of its tokens' probabilities"


async def test_on_a_server_the_inspector_says_plainly_it_cannot_recompute():
    from fake_openai import fake_server
    from tui_chat.config import RemoteProfile

    with fake_server() as server:
        app = make_app("@lab:hostile", remotes={"lab": RemoteProfile("lab", server.base_url)})
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            await send(pilot, "hi")
            reply = await reply_done(pilot)
            inspector = await open_inspector(pilot, reply)
            await pilot.press("x")
            host = server.base_url.split("/")[2]
            assert f"the server {host} gives none on demand" in str(inspector.query_one("#xray").render())
            inspector.query_one("#ask").focus()
            await pilot.press("a", "enter")
            assert "gives none on demand" in str(inspector.query_one("#asked").render())


async def test_the_mask_shows_in_the_heatmap_and_the_inspector(tiny_model):
    from tui_chat.engine.formats import json_schema

    schema = json_schema('{"type": "object", "properties": {"a": {"type": "string", "maxLength": 8}}, '
                         '"required": ["a"], "additionalProperties": false}')
    app = make_app(str(tiny_model), sampling=SAMPLED.with_changes(max_tokens=60))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        screen.session.output_format = schema
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        forced = [i for i, t in enumerate(reply.reply.tokens) if t.grammar is not None and t.grammar.forced]
        assert forced and reply.reply.tokens[0].piece.startswith("{")
        await pilot.press("ctrl+t")
        reply.focus()
        await pilot.press("right", "left")

        def drawn() -> str:
            body = reply.query_one(".heatmap")
            return "".join(body.render_line(y).text for y in range(body.size.height))

        await wait_for(pilot, lambda: "token 1: the format's grammar removed" in drawn())
        body = reply.query_one(".heatmap")
        italic = {s.style.meta.get("token") for y in range(body.size.height) for s in body.render_line(y)
                  if s.style and s.style.italic and s.text.strip()}
        assert italic and italic <= set(forced)
        await pilot.press("enter")
        inspector = await screen_open(pilot, InspectorScreen)
        assert "The output format's grammar removed" in str(inspector.query_one("#facts").render())
        lines = [str(line) for line in candidate_lines(reply.reply.tokens[0], SAMPLED)]
        marks = [line.rstrip().endswith("forbidden") for line in lines]
        assert marks == [c.allowed is False for c in reply.reply.tokens[0].top] and any(marks)


@pytest.mark.starter
async def test_a_special_token_the_model_wrote_is_named_dimmed_in_the_inspector_and_not_in_the_reply(starter_model):
    """Issue 25, item 18: Gemma's `<start_of_image>` is no text; the reply leaves it out, the inspector names it."""
    sampling = GREEDY.with_changes(max_tokens=4, logit_bias=(("<start_of_image>", 100.0),))
    app = make_app(STARTER_NAME, sampling=sampling, n_ctx=2048)
    async with app.run_test(size=SIZE) as pilot:
        _, reply, inspector = await inspect_a_reply(pilot)
        assert "<start_of_image>" not in reply.text and len(reply.reply.tokens) == 4
        facts = inspector.query_one("#facts").render()
        assert str(facts).startswith("<start_of_image> not text: a special token")
        assert any("dim" in str(span.style) for span in facts.spans)


async def test_enter_on_a_reply_being_written_says_why_no_inspector_opens(tiny_model):
    """The footer offers Enter on a reply while it streams; the inspector opens on finished replies only, and
    the key said nothing (seen in tmux). It says so, and no screen opens."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        streaming = streaming_reply()
        await screen.query_one("#log").mount(streaming)
        streaming.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is screen
        assert [str(note.message) for note in app._notifications] == [
            "Enter inspects once the reply is finished; click a token to inspect it now."]
