"""What the sampling lab reads from its columns' tokens, whatever engine wrote them: where a column first
diverged from the first one, and how surprised each was by its own draws. No llama.cpp here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .base import ColumnEvent, Done, Event, Metrics, PromptProgress, Stream, Token

MAX_COLUMNS = 4  # settings compared side by side in one run
MAX_SLOTS = 16  # requests `tui-chat serve` decodes together (--parallel), each in a sequence of its own


class ColumnStream(Stream):
    """A column's events go into the lab's stream, each marked with the column's place (a server's progress
    through the prompt goes as it is: the prompt is the lab's); cancelling the lab cancels every column."""

    def __init__(self, lab: Stream, column: int) -> None:
        super().__init__()
        self.lab = lab
        self.column = column
        self.cancelled = lab.cancelled

    def put(self, event: Event) -> None:
        if isinstance(event, PromptProgress):
            self.lab.put(event)
            return
        assert isinstance(event, (Token, Metrics, Done)), "a column's events are its tokens, figures and end"
        self.lab.put(ColumnEvent(self.column, event))


def overlapped(spans: Sequence[tuple[float, float]]) -> bool:
    """Whether any two (first token, last token) times overlap: the columns were decoded at the same time."""
    ordered = sorted(spans)
    return any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:], strict=False))

@dataclass(frozen=True, slots=True)
class Divergence:
    """The first position where a column drew another token than the first column: both tokens, each with its
    probability there. Both columns had read the same text up to it, so both are under the same distribution."""

    position: int
    token: Token
    first: Token

    def as_dict(self) -> dict[str, object]:
        return {"position": self.position, "token": self.token.piece or self.token.text, "id": self.token.token_id,
                "prob": self.token.prob, "first_token": self.first.piece or self.first.text,
                "first_id": self.first.token_id, "first_prob": self.first.prob}


def divergence(first: Sequence[Token], other: Sequence[Token]) -> Divergence | None:
    """None where `other` drew the same tokens as `first` for as long as both went on. Their texts are compared
    too: a server that does not say token ids sends -1 for every one."""
    for position, (mine, theirs) in enumerate(zip(other, first, strict=False)):
        if (mine.token_id, mine.piece or mine.text) != (theirs.token_id, theirs.piece or theirs.text):
            return Divergence(position, mine, theirs)
    return None


def mean_surprise(tokens: Sequence[Token]) -> float | None:
    """The mean of −log p (nats) over the tokens the model drew, under its raw distribution; None with none."""
    probs = [token.prob for token in tokens if token.prob is not None and not token.forced and not token.inserted]
    if not probs:
        return None
    return sum(-math.log(max(prob, 1e-45)) for prob in probs) / len(probs)
