"""The KV cache on disk in the app, through Pilot on the real tiny model: a chat reopened in a new app (as
after a restart) says in its footer and in the panel what came from disk; deleting a chat (Ctrl+L, Ctrl+D
twice) or a model (F5, Delete) deletes their saved caches."""

from __future__ import annotations

import shutil

from test_history_ui import chats_open
from test_kvcache import NOTES
from test_models_screen import local_names, open_models
from test_ui import SIZE, loaded, make_app, reply_done, send, wait_for
from tui_chat.config import kv_cache_dir
from tui_chat.engine.local.kvstore import KvStore
from tui_chat.ui.panel.metrics import MetricsPanel
from tui_chat.ui.screens.models import ConfirmScreen


def saved_for() -> list[str]:
    """The chats the saved states belong to."""
    return sorted(entry.notes.conversation for entry in KvStore(kv_cache_dir()).list_entries())


async def test_a_chat_reopened_after_a_restart_says_what_came_from_disk(tiny_model):
    async with make_app(str(tiny_model), system_prompt=NOTES).run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "What is the capital of France?")
        first = await reply_done(pilot)
    assert "from disk" not in first.reply.footer and saved_for() == ["1"]
    async with make_app(str(tiny_model)).run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await chats_open(pilot)
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.is_current and screen.session.conversation_id == 1)
        await send(pilot, "And of Germany?")
        reply = await reply_done(pilot)
        restored = screen.query_one(MetricsPanel).metrics.restored_tokens
        tokens = str(screen.query_one("#tokens").render())
    assert restored > 0 and f"restored {restored:,} tokens from disk in " in reply.reply.footer
    assert f"Restored {restored:,} tokens from disk" in tokens


async def test_deleting_a_chat_deletes_its_saved_caches(tiny_model):
    async with make_app(str(tiny_model), system_prompt=NOTES).run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for question in ("Tell me about cats", "Tell me about dogs"):
            await send(pilot, question)
            await reply_done(pilot)
            await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: saved_for() == ["1", "2"])
        chats = await chats_open(pilot)
        assert [summary.id for summary in chats.shown] == [2, 1]
        await pilot.press("down", "ctrl+d", "ctrl+d")
        await wait_for(pilot, lambda: saved_for() == ["2"])


async def test_removing_a_model_in_f5_deletes_its_saved_caches(tiny_model, models):
    models.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_model, models / "tiny-copy.gguf")
    async with make_app("tiny-copy.gguf", system_prompt=NOTES).run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello")
        await reply_done(pilot)
        await wait_for(pilot, lambda: saved_for() == ["1"])
        screen = await open_models(pilot)
        assert local_names(screen) == ["tiny-copy.gguf"]
        await pilot.press("delete")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: local_names(screen) == [] and saved_for() == [])
