"""Fitting a conversation into the context window: the oldest whole turns go first.

The system prompt and the newest turn always stay: without them the reply has no instructions or no
question. What is left out is only left out of this prompt; the conversation itself keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import EngineError, Message

REPLY_SHARE = 4  # the reply is guaranteed at most 1/4 of the context, so long max_tokens don't empty it


@dataclass(frozen=True, slots=True)
class Fitted:
    messages: list[Message]
    dropped_turns: int


def left_out(turns: int) -> str:
    """What the user is told: `2 earlier turns left out`."""
    return f"{turns} earlier turn{'' if turns == 1 else 's'} left out"


def reply_reserve(max_tokens: int, n_ctx: int) -> int:
    """Room kept free for the reply when trimming: max_tokens, but never more than a quarter of the context."""
    return max(1, min(max_tokens, n_ctx // REPLY_SHARE))


def split_turns(messages: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """Leading system messages, then turns: each starts at a user message and holds what answers it."""
    head = 0
    while head < len(messages) and messages[head].role == "system":
        head += 1
    turns: list[list[Message]] = []
    for message in messages[head:]:
        if message.role == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return messages[:head], turns


def fit_context(
    messages: list[Message], prompt_tokens: Callable[[list[Message]], int], n_ctx: int, max_tokens: int
) -> Fitted:
    """The messages to send, leaving out the fewest oldest turns so that the prompt plus the reply
    reserve fits `n_ctx`. `prompt_tokens` counts the rendered prompt of a message list.

    When even the system prompt and the newest turn leave no room for the reserve, that is an error:
    a reply cut after a few tokens with no word of why is worse than being told.
    """
    system, turns = split_turns(messages)
    reserve = reply_reserve(max_tokens, n_ctx)
    budget = n_ctx - reserve

    def keep_from(first_turn: int) -> list[Message]:
        return system + [m for turn in turns[first_turn:] for m in turn]

    size = prompt_tokens(messages)
    if size <= budget or len(turns) <= 1:
        dropped = 0
    else:
        # Fewer turns never make a longer prompt, so the smallest drop that fits is found by bisection.
        low, high = 1, len(turns) - 1
        sizes: dict[int, int] = {}
        while low < high:
            middle = (low + high) // 2
            sizes[middle] = prompt_tokens(keep_from(middle))
            if sizes[middle] <= budget:
                high = middle
            else:
                low = middle + 1
        dropped = low
        size = sizes[dropped] if dropped in sizes else prompt_tokens(keep_from(dropped))
    if size >= n_ctx:
        raise EngineError(
            f"the newest message needs {size:,} tokens with the system prompt, but the context holds {n_ctx:,}: "
            "shorten it or raise n_ctx"
        )
    if size > budget:
        raise EngineError(
            f"the newest message needs {size:,} tokens with the system prompt and the reply {reserve:,} more "
            f"(max tokens, at most a quarter of the context), but the context holds {n_ctx:,}: shorten the message, "
            "lower max tokens or raise n_ctx"
        )
    return Fitted(keep_from(dropped), dropped)
