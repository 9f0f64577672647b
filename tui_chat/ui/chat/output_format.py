"""The chat's settings the side panel sets (output format, streaming, sampling) kept with the chat; the output
format (free text, a JSON object, JSON under a schema, a grammar) reached from the palette: its picker lives deep
in the side panel, shown first where the panel is hidden."""

from __future__ import annotations

from textual import on

from ..panel.sampling import SamplingPanel
from .room import Room


class OutputFormatRoom(Room):
    @on(SamplingPanel.FormatChosen)
    def _format_chosen(self, event: SamplingPanel.FormatChosen) -> None:
        self.session.output_format = event.output
        self.session.keep_settings()

    @on(SamplingPanel.StreamingChosen)
    def _streaming_chosen(self, event: SamplingPanel.StreamingChosen) -> None:
        self.workspace.streaming = self.session.streaming = event.on

    @on(SamplingPanel.Rested)
    def _settings_rested(self) -> None:
        self.session.keep_settings()

    def action_output_format(self) -> None:
        if not self.query_one("#side").display:
            self.action_toggle_panel()
        self.query_one(SamplingPanel).focus_format()
