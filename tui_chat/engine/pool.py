"""Where the sampling settings cut the candidate pool: pure arithmetic, shared by the decode loop
(as each token is drawn) and the inspector (what today's settings would keep)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import PoolCut
from .params import SamplingParams
from .stages import plan

_ANY_VOCAB = 1 << 31


def pool_cut(ranked: np.ndarray, n_vocab: int, params: SamplingParams) -> PoolCut:
    """Candidates left after top-k, top-p and min-p, in the order the chain applies them
    (`sampler_order`; one left out of it cuts nothing), on the raw distribution.

    `ranked` holds the likeliest probabilities in descending order (at least top-k of them when
    top-k is on). Top-p renormalises over what came before it; min-p compares with the likeliest token.
    Temperature runs last by default, changing no count; at 0 the pick is greedy: one. The other
    samplers are not counted here: the X-ray (local/xray.py) shows the whole chain.
    """
    if params.temperature <= 0:
        return PoolCut(1, 1, 1)
    kept: int | None = n_vocab
    counts: dict[str, int | None] = {}
    listed = [stage for stage in params.sampler_order if stage in _CUTS]
    for stage in listed + [stage for stage in _CUTS if stage not in listed]:
        if stage in listed:
            kept = _CUTS[stage](ranked, kept, n_vocab, params)
        counts[stage] = kept
    return PoolCut(counts["top_k"], counts["top_p"], counts["min_p"])


def _top_k(ranked: np.ndarray, kept: int | None, n_vocab: int, params: SamplingParams) -> int | None:
    if params.top_k <= 0:
        return kept
    return min(params.top_k, n_vocab if kept is None else kept)


def _top_p(ranked: np.ndarray, kept: int | None, n_vocab: int, params: SamplingParams) -> int | None:
    if params.top_p >= 1.0:
        return kept
    considered = ranked if kept is None else ranked[:kept]
    mass = float(considered.sum()) if kept is not None and kept <= len(ranked) else 1.0
    cumulative = np.cumsum(considered) / mass
    reached = int(np.searchsorted(cumulative, params.top_p, side="left"))
    return reached + 1 if reached < len(cumulative) else None


def _min_p(ranked: np.ndarray, kept: int | None, n_vocab: int, params: SamplingParams) -> int | None:
    if params.min_p <= 0.0:
        return kept
    considered = ranked[: len(ranked) if kept is None else kept]
    survivors = int(np.count_nonzero(considered >= params.min_p * ranked[0]))
    return survivors if survivors < len(considered) or kept is not None else None


_CUTS = {"top_k": _top_k, "top_p": _top_p, "min_p": _min_p}


def kept_by(probs: Sequence[float], params: SamplingParams) -> int:
    """How many of these likeliest candidates (descending raw probabilities) `params` would keep.

    Only the listed candidates are known, so a cut that reaches past them keeps them all; the
    vocabulary is taken as larger than any top-k, so top-p weighs them against the whole of it.
    """
    cut = pool_cut(np.asarray(probs, dtype=np.float64), _ANY_VOCAB, params)
    counts = [count for count in (cut.top_k, cut.top_p, cut.min_p) if count is not None]
    return min([len(probs), *counts])


SAMPLE_STRIDE = 64  # every 64th logit estimates where the likeliest `k` begin
SAMPLE_SPARE = 16  # sampled logits kept above the estimate besides the 2k / SAMPLE_STRIDE a small k would get


def likeliest(logits: np.ndarray, k: int) -> np.ndarray:
    """The indices of the `k` largest logits, in no order. A partition of the whole vocabulary costs ~2.3 ms
    on the starter's 262,144 tokens (measured, AMD EPYC): per token, a sixth of a decode step. Instead, every
    SAMPLE_STRIDE-th logit estimates the value about 2k + SAMPLE_STRIDE * SAMPLE_SPARE of them clear; one pass
    keeps those, and whenever at least `k` do, they hold the `k` largest exactly (every token left out is below
    every token kept): ~0.15 ms a token whatever the shape of the distribution. An unlucky estimate pays for the
    whole partition: with the r-th largest sampled logit as the estimate, fewer than k clear it about as often as
    a Poisson variable of mean k / SAMPLE_STRIDE reaches r, so the spare keeps a small k from paying it (every
    32nd logit and r = 2k / 32 + 1 alone: k = 10 paid it on a quarter of the starter's tokens). A sparser sample
    is cheaper to partition (measured right after a decode: ~25 µs less a token than every 32nd)."""
    if k >= len(logits):
        return np.arange(len(logits))
    if k == 1:  # greedy's shortlist: one pass, ~0.02 ms where the sampled estimate costs ~0.15
        return np.array([np.argmax(logits)])
    sample = logits[::SAMPLE_STRIDE]
    rank = min(len(sample), 2 * k // SAMPLE_STRIDE + SAMPLE_SPARE)
    threshold = np.partition(sample, -rank)[-rank]
    shortlist = np.flatnonzero(logits >= threshold)
    if len(shortlist) >= k:
        return shortlist[np.argpartition(logits[shortlist], -k)[-k:]]
    return np.argpartition(logits, -k)[-k:]


def penalised_before_cuts(params: SamplingParams) -> bool:
    """Whether the chain's penalties move logits before a cut counts them."""
    stages = plan(params)
    cuts = [index for index, stage in enumerate(stages) if stage in _CUTS]
    return "penalties" in stages and bool(cuts) and stages.index("penalties") < cuts[0]


def penalised(logits: np.ndarray, best: np.ndarray, shift: float, total: float, recent: Sequence[int],
              params: SamplingParams) -> np.ndarray:
    """The likeliest probabilities after llama.cpp's penalties (`llama_sampler_init_penalties`: a repeated token's
    logit divided by the repeat penalty where positive, multiplied where not, then lowered by its count times the
    frequency penalty and by the presence penalty), descending. `total` is the sum of exp(logit - `shift`) over
    the vocabulary; only the tokens in `recent` change, so it is corrected by theirs alone."""
    tokens, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
    before = logits[tokens].astype(np.float64)
    after = np.where(before > 0, before / params.repeat_penalty, before * params.repeat_penalty)
    after -= counts * params.frequency_penalty + params.presence_penalty
    total += float(np.exp(after - shift).sum() - np.exp(before - shift).sum())
    ids = np.union1d(best, tokens)
    moved = logits[ids].astype(np.float64)
    moved[np.searchsorted(ids, tokens)] = after
    return np.sort(np.exp(moved - shift) / total)[::-1]
