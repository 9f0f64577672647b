"""One conversation as it is written to the history: each prompt when sent, each reply as it
streams. Shared by `tui-chat run --save` and the chat screen, so both store the same shape."""

from __future__ import annotations

from dataclasses import dataclass

from .engine.base import Done, Error, written
from .engine.formats import OutputFormat
from .engine.params import SamplingParams
from .history import History, ReplyWriter, ToolSwitches
from .pricing import Price, turn_cost


@dataclass(frozen=True, slots=True)
class Saving:
    """Where conversations are kept, and the price their replies are costed at."""

    history: History
    price: Price


Settings = tuple[SamplingParams, OutputFormat, ToolSwitches]


class SavedChat:
    """The conversation is created with its first message, so opening the app stores nothing.
    `settings`: its sampling and output format as the history has them, so an unchanged one is not
    written again (which would also move the chat up the list of recent ones)."""

    def __init__(self, saving: Saving, conversation_id: int | None = None, last_id: int | None = None,
                 settings: Settings | None = None) -> None:
        self.history = saving.history
        self.price = saving.price
        self.id = conversation_id
        self.last_id = last_id  # the message the next one follows on the active path
        self.settings = settings

    def add_user(self, prompt: str, model: str, system: str, settings: Settings, thinking: bool = True) -> int:
        params, output, tools = settings
        if self.id is None:
            self.id = self.history.create(model=model, system_prompt=system, sampling=params, output_format=output,
                                          thinking=thinking, tools=tools)
        else:
            self.history.update(self.id, model=model, sampling=params, output_format=output, thinking=thinking,
                                tools=tools)
        self.settings = settings
        self.last_id = self.history.add_user_message(self.id, prompt, self.last_id)
        return self.last_id

    def keep_settings(self, settings: Settings) -> None:
        """The chat's settings are what was last set in it: a slider moved after its last reply, a stop
        sequence cleared before a branch, tools switched (a chat not yet saved gets them with its first message)."""
        if self.id is not None and settings != self.settings:
            params, output, tools = settings
            self.history.update(self.id, sampling=params, output_format=output, tools=tools)
            self.settings = settings

    def start_reply(self, parent_id: int, model: str, fork_of: int | None = None,
                    fork_token: int | None = None) -> ReplyWriter:
        assert self.id is not None, "a reply follows a stored message, so its chat is stored"
        return self.history.start_reply(self.id, parent_id, fork_of=fork_of, fork_token=fork_token, model=model)

    def end_reply(self, reply: ReplyWriter, final: Done | Error) -> None:
        if isinstance(final, Error):
            reply.fail(final.message)
            if written(final):
                self.last_id = reply.id  # a reply cut short is still what the chat goes on from
            return
        m = final.metrics
        cost = turn_cost(self.price, m.prompt_tokens, m.cached_tokens, m.output_tokens).total
        reply.finish(final.text, final.stop_reason, m, cost, final.incomplete, final.reasoning, final.stop_sequence,
                     final.tool_calls)
        self.last_id = reply.id

    def choose(self, message_id: int) -> None:
        """Another branch of the last reply is now the one the chat goes on from."""
        self.history.set_active(message_id)
        self.last_id = message_id

    def take_back(self, message_id: int, parent_id: int | None) -> None:
        self.history.delete_message(message_id)
        self.last_id = parent_id
