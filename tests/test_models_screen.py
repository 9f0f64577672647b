"""The models screen through Pilot: the real app, the tiny model, the fake hub on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from fake_hub import FILE, REF, REPO
from test_ui import SIZE, loaded, make_app, reply_done, send, wait_for
from tui_chat.config import load_config
from tui_chat.hub.catalog import pull
from tui_chat.ui.chat.screen import ChatScreen
from tui_chat.ui.screens.models import ConfirmScreen, ModelsScreen


@pytest.fixture
def hub(fake_hub, tiny_model):
    fake_hub.add_repo(REPO, {FILE: tiny_model.read_bytes()}, downloads=77, likes=2)
    return fake_hub


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def local_names(screen: ModelsScreen) -> list[str]:
    return list(screen.local)


async def open_models(pilot) -> ModelsScreen:
    await pilot.press("f5")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModelsScreen))
    return pilot.app.screen


async def download_the_tiny_model(pilot, screen: ModelsScreen) -> None:
    """Search, open the repo, press Enter on its file: what a user does to start a download."""
    await pilot.press("s", *"tiny", "enter")
    await wait_for(pilot, lambda: screen.query_one("#repos").row_count == 1)
    await pilot.press("enter")
    await wait_for(pilot, lambda: screen.query_one("#files").row_count == 1)
    await pilot.press("enter")


async def test_search_download_and_load_a_hub_model(hub, models, tiny_model):
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        chat = await loaded(pilot)
        screen = await open_models(pilot)
        await pilot.press("s", *"tiny", "enter")
        await wait_for(pilot, lambda: screen.query_one("#repos").row_count == 1)
        assert "1 GGUF repositories" in text(screen, "#hub-status")
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.query_one("#files").row_count == 1)
        await pilot.press("enter")
        await wait_for(pilot, lambda: local_names(screen) == [REF])
        await pilot.press("l", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await wait_for(pilot, lambda: text(chat, "#model-title") == "tiny-Q4_K_M")
        await send(pilot, "Hello")
        assert (await reply_done(pilot)).text


async def test_a_download_goes_on_while_chatting_and_can_be_cancelled(hub, models, tiny_model):
    hub.faults.stall_after[FILE] = 150_000
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        screen = await open_models(pilot)
        await download_the_tiny_model(pilot, screen)
        await wait_for(pilot, lambda: "% " in text(screen, "#download-status"))
        shown = text(screen, "#download-status")
        assert shown.startswith(f"{FILE} · ") and "KiB / 389.6 KiB" in shown
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await send(pilot, "Hello")
        assert (await reply_done(pilot)).text, "the chat answers while the download runs"
        assert await open_models(pilot) is screen
        assert text(screen, "#download-status") == shown and screen.query_one("#download").display
        await pilot.press("c")
        hub.faults.release.set()
        await wait_for(pilot, lambda: "Cancelled" in text(screen, "#download-status"))
        part = models / "hub" / "tiny-org" / "tiny-GGUF" / (FILE + ".part")
        assert part.stat().st_size == 150_000 and local_names(screen) == []
        del hub.faults.stall_after[FILE]
        await pilot.press("enter", "escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await wait_for(pilot, lambda: local_names(screen) == [REF])
        assert hub.requests("/cdn/")[-1].headers["Range"] == "bytes=150000-"


async def test_quitting_mid_download_keeps_the_part_for_next_time(hub, models, tiny_model):
    hub.faults.stall_after[FILE] = 150_000
    part = models / "hub" / "tiny-org" / "tiny-GGUF" / (FILE + ".part")
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot)
        await download_the_tiny_model(pilot, screen)
        await wait_for(pilot, lambda: part.exists() and part.stat().st_size == 150_000)
        started = time.monotonic()
    assert time.monotonic() - started < 5, "quitting does not wait for the download"
    hub.faults.release.set()
    del hub.faults.stall_after[FILE]
    pull(REF, models, lambda progress: None)
    assert hub.requests("/cdn/")[-1].headers["Range"] == "bytes=150000-"


async def test_offline_the_hub_tab_says_so_at_once(hub, models, tiny_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot)
        await pilot.press("s")
        assert text(screen, "#hub-status").startswith("offline (HF_HUB_OFFLINE is set)")
        assert screen.query_one("#query").disabled
    assert hub.seen == []


async def test_hub_errors_show_in_the_screen(hub, models, tiny_model):
    hub.faults.status = 404
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot)
        await pilot.press("s", *"tiny", "enter")
        await wait_for(pilot, lambda: "404" in text(screen, "#hub-status"))
        assert text(screen, "#hub-status") == "search: not found on the hub (404)"
        assert screen.query_one("#hub-status").has_class("-error")


async def test_set_default_delete_with_confirm_and_import(hub, models, tiny_model, tmp_path):
    pull(REF, models, lambda progress: None)
    app = make_app(str(tiny_model))
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_models(pilot)
        assert local_names(screen) == [REF]
        await pilot.press("d")
        assert load_config().default_model == REF
        assert "default" in str(screen.query_one("#local-models").get_row(REF)[-1])
        await pilot.press("delete")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await pilot.pause()
        assert local_names(screen) == [REF]
        await pilot.press("delete")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "the starter model takes its place" in app.screen.question
        await pilot.press("y")
        await wait_for(pilot, lambda: local_names(screen) == [])
        assert not (models / "hub").exists()
        assert load_config().default_model is None  # the next launch opens the starter, not a missing file
        await pilot.press("i")
        screen.query_one("#import-path").value = str(tmp_path / "missing.gguf")
        await pilot.press("enter")
        assert local_names(screen) == [] and screen.query_one("#import-path").display
        screen.query_one("#import-path").value = str(tiny_model)
        await pilot.press("enter")
        await wait_for(pilot, lambda: local_names(screen) == ["tiny.gguf"])
