"""The sampler X-ray: why a token was drawn, stage by stage, and the exact probability of any text.

Nothing here runs per token unless asked. On demand, the position's logits are recomputed in the
scratch sequence (`LlamaSession.scratch_logits`) and llama.cpp's own samplers are applied to them one
at a time, so every figure is what the chain does, not a re-implementation of it.

What cannot be replayed exactly is said in the stage's note: XTC fires at random, so the X-ray shows
it firing unless that would have removed the drawn token; mirostat adapts its target as it goes, and
a recomputed chain starts it afresh. Run with the reply (`Request.xray`), both are exact.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..base import Candidate, EngineError, Stage, WordProbability, XRay
from ..params import DEFAULT_ORDER, SamplingParams
from ..stages import plan
from .llamacpp import LlamaSession

_REORDERING = {"logit_bias": "raised or lowered", "penalties": "lowered", "dry": "lowered"}  # the rest cut


def raw_probability(logits: np.ndarray, token: int) -> tuple[float, int]:
    """`token`'s probability under the raw distribution (softmax of the logits) and its rank (1 = likeliest)."""
    row = logits.astype(np.float64)
    top = row.max()
    prob = float(np.exp(row[token] - top) / np.exp(row - top).sum())
    return prob, 1 + int(np.count_nonzero(row > row[token]))


def explain(session: LlamaSession, logits: np.ndarray, token: int, piece: str, params: SamplingParams,
            history: Sequence[int]) -> tuple[float, int, tuple[Stage, ...], str]:
    """Raw probability, raw rank, stages and verdict for `token` drawn from `logits` under `params`,
    after `history` (what the penalties and DRY look at). The raw softmax is computed once."""
    reader = session.stage_reader
    prob = float(reader.distribution(logits)[token])
    rank = 1 + int(np.count_nonzero(logits > logits[token]))
    stages = _cuts(session, logits, token, params, history)
    default_cut = None
    default = params.with_changes(sampler_order=DEFAULT_ORDER)
    if rank > 1 and plan(default) != plan(params):
        default_cut = next((s for s in _cuts(session, logits, token, default, history) if s.rank is None), None)
    return prob, rank, stages, verdict(piece, prob, rank, stages, default_cut)


def xray_at(session: LlamaSession, context: Sequence[int], token: int, params: SamplingParams) -> XRay:
    """The X-ray of `token` drawn after `context`, recomputing that position's logits (see module doc)."""
    started = time.perf_counter()
    logits = session.scratch_logits(context)[0]
    piece = session.piece(token).decode("utf-8", errors="replace")
    prob, rank, stages, line = explain(session, logits, token, piece, params, context)
    return XRay(token, piece, prob, rank, stages, line, time.perf_counter() - started)


def word_probability(session: LlamaSession, context: Sequence[int], text: str) -> WordProbability:
    """The probability that the model writes `text` next after `context`: its tokens as they would be
    written mid-sentence (`continuation`), each one's conditional probability read after feeding the
    ones before it, multiplied."""
    tokens = session.continuation(text)
    if not tokens:
        raise EngineError("type a word or phrase to ask about")
    rows = session.scratch_logits(context, tokens[:-1])
    parts = []
    for row, token in zip(rows, tokens, strict=True):
        prob, _ = raw_probability(row, token)
        parts.append(Candidate(token, session.piece(token).decode("utf-8", errors="replace"), prob))
    _, rank = raw_probability(rows[0], tokens[0])
    return WordProbability(text, tuple(parts), float(np.prod([part.prob for part in parts])), rank)


def verdict(piece: str, prob: float, rank: int, stages: Sequence[Stage], default_cut: Stage | None = None) -> str:
    """One line on why this token was drawn, from the stage figures. A draw from several candidates is chance:
    the line gives its odds, then what the stages did to the likelier tokens, never as its cause.

    `default_cut`: the stage that removes the token when the chain runs in llama.cpp's default order,
    if one does: then the order kept it in the draw (llama.cpp #7498).
    """
    head = f"{_shown(piece)} drawn at rank {rank} with p = {prob:.2g}"
    removed = next((s for s in stages if s.rank is None), None)
    if removed is not None:
        return (f"{head}, though {removed.label} removes it with these settings: it was drawn with "
                "other settings, or another state of the chain")
    if stages and stages[-1].name == "greedy":
        if rank == 1:
            return f"{head}: temperature 0 takes the likeliest token"
        mover = next(s for s in stages if s.rank == 1)
        return (f"{head} because {mover.label} pushed the likelier tokens below it, "
                "and temperature 0 takes the likeliest")
    if rank == 1:
        return f"{head}: the likeliest token" + (f", a {stages[-1].prob:.0%} chance among the {stages[-1].kept} left"
                                                  if stages else "")
    odds = f"{head}: {_odds(prob, stages)}"
    if default_cut is not None:
        return f"{odds}; {_order_reason(stages, default_cut)}"
    rise = _biggest_rise(stages, rank)
    if rise is None:
        return odds
    mover, was, now = rise
    if mover.name not in _REORDERING:
        return f"{odds}; {mover.label} removed the {was - now} likelier tokens"
    return f"{odds}; {mover.label} {_REORDERING[mover.name]} the likelier tokens (rank {was} → {now})"


def _odds(prob: float, stages: Sequence[Stage]) -> str:
    """The draw's odds among what the stages left: `a 4.0% chance among the 12 candidates min-p 0.05 left`."""
    if not stages:
        return f"a {prob:.1%} chance, nothing cut the pool"
    cutter = _last_cut(stages)
    where = f"the {stages[-1].kept} candidates {cutter.label} left" if cutter else "all candidates"
    return f"a {stages[-1].prob:.1%} chance among {where}"


def _cuts(session: LlamaSession, logits: np.ndarray, token: int, params: SamplingParams,
          history: Sequence[int]) -> tuple[Stage, ...]:
    """The stages of a chain built for the X-ray, over the raw distribution `explain` computed."""
    chain = session.chains.build(params, 0, history, xtc_always=True)
    try:
        return session.stage_reader.stages(chain, logits, token, fresh=True, distributed=True)
    finally:
        chain.free()


def _order_reason(stages: Sequence[Stage], cut: Stage) -> str:
    """Which stage, run before `cut` here but after it in llama.cpp's order, let the token through."""
    names = [s.name for s in stages]
    if cut.name not in names:
        return f"{cut.label} is left out of the order (in llama.cpp's order it removes it)"
    earlier = [s for s in stages[: names.index(cut.name)]
               if s.name in DEFAULT_ORDER and DEFAULT_ORDER.index(s.name) > DEFAULT_ORDER.index(cut.name)]
    pick = next((s for s in earlier if s.name == "temperature"), earlier[0] if earlier else None)
    if pick is None:
        return f"the order is not llama.cpp's, where {cut.label} removes it"
    return f"{pick.label} ran before {cut.label} (in llama.cpp's order {cut.label} removes it)"


def _biggest_rise(stages: Sequence[Stage], rank: int) -> tuple[Stage, int, int] | None:
    """The stage that moved the token up the most (penalties lowering others; XTC or typical-p removing them),
    with the token's rank before and after it; None when none did."""
    best: tuple[Stage, int, int] | None = None
    was = rank
    for stage in stages:
        if stage.rank is None:
            continue  # it removed the token: `verdict` says so before asking what moved it up
        if stage.rank < was and (best is None or was - stage.rank > best[1] - best[2]):
            best = (stage, was, stage.rank)
        was = stage.rank
    return best


def _last_cut(stages: Sequence[Stage]) -> Stage | None:
    """The last stage that removed candidates (the share of the raw distribution left went down)."""
    cutter, mass = None, 1.0
    for stage in stages:
        if stage.mass < mass:
            cutter = stage
        mass = stage.mass
    return cutter


def _shown(piece: str) -> str:
    return repr(piece)
