"""A load in flight and the replies of the chat (issue 39): a reply is its model's, the one that wrote it."""

from __future__ import annotations

import threading

from conftest import GREEDY
from test_ui import SIZE, loaded, make_app, notified, reply_done, send, wait_for


async def test_while_a_model_loads_no_reply_starts_on_the_model_about_to_go(tiny_model, starter_model):
    """Only a sent message waited for a load in flight: Ctrl+R (and F8, a branch, the lab) started on the old
    backend, a reply the chat would then keep under the new model."""
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        go_on, open_backend = threading.Event(), screen.workspace.open
        screen.workspace.open = lambda job: go_on.wait(60) and open_backend(job)  # the load waits for the keys
        screen.loader.load(str(starter_model))
        await pilot.pause()
        for key in ("ctrl+r", "f8", "f10"):
            await pilot.press(key)
            await pilot.pause()
            assert screen.reply is None and len(screen.session.turns[-1].branches) == 1, key
            assert notified(app)[-1].startswith("Loading "), (key, notified(app)[-1])
        go_on.set()
        await wait_for(pilot, lambda: screen.workspace.loading is None, timeout=60)
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        branch = screen.session.turns[-1].reply
        assert len(screen.session.turns[-1].branches) == 2 and branch.model == str(starter_model)


async def test_a_reply_stopped_by_a_new_model_is_kept_under_the_model_that_wrote_it(starter_model, tiny_model):
    """A load that ended while the old model's reply streamed stopped it, and kept it under the new model's
    name, which README says never happens."""
    app = make_app(str(starter_model), sampling=GREEDY.with_changes(max_tokens=600))
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Count from 1 to 1000: 1, 2, 3, 4,")
        await wait_for(pilot, lambda: screen.reply is not None and len(screen.reply.tokens) > 3)
        screen.loader.load(str(tiny_model))
        await wait_for(pilot, lambda: screen.reply is None and screen.session.turns[-1].reply is not None, timeout=60)
        reply = screen.session.turns[-1].reply
        assert reply.stop_reason == "cancelled" and reply.model == str(starter_model)
        assert screen.session.model == str(tiny_model)
