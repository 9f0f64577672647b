"""Issue 44, cosmetic: F1 said F5 holds "local ones, and GGUF models to download"; it has a Servers tab too."""

from __future__ import annotations

import re

from textual.widgets import Static, Tab

from test_ui import SIZE, loaded, make_app, screen_open
from tui_chat.ui.screens.help import HelpScreen
from tui_chat.ui.screens.models import ModelsScreen


async def test_f1_names_every_tab_f5_opens_on(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("f5")
        models = await screen_open(pilot, ModelsScreen)
        tabs = [str(tab.label) for tab in models.query(Tab)]
        assert tabs == ["Local", "Servers", "Search hub"]
        await pilot.press("escape")
        await pilot.press("f1")
        help_screen = await screen_open(pilot, HelpScreen)
        chat = f"\n{help_screen.query_one(Static).render()}".split("\nChat\n")[1].split("\n\n")[0]
        entries = re.split(r"\n(?=  \S)", f"\n{chat}")  # a key's line and its description's wrapped lines
        [f5] = [" ".join(entry.split()) for entry in entries if entry.startswith("  f5 ")]
        assert f5 == "f5 Models: local ones, configured servers, and GGUF models to download from the hub"
