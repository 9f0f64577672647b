"""Nothing drawn when nothing changed: `serve`'s live view with no request in flight and the chat screen after a
reply draw no frame, counted as the screen's compositor updates (each one renders what changed, the cost an idle
view used to pay four times a second)."""

from __future__ import annotations

import asyncio
import json

from textual.screen import Screen
from textual.widgets import DataTable, Static

from test_serve import PROMPT, in_process, post
from test_ui import SIZE, make_app, reply_done, send, wait_for
from tui_chat.ui.serve import REFRESH_S, ServeApp
from tui_chat.ui.widgets import prompt
from tui_chat.ui.widgets.prompt import PromptInput

REQUESTS = 3
IDLE_S = 5.0


def frames_of(screen: Screen[object]) -> list[float]:
    """A list that gains an entry (the loop's time) for each frame `screen` draws from now on."""
    drawn: list[float] = []
    draw = screen._compositor_refresh

    def counted() -> None:
        drawn.append(asyncio.get_running_loop().time())
        draw()

    screen._compositor_refresh = counted  # type: ignore[method-assign]
    return drawn


async def test_an_idle_serve_view_draws_nothing(tiny_model):
    """After some requests have ended, five seconds without one: no frame at all."""
    with in_process(tiny_model) as (server, monitor, url):
        app = ServeApp(server, monitor, url)
        async with app.run_test(size=(140, 20)) as pilot:
            body = json.dumps({"messages": PROMPT, "max_tokens": 5}).encode()
            for _ in range(REQUESTS):
                status, _, _ = await asyncio.to_thread(post, f"{url}/chat/completions", body)
                assert status == 200
            await asyncio.sleep(3 * REFRESH_S)  # the last request's row and the totals drawn
            table = app.query_one(DataTable)
            assert [str(table.get_row_at(row)[0]) for row in range(table.row_count)] == ["3", "2", "1"]
            assert str(app.query_one("#totals", Static).render()).startswith(f"{REQUESTS} requests")
            drawn = frames_of(app.screen)
            await asyncio.sleep(IDLE_S)
            assert drawn == []
            await pilot.press("q")


async def test_a_row_changes_in_place_and_a_new_request_comes_first(tiny_model):
    """Rows are kept by request: a later request is added at the top, the ended ones keep their cells."""
    with in_process(tiny_model) as (server, monitor, url):
        app = ServeApp(server, monitor, url)
        async with app.run_test(size=(140, 20)) as pilot:
            body = json.dumps({"messages": PROMPT, "max_tokens": 5}).encode()
            await asyncio.to_thread(post, f"{url}/chat/completions", body)
            await asyncio.sleep(3 * REFRESH_S)
            table = app.query_one(DataTable)
            first = [str(cell) for cell in table.get_row("1")]
            await asyncio.to_thread(post, f"{url}/chat/completions", body)
            await asyncio.sleep(3 * REFRESH_S)
            assert [str(table.get_row_at(row)[0]) for row in range(table.row_count)] == ["2", "1"]
            assert [str(cell) for cell in table.get_row("1")] == first and first[3] == "length"
            await pilot.press("q")


async def test_the_chat_screen_after_a_reply_draws_nothing(tiny_model, monkeypatch):
    """A reply ended, the panel showing its figures, the cursor blinking in the message box: once the cursor holds
    still (BLINK_FOR_S after the last key), no frame at all; a key makes it blink again."""
    monkeypatch.setattr(prompt, "BLINK_FOR_S", 1.0)
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.workspace.backend is not None)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        box = screen.query_one(PromptInput)
        assert box.cursor_blink and box.has_focus
        await asyncio.sleep(1.5)  # the cursor held still, the collection once the chat is quiet done
        drawn = frames_of(app.screen)
        await asyncio.sleep(3.0)
        assert drawn == [] and not box.cursor_blink and box._cursor_visible
        await pilot.press("a")
        assert box.cursor_blink
