"""Which of llama.cpp's samplers the settings turn on, in which order, and how each is named: the plan of
the sampler chain, without llama.cpp, so the UI can show the order and the X-ray's labels before (or
without) loading a model. local/chain.py builds the plan with llama.cpp.

It follows llama.cpp's `common/sampling.cpp`: the logit bias first; then the stages in `sampler_order`,
each only when its setting turns it on; then the draw. Mirostat v2, when on, replaces the ordered stages
with temperature and its own draw. Temperature 0 ends the chain with greedy right where temperature
stands in the order; the stages that can never drop the likeliest token (top-k, top-p, min-p, top-nσ)
are left out then, since they cannot change a greedy pick.
"""

from __future__ import annotations

from collections.abc import Callable

from .params import SamplingParams

_KEEP_LIKELIEST = frozenset({"top_n_sigma", "top_k", "top_p", "min_p"})


_ON: dict[str, Callable[[SamplingParams], bool]] = {
    "logit_bias": lambda p: bool(p.logit_bias),
    "penalties": lambda p: p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0,
    "dry": lambda p: p.dry_multiplier > 0.0 and p.dry_penalty_last_n != 0,
    "top_n_sigma": lambda p: p.top_n_sigma > 0.0,
    "top_k": lambda p: p.top_k > 0,
    "typical_p": lambda p: p.typical_p < 1.0,
    "top_p": lambda p: p.top_p < 1.0,
    "min_p": lambda p: p.min_p > 0.0,
    "xtc": lambda p: p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5,
    "temperature": lambda p: p.temperature != 1.0,
    "mirostat_v2": lambda p: p.mirostat_tau > 0.0,
}


def is_on(stage: str, params: SamplingParams) -> bool:
    """Whether `stage` changes anything with these settings (llama.cpp makes the others no-ops)."""
    return _ON[stage](params)


def _penalties_label(p: SamplingParams) -> str:
    parts = [f"repeat penalty {p.repeat_penalty:g}" if p.repeat_penalty != 1.0 else "",
             f"frequency penalty {p.frequency_penalty:g}" if p.frequency_penalty else "",
             f"presence penalty {p.presence_penalty:g}" if p.presence_penalty else ""]
    return ", ".join(filter(None, parts)) or "penalties off"


_LABELS: dict[str, Callable[[SamplingParams], str]] = {
    "logit_bias": lambda p: f"logit bias ({len(p.logit_bias)})",
    "penalties": _penalties_label,
    "dry": lambda p: f"DRY {p.dry_multiplier:g}",
    "top_n_sigma": lambda p: f"top-nσ {p.top_n_sigma:g}",
    "top_k": lambda p: f"top-k {p.top_k}",
    "typical_p": lambda p: f"typical-p {p.typical_p:g}",
    "top_p": lambda p: f"top-p {p.top_p:g}",
    "min_p": lambda p: f"min-p {p.min_p:g}",
    "xtc": lambda p: f"XTC {p.xtc_probability:g} above {p.xtc_threshold:g}",
    "temperature": lambda p: f"temperature {p.temperature:g}",
    "mirostat_v2": lambda p: f"mirostat v2 τ {p.mirostat_tau:g}",
    "greedy": lambda p: "temperature 0 (greedy)",
    "dist": lambda p: "the draw",
}


def label(stage: str, params: SamplingParams) -> str:
    """A stage as the user set it, e.g. `min-p 0.05`, for the X-ray and its verdict."""
    return _LABELS[stage](params)


def plan(params: SamplingParams) -> tuple[str, ...]:
    """The chain's elements in order, the selector (dist, greedy or mirostat_v2) last."""
    head = ("logit_bias",) if is_on("logit_bias", params) else ()
    if params.temperature <= 0.0:
        order = params.sampler_order
        before = order[: order.index("temperature")] if "temperature" in order else order
        if params.mirostat_tau > 0.0:
            before = ()
        return head + tuple(s for s in before if s not in _KEEP_LIKELIEST and is_on(s, params)) + ("greedy",)
    if params.mirostat_tau > 0.0:
        return head + (("temperature",) if is_on("temperature", params) else ()) + ("mirostat_v2",)
    return head + tuple(s for s in params.sampler_order if is_on(s, params)) + ("dist",)
