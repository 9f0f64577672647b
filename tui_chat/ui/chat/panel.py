"""The side panel: shown or hidden (F2), a sampling preset or a price from the palette, a price chosen on it; and
F1, the list of every key, which covers it."""

from __future__ import annotations

from ..keys import CHAT_KEYS
from ..panel.metrics import MetricsPanel
from .room import PaletteChoice, Room


class PanelRoom(Room):
    def action_toggle_panel(self) -> None:
        self.chat.panels.toggle()

    def on_palette_choice(self, choice: PaletteChoice) -> None:
        if choice.what == "preset":
            self.chat.panels.sampling.apply_preset(choice.name)
        else:
            self.chat.panels.metrics.choose_price(choice.name)

    def on_metrics_panel_price_chosen(self, event: MetricsPanel.PriceChosen) -> None:
        try:
            self.chat.workspace.set_price(event.name)
        except OSError as error:
            self.chat.notify(f"cannot save the price preset: {error.strerror}", severity="warning", markup=False)
        self.chat.panels.show_figures(edited=True)

    def action_help(self) -> None:
        from ..screens.help import HelpScreen, chat_sections

        self.chat.app.push_screen(HelpScreen(chat_sections(CHAT_KEYS), self.chat.workspace.config.keys))
