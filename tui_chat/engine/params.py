"""Sampling parameters: one table drives validation, the CLI, the UI controls and the backends.

A new parameter is one `ParamSpec` row plus the field in `SamplingParams`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields, replace
from typing import Any, Literal



class InvalidParameter(ValueError):
    """A sampling setting outside its documented range; the message is user-facing."""


@dataclass(frozen=True, slots=True)
class ParamSpec:
    name: str
    label: str
    kind: type
    minimum: float
    maximum: float
    step: float
    default: Any
    hint: str
    control: Literal["slider", "seed"] = "slider"
    slider_maximum: float | None = None  # a narrower range for the slider than the engine accepts

    @property
    def slider_range(self) -> tuple[float, float, float]:
        return self.minimum, self.slider_maximum or self.maximum, self.step

    def check(self, value: Any) -> Any:
        """Return `value` coerced to this parameter's type, or raise a one-line error."""
        if isinstance(value, bool):
            raise InvalidParameter(f"{self.name} must be a number (got {value!r})")
        if not isinstance(value, (int, float)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise InvalidParameter(f"{self.name} must be a number (got {value!r})") from None
        if self.kind is int:
            if float(value) != int(value):
                raise InvalidParameter(f"{self.name} must be a whole number (got {value})")
            value = int(value)
        else:
            value = float(value)
        if value != value or not self.minimum <= value <= self.maximum:
            raise InvalidParameter(
                f"{self.name} must be between {_fmt(self.minimum)} and {_fmt(self.maximum)} (got {_fmt(value)})"
            )
        return value


def _fmt(number: float) -> str:
    return f"{number:g}"


PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("temperature", "Temperature", float, 0.0, 2.0, 0.05, 0.7,
              "Flattens (>1) or sharpens (<1) the distribution; 0 always takes the likeliest token."),
    ParamSpec("top_p", "Top-p", float, 0.0, 1.0, 0.01, 0.9,
              "Keeps the smallest set of tokens whose probabilities add up to p."),
    ParamSpec("top_k", "Top-k", int, 0, 1000, 1, 40,
              "Keeps only the k likeliest tokens; 0 keeps them all.", frozenset({"llama"})),
    ParamSpec("min_p", "Min-p", float, 0.0, 1.0, 0.01, 0.05,
              "Drops tokens less likely than min-p times the likeliest one.", frozenset({"llama"})),
    ParamSpec("repeat_penalty", "Repeat penalty", float, 1.0, 2.0, 0.01, 1.1,
              "Makes tokens seen in the last 64 less likely; 1 turns it off.", frozenset({"llama"})),
    ParamSpec("seed", "Seed", int, -1, 2**32 - 2, 1, -1,
              "Fixes the random draws so a reply can be repeated; -1 picks a new seed each reply.",
              control="seed"),
    ParamSpec("max_tokens", "Max tokens", int, 1, 131072, 1, 1024,
              "Stops the reply after this many tokens.", slider_maximum=8192),
)

PRESETS: dict[str, dict[str, Any]] = {
    "Precise": {"temperature": 0.2, "top_p": 0.9, "top_k": 20, "min_p": 0.1, "repeat_penalty": 1.1},
    "Balanced": {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1},
    "Creative": {"temperature": 1.1, "top_p": 0.95, "top_k": 100, "min_p": 0.02, "repeat_penalty": 1.05},
}

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMS}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = SPECS["temperature"].default
    top_p: float = SPECS["top_p"].default
    top_k: int = SPECS["top_k"].default
    min_p: float = SPECS["min_p"].default
    repeat_penalty: float = SPECS["repeat_penalty"].default
    seed: int = SPECS["seed"].default
    max_tokens: int = SPECS["max_tokens"].default
    stop: tuple[str, ...] = ()

    def with_changes(self, **changes: Any) -> SamplingParams:
        """Validated copy; raises InvalidParameter naming the first bad setting."""
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "stop":
                checked["stop"] = _check_stops(value)
            elif name in SPECS:
                checked[name] = SPECS[name].check(value)
            else:
                raise InvalidParameter(f"unknown sampling parameter {name!r}")
        return replace(self, **checked)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


MAX_TOP_LOGPROBS = 20


def check_top_logprobs(value: Any, name: str = "top-logprobs") -> int:
    """How many alternatives the inspector records per token: 0 (off) to MAX_TOP_LOGPROBS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidParameter(f"{name} must be a whole number between 0 and {MAX_TOP_LOGPROBS} (got {value!r})")
    return value


def _check_stops(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (str, list, tuple)):
        raise InvalidParameter("stop sequences must be non-empty text")
    stops = (value,) if isinstance(value, str) else tuple(value)
    for stop in stops:
        if not isinstance(stop, str) or not stop:
            raise InvalidParameter("stop sequences must be non-empty text")
    return stops


class LiveParams:
    """The one thread-safe place where the UI changes sampling and the engine reads it each token.

    The engine compares `version` (a plain int read) per token and takes a snapshot only when it moved,
    so an unchanged setting costs nothing on the decode path.
    """

    def __init__(self, params: SamplingParams | None = None) -> None:
        self._lock = threading.Lock()
        self._params = params or SamplingParams()
        self.version = 0

    def update(self, **changes: Any) -> SamplingParams:
        with self._lock:
            self._params = self._params.with_changes(**changes)
            self.version += 1
            return self._params

    def snapshot(self) -> tuple[int, SamplingParams]:
        with self._lock:
            return self.version, self._params
