"""The chat's settings the side panel sets (output format, streaming, sampling) kept with the chat; the output
format (free text, a JSON object, JSON under a schema, a grammar) reached from the palette: its picker lives deep
in the side panel, shown first where the panel is hidden."""

from __future__ import annotations

from ..panel.sampling import SamplingPanel
from .room import Room


class OutputFormatRoom(Room):
    def on_sampling_panel_format_chosen(self, event: SamplingPanel.FormatChosen) -> None:
        self.chat.session.output_format = event.output
        self.chat.session.keep_settings()

    def on_sampling_panel_streaming_chosen(self, event: SamplingPanel.StreamingChosen) -> None:
        self.chat.workspace.streaming = self.chat.session.streaming = event.on

    def on_sampling_panel_rested(self, _: SamplingPanel.Rested) -> None:
        self.chat.session.keep_settings()

    def action_output_format(self) -> None:
        self.chat.panels.show()
        self.chat.panels.sampling.focus_format()
