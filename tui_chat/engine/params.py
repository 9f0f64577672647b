"""Sampling parameters: one table drives validation, the CLI, the UI controls and the backends.

A new numeric parameter is one `ParamSpec` row plus the field in `SamplingParams`; a list-valued
one (stop sequences, logit bias, the sampler order) is a `ListSpec` row with its own control kind.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
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
    below_zero: str = ""  # what a negative value means, shown instead of the number ("random", "no limit")

    @property
    def slider_range(self) -> tuple[float, float, float]:
        return self.minimum, self.slider_maximum or self.maximum, self.step

    def check(self, value: Any) -> Any:
        """Return `value` coerced to this parameter's type, or raise a one-line error."""
        if isinstance(value, bool):
            raise InvalidParameter(f"{self.name} must be a number (got {value!r})")
        try:
            number = float(value)
        except OverflowError:
            number = math.copysign(math.inf, value)
        except (TypeError, ValueError):
            raise InvalidParameter(f"{self.name} must be a number (got {value!r})") from None
        if not self.minimum <= number <= self.maximum:  # NaN fails this too
            raise InvalidParameter(
                f"{self.name} must be between {_fmt(self.minimum)} and {_fmt(self.maximum)} (got {_fmt(number)})"
            )
        if self.kind is int:
            if not number.is_integer():
                raise InvalidParameter(f"{self.name} must be a whole number (got {_fmt(number)})")
            return int(number)
        return number


def _fmt(number: float) -> str:
    return f"{number:g}"


PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("temperature", "Temperature", float, 0.0, 2.0, 0.05, 0.7,
              "Flattens (>1) or sharpens (<1) the distribution; 0 always takes the likeliest token."),
    ParamSpec("top_p", "Top-p", float, 0.0, 1.0, 0.01, 0.9,
              "Keeps the smallest set of tokens whose probabilities add up to p."),
    ParamSpec("top_k", "Top-k", int, 0, 1000, 1, 40,
              "Keeps only the k likeliest tokens; 0 keeps them all."),
    ParamSpec("min_p", "Min-p", float, 0.0, 1.0, 0.01, 0.05,
              "Drops tokens less likely than min-p times the likeliest one."),
    ParamSpec("typical_p", "Typical-p", float, 0.0, 1.0, 0.01, 1.0,
              "Keeps the tokens whose surprise is closest to the average, adding up to p; 1 turns it off."),
    ParamSpec("top_n_sigma", "Top-nσ", float, 0.0, 10.0, 0.1, 0.0,
              "Keeps tokens whose logit is within n standard deviations of the best one; 0 turns it off."),
    ParamSpec("xtc_probability", "XTC probability", float, 0.0, 1.0, 0.01, 0.0,
              "How often XTC removes every token above the threshold but the least likely of them; 0 turns it off."),
    ParamSpec("xtc_threshold", "XTC threshold", float, 0.0, 1.0, 0.01, 0.1,
              "How likely a token must be for XTC to count it as a top choice; above 0.5 XTC does nothing."),
    ParamSpec("repeat_penalty", "Repeat penalty", float, 1.0, 2.0, 0.01, 1.1,
              "Makes tokens seen in the last 64 less likely; 1 turns it off."),
    ParamSpec("frequency_penalty", "Frequency pen.", float, -2.0, 2.0, 0.01, 0.0,
              "Lowers a token's logit by this much for each time it appeared in the last 64; 0 turns it off."),
    ParamSpec("presence_penalty", "Presence pen.", float, -2.0, 2.0, 0.01, 0.0,
              "Lowers a token's logit by this much once if it appeared in the last 64; 0 turns it off."),
    ParamSpec("dry_multiplier", "DRY multiplier", float, 0.0, 5.0, 0.01, 0.0,
              "DRY penalises tokens that would extend a repeated sequence, by this much; 0 turns it off.",
              slider_maximum=2.0),
    ParamSpec("dry_base", "DRY base", float, 1.0, 4.0, 0.01, 1.75,
              "How fast the DRY penalty grows with each token the repeat gets longer."),
    ParamSpec("dry_allowed_length", "DRY allowed len", int, 0, 100, 1, 2,
              "Repeats up to this many tokens long go unpunished by DRY.", slider_maximum=20),
    ParamSpec("dry_penalty_last_n", "DRY last n", int, -1, 131072, 1, 64,
              "How many recent tokens DRY searches for repeats; -1 the whole context, 0 turns DRY off.",
              slider_maximum=4096),
    ParamSpec("mirostat_tau", "Mirostat τ", float, 0.0, 10.0, 0.1, 0.0,
              "Mirostat v2's target surprise (5 is usual); above 0 it replaces the other samplers; 0 turns it off."),
    ParamSpec("mirostat_eta", "Mirostat η", float, 0.0, 1.0, 0.01, 0.1,
              "How fast mirostat v2 corrects towards its target surprise."),
    ParamSpec("seed", "Seed", int, -1, 2**32 - 2, 1, -1,
              "Fixes the random draws so a reply can be repeated; -1 picks a new seed each reply.",
              control="seed", below_zero="random"),
    ParamSpec("max_tokens", "Max tokens", int, 1, 131072, 1, 1024,
              "Stops the reply after this many tokens.", slider_maximum=8192),
    ParamSpec("thinking_budget", "Think budget", int, -1, 131072, 1, -1,
              "A thinking model may think this many tokens; then its thinking is ended for it and it answers. "
              "-1: no limit.", slider_maximum=8192, below_zero="no limit"),
    ParamSpec("draft_max", "Draft max", int, 0, 64, 1, 16,
              "With speculative decoding on (draft = ngram): the most tokens guessed ahead and checked in one batch; "
              "the text is the same, only faster. 0 turns drafting off.", slider_maximum=32),
)

PRESETS: dict[str, dict[str, Any]] = {
    "Precise": {"temperature": 0.2, "top_p": 0.9, "top_k": 20, "min_p": 0.1, "repeat_penalty": 1.1},
    "Balanced": {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1},
    "Creative": {"temperature": 1.1, "top_p": 0.95, "top_k": 100, "min_p": 0.02, "repeat_penalty": 1.05},
}

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMS}

# The stages of llama.cpp's sampler chain that an order can arrange, in llama.cpp's default order
# (common/common.h). The logit bias always comes first and the draw last, so they are not listed.
SAMPLER_STAGES: tuple[str, ...] = (
    "penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature",
)
DEFAULT_ORDER = SAMPLER_STAGES
_STAGE_ALIASES = {"typ_p": "typical_p", "typ": "typical_p", "temp": "temperature", "nucleus": "top_p"}


def check_sampler_order(value: Any) -> tuple[str, ...]:
    """Stage names in the order the chain applies them; `a,b,c` text or a list. llama.cpp's own names
    (typ_p, temp) are understood. As in llama.cpp, a stage left out is not applied."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise InvalidParameter("sampler_order must be a list of sampler names")
    order = tuple(_STAGE_ALIASES.get(str(name).strip(), str(name).strip()) for name in names)
    unknown = [name for name in order if name not in SAMPLER_STAGES]
    if unknown or not order:
        raise InvalidParameter(f"sampler_order takes names from {', '.join(SAMPLER_STAGES)} "
                               f"(got {', '.join(map(repr, unknown)) or 'none'})")
    if len(set(order)) < len(order):
        raise InvalidParameter("sampler_order names a sampler twice")
    return order


MAX_LOGIT_BIAS = 100.0


def parse_logit_bias(text: str) -> tuple[str, float]:
    """`TEXT=BIAS` (the last `=` splits, so TEXT may hold one); BIAS a number or -inf."""
    word, equals, bias = text.rpartition("=")
    if not equals:
        raise InvalidParameter(f"logit bias must be TEXT=BIAS, e.g. Paris=-inf (got {text!r})")
    return _check_bias_entry(word, bias)


def check_logit_bias(value: Any) -> tuple[tuple[str, float], ...]:
    """(text, bias) pairs, from pairs, a {text: bias} table or `TEXT=BIAS` strings; a text given twice
    keeps its last bias."""
    if isinstance(value, dict):
        entries = list(value.items())
    elif isinstance(value, (list, tuple)):
        entries = [parse_logit_bias(item) if isinstance(item, str) else item for item in value]
    else:
        raise InvalidParameter("logit_bias must be a list of TEXT=BIAS entries")
    checked: dict[str, float] = {}
    for entry in entries:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise InvalidParameter(f"a logit bias entry must be a text and a bias (got {entry!r})")
        word, bias = _check_bias_entry(*entry)
        checked.pop(word, None)
        checked[word] = bias
    return tuple(checked.items())


def _check_bias_entry(word: Any, bias: Any) -> tuple[str, float]:
    if not isinstance(word, str) or not word:
        raise InvalidParameter("a logit bias needs a non-empty text")
    try:
        number = float(bias) if not isinstance(bias, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if number != -math.inf and not -MAX_LOGIT_BIAS <= number <= MAX_LOGIT_BIAS:
        raise InvalidParameter(f"the logit bias of {word!r} must be between -{MAX_LOGIT_BIAS:g} and "
                               f"{MAX_LOGIT_BIAS:g}, or -inf to ban it (got {bias!r})")
    return word, number


def _check_stops(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (str, list, tuple)):
        raise InvalidParameter("stop sequences must be non-empty text")
    stops = (value,) if isinstance(value, str) else tuple(value)
    for stop in stops:
        if not isinstance(stop, str) or not stop:
            raise InvalidParameter("stop sequences must be non-empty text")
    return stops


@dataclass(frozen=True, slots=True)
class ListSpec:
    """A setting that is a list rather than a number, so it needs a control of its own:

    - "stops": an editable list of texts (today's `a | b` field);
    - "bias": an editable list of TEXT → BIAS rows (a number, or -inf to ban);
    - "order": the stage names as a row the user can reorder (and leave stages out of).

    `parse` reads one command-line value; a `repeatable` flag is given once per item.
    """

    name: str
    label: str
    default: tuple[Any, ...]
    hint: str
    control: Literal["stops", "bias", "order"]
    check: Callable[[Any], tuple[Any, ...]]
    parse: Callable[[str], Any]
    repeatable: bool


LIST_PARAMS: tuple[ListSpec, ...] = (
    ListSpec("stop", "Stop sequences", (), "The reply ends where one of these appears; it is not shown.",
             "stops", _check_stops, str, repeatable=True),
    ListSpec("logit_bias", "Logit bias", (),
             "Added to the logit of the first token of TEXT as written mid-sentence (a leading space counts); "
             "-inf bans it.", "bias", check_logit_bias, parse_logit_bias, repeatable=True),
    ListSpec("sampler_order", "Sampler order", DEFAULT_ORDER,
             "The order the chain applies the samplers in (llama.cpp's by default); one left out is not applied.",
             "order", check_sampler_order, check_sampler_order, repeatable=False),
)
LIST_SPECS: dict[str, ListSpec] = {spec.name: spec for spec in LIST_PARAMS}


def label(name: str) -> str:
    """A setting's name as the sampling panel shows it (`xtc_probability` → `XTC probability`)."""
    return (SPECS.get(name) or LIST_SPECS[name]).label


def parse_settings(text: str) -> dict[str, Any]:
    """`temperature=1.0,top_p=0.9,seed=7` as changes for `SamplingParams.with_changes`. A part without `=` goes on
    the value before it (`sampler_order=top_k,temperature`); a repeatable list (`stop`, `logit_bias`) may be given
    more than once; `logit_bias=Paris=-inf` splits at its first `=`."""
    changes: dict[str, Any] = {}
    name = ""
    for part in text.split(","):
        key, equals, value = part.partition("=")
        if equals and key.strip():
            name = key.strip().replace("-", "_")
            if name not in SPECS and name not in LIST_SPECS:
                raise InvalidParameter(f"unknown sampling parameter {name!r} in {text!r}")
            listed = LIST_SPECS.get(name)
            if listed is not None and listed.repeatable:
                changes.setdefault(name, []).append(listed.parse(value))
            else:
                changes[name] = value.strip()
        elif name and not (name in LIST_SPECS and LIST_SPECS[name].repeatable):
            changes[name] += "," + part
        else:
            raise InvalidParameter(f"settings are NAME=VALUE separated by commas, e.g. temperature=1.0,seed=7 "
                                   f"(got {text!r})")
    return changes


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = SPECS["temperature"].default
    top_p: float = SPECS["top_p"].default
    top_k: int = SPECS["top_k"].default
    min_p: float = SPECS["min_p"].default
    typical_p: float = SPECS["typical_p"].default
    top_n_sigma: float = SPECS["top_n_sigma"].default
    xtc_probability: float = SPECS["xtc_probability"].default
    xtc_threshold: float = SPECS["xtc_threshold"].default
    repeat_penalty: float = SPECS["repeat_penalty"].default
    frequency_penalty: float = SPECS["frequency_penalty"].default
    presence_penalty: float = SPECS["presence_penalty"].default
    dry_multiplier: float = SPECS["dry_multiplier"].default
    dry_base: float = SPECS["dry_base"].default
    dry_allowed_length: int = SPECS["dry_allowed_length"].default
    dry_penalty_last_n: int = SPECS["dry_penalty_last_n"].default
    mirostat_tau: float = SPECS["mirostat_tau"].default
    mirostat_eta: float = SPECS["mirostat_eta"].default
    seed: int = SPECS["seed"].default
    max_tokens: int = SPECS["max_tokens"].default
    thinking_budget: int = SPECS["thinking_budget"].default
    draft_max: int = SPECS["draft_max"].default
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[str, float], ...] = ()
    sampler_order: tuple[str, ...] = DEFAULT_ORDER

    def with_changes(self, **changes: Any) -> SamplingParams:
        """Validated copy; raises InvalidParameter naming the first bad setting."""
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            if name in SPECS:
                checked[name] = SPECS[name].check(value)
            elif name in LIST_SPECS:
                checked[name] = LIST_SPECS[name].check(value)
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


class LiveParams:
    """The one thread-safe place where the UI changes sampling and the engine reads it each token.

    The engine compares `version` (a plain int read) per token and takes a snapshot only when it moved,
    so an unchanged setting costs nothing on the decode path. The last few versions stay readable
    (`at`), so a token can be explained with the settings it was drawn with after a slider moved on.

    Sent to the engine process (pickled), it arrives as a mirror with the same `key`: the UI's changes reach it
    through `watch` on this side and `follow` on that one, version numbers and all.
    """

    KEPT_VERSIONS = 256
    _keys = itertools.count(1)

    def __init__(self, params: SamplingParams | None = None) -> None:
        self._lock = threading.Lock()
        self._params = params or SamplingParams()
        self.version = 0
        self._history: dict[int, SamplingParams] = {0: self._params}
        self.key = next(LiveParams._keys)
        self._watchers: list[Callable[[LiveParams], None]] = []

    def update(self, **changes: Any) -> SamplingParams:
        with self._lock:
            self._params = self._params.with_changes(**changes)
            self.version += 1
            self._history[self.version] = self._params
            self._history.pop(self.version - self.KEPT_VERSIONS, None)
            params, watchers = self._params, tuple(self._watchers)
        for watcher in watchers:
            watcher(self)
        return params

    def snapshot(self) -> tuple[int, SamplingParams]:
        with self._lock:
            return self.version, self._params

    def at(self, version: int) -> SamplingParams:
        """The settings as they were at `version` (a Token's `params_version`); KeyError once forgotten."""
        with self._lock:
            return self._history[version]

    def watch(self, watcher: Callable[[LiveParams], None]) -> None:
        """`watcher` is called after every change, on the changing thread (the engine process's link)."""
        with self._lock:
            self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[LiveParams], None]) -> None:
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def follow(self, version: int, params: SamplingParams) -> None:
        """A mirror takes the original's change (an older one arriving late is ignored)."""
        with self._lock:
            if version > self.version:
                self._params, self.version = params, version
                self._history[version] = params

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"key": self.key, "version": self.version, "params": self._params}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self.key, self.version, self._params = state["key"], state["version"], state["params"]
        self._history = {self.version: self._params}
        self._watchers = []
