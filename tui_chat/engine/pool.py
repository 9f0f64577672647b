"""Where the sampling settings cut the candidate pool: pure arithmetic, shared by the decode loop
(as each token is drawn) and the inspector (what today's settings would keep)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import PoolCut
from .params import SamplingParams

_ANY_VOCAB = 1 << 31


def pool_cut(ranked: np.ndarray, n_vocab: int, params: SamplingParams) -> PoolCut:
    """Candidates left after top-k, then top-p, then min-p, as llama.cpp's chain applies them.

    `ranked` holds the likeliest probabilities in descending order (at least top-k of them when
    top-k is on). Top-p renormalises over what top-k kept; min-p compares with the likeliest token.
    Temperature comes last in the chain, so it changes no count; at 0 the pick is greedy: one.
    """
    if params.temperature <= 0:
        return PoolCut(1, 1, 1)
    after_k = min(params.top_k, n_vocab) if params.top_k > 0 else n_vocab
    after_p: int | None = after_k
    if params.top_p < 1.0:
        kept = ranked[:after_k]
        mass = float(kept.sum()) if after_k <= len(ranked) else 1.0
        cumulative = np.cumsum(kept) / mass
        reached = int(np.searchsorted(cumulative, params.top_p, side="left"))
        after_p = reached + 1 if reached < len(cumulative) else None
    after_m = after_p
    if params.min_p > 0.0:
        considered = ranked[: after_p if after_p is not None else len(ranked)]
        survivors = int(np.count_nonzero(considered >= params.min_p * ranked[0]))
        after_m = survivors if survivors < len(considered) or after_p is not None else None
    return PoolCut(after_k, after_p, after_m)


def kept_by(probs: Sequence[float], params: SamplingParams) -> int:
    """How many of these likeliest candidates (descending raw probabilities) `params` would keep.

    Only the listed candidates are known, so a cut that reaches past them keeps them all; the
    vocabulary is taken as larger than any top-k, so top-p weighs them against the whole of it.
    """
    cut = pool_cut(np.asarray(probs, dtype=np.float64), _ANY_VOCAB, params)
    counts = [count for count in (cut.top_k, cut.top_p, cut.min_p) if count is not None]
    return min([len(probs), *counts])
