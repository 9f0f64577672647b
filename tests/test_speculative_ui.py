"""Speculative decoding as the chat screen shows it: drafted tokens underlined in the heatmap, the inspector's
word on each, and the panel's acceptance, tokens per batch and speed-up against plain decoding."""

from __future__ import annotations

from test_speculative import COPY, COPY_PARAMS
from test_ui import SIZE, loaded, make_app, reply_done, send
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.widgets.heatmap import DRAFTED


async def test_drafted_tokens_are_underlined_and_the_panel_counts_them(starter_model):
    app = make_app(str(starter_model), COPY_PARAMS, n_ctx=2048, draft="ngram", threads=1, threads_batch=1)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, COPY)
        reply = await reply_done(pilot, timeout=120)
        tokens = reply.reply.tokens
        drafted = {i for i, t in enumerate(tokens) if t.drafted and t.piece.strip()}
        assert drafted and len(drafted) < len(tokens)
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert "underlined: drafted, kept" in str(screen.query_one("#legend").render())
        body = reply.query_one(".heatmap")
        underlined = set()
        for y in range(body.size.height):
            for segment in body.render_line(y):
                index = segment.style.meta.get("token") if segment.style else None
                if index is not None and segment.text.strip():
                    assert bool(segment.style.underline) == (index in drafted), (index, segment.text)
                    underlined.add(index) if segment.style.underline else None
        assert underlined == drafted and DRAFTED.underline
        speed = screen.query_one(MetricsPanel).query_one("#speed")
        panel = str(speed.render())
        metrics = screen.query_one(MetricsPanel).metrics
        assert f"Draft    ngram · {metrics.acceptance:.0%} kept\n         {metrics.tokens_per_verification:.1f} " \
               "tok/batch\n" in panel
        assert "× plain" in panel, "plain decoding was measured at the start of the reply"
        assert max(map(len, panel.splitlines())) <= speed.content_size.width, "no figure wraps in the panel"
        reply.focus()
        first = min(drafted)
        await pilot.press("enter")
        await pilot.pause()
        inspector = app.screen
        for _ in range(first):
            await pilot.press("right")
        await pilot.pause()
        assert "drafted: guessed ahead" in str(inspector.query_one("#facts").render())
