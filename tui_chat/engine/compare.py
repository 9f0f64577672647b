"""What the sampling lab reads from its columns' tokens, whatever engine wrote them: where a column first
diverged from the first one, and how surprised each was by its own draws. No llama.cpp here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Token

MAX_COLUMNS = 4  # settings compared side by side in one run

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
    """None where `other` drew the same tokens as `first` for as long as both went on."""
    for position, (mine, theirs) in enumerate(zip(other, first, strict=False)):
        if mine.token_id != theirs.token_id:
            return Divergence(position, mine, theirs)
    return None


def mean_surprise(tokens: Sequence[Token]) -> float | None:
    """The mean of −log p (nats) over the tokens the model drew, under its raw distribution; None with none."""
    probs = [token.prob for token in tokens if token.prob is not None and not token.forced and not token.inserted]
    if not probs:
        return None
    return sum(-math.log(max(prob, 1e-45)) for prob in probs) / len(probs)
