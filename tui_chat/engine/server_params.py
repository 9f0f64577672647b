"""Which sampling settings and output formats each family of OpenAI-compatible servers accepts, and
in which fields: data for the remote backend, so a server gets what it understands and the model info
can name the rest.

Keys are `ServerKind.name` in openai/servers.py. OpenAI's own fields (temperature, top_p, seed, max_tokens,
stop) every server takes and are not listed.

Sources: llama.cpp's tools/server/server-schema.cpp and server-common.cpp, llama-cpp-python's
server/types.py and llama_chat_format.py, vLLM's and OpenAI's chat completion parameters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .formats import KINDS, TEXT, OutputFormat
from .params import DEFAULT_ORDER, SamplingParams
from .stages import is_on


@dataclass(frozen=True, slots=True)
class ServerField:
    """One of our settings as a server takes it. `also`: fields sent with it (mirostat needs its mode
    switched on); `off`: sent instead while its sampler is off; `convert`: our value to the server's;
    `note`: where the server's meaning differs from ours, for the model info."""

    name: str
    also: dict[str, Any] = field(default_factory=dict)
    off: dict[str, Any] | None = None
    convert: Callable[[Any], Any] | None = None
    note: str = ""


_BIAS_NOTE = "the bias goes to every token of the text as the server tokenizes it, not only the first"


def _bias_pairs(biases: tuple[tuple[str, float], ...]) -> list[list[Any]]:
    """llama-server's form: [text, bias] pairs; JSON has no -inf, and a bias of false bans."""
    return [[text, False if bias == -math.inf else bias] for text, bias in biases]


def _llama_stage_names(order: tuple[str, ...]) -> list[str]:
    return ["typ_p" if stage == "typical_p" else stage for stage in order]


_OPENAI = {
    "frequency_penalty": ServerField("frequency_penalty"),
    "presence_penalty": ServerField("presence_penalty"),
}
_LLAMA_SERVER = _OPENAI | {
    name: ServerField(name) for name in (
        "top_k", "min_p", "repeat_penalty", "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold",
        "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat_eta")
} | {
    "mirostat_tau": ServerField("mirostat_tau", also={"mirostat": 2}, off={"mirostat": 0}),
    "logit_bias": ServerField("logit_bias", convert=_bias_pairs, note=_BIAS_NOTE),
    "sampler_order": ServerField("samplers", convert=_llama_stage_names),
    "thinking_budget": ServerField("thinking_budget_tokens", off={}),
}
_LLAMA_CPP_PYTHON = _OPENAI | {
    name: ServerField(name) for name in ("top_k", "min_p", "repeat_penalty", "mirostat_eta")
} | {
    "mirostat_tau": ServerField("mirostat_tau", also={"mirostat_mode": 2}, off={"mirostat_mode": 0}),
    # a Python server: its JSON reader takes -Infinity
    "logit_bias": ServerField("logit_bias", also={"logit_bias_type": "tokens"}, convert=dict, note=_BIAS_NOTE),
}
_VLLM = _OPENAI | {
    # vLLM ends the thinking after this many tokens when it was started with a reasoning parser
    "thinking_budget": ServerField("thinking_token_budget", off={}),
    "top_k": ServerField("top_k", convert=lambda k: k or -1),  # older versions reject 0 for "off"
    "min_p": ServerField("min_p"),
    "repeat_penalty": ServerField("repetition_penalty"),
}

SERVE_BUILD = "tui-chat serve"  # its family's name, and what its /props says it is (`build_info`)
# tui-chat's own server reads llama-server's fields, with the engine's meaning of each (a bias on a text's first token)
_TUI_CHAT = _LLAMA_SERVER | {"logit_bias": ServerField("logit_bias", convert=_bias_pairs)}

SERVER_FIELDS: dict[str, dict[str, ServerField]] = {
    "llama.cpp server": _LLAMA_SERVER,
    "tui-chat serve": _TUI_CHAT,
    "llama-cpp-python server": _LLAMA_CPP_PYTHON,
    "vLLM": _VLLM,
    "OpenAI-compatible server": _OPENAI,
}

# The sampler each setting beyond OpenAI's own belongs to ("order" for the order itself).
SAMPLER_OF = {
    "top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p", "top_n_sigma": "top_n_sigma",
    "xtc_probability": "xtc", "xtc_threshold": "xtc", "repeat_penalty": "penalties",
    "frequency_penalty": "penalties", "presence_penalty": "penalties", "dry_multiplier": "dry",
    "dry_base": "dry", "dry_allowed_length": "dry", "dry_penalty_last_n": "dry",
    "mirostat_tau": "mirostat_v2", "mirostat_eta": "mirostat_v2", "logit_bias": "logit_bias",
    "sampler_order": "order", "thinking_budget": "thinking",
}

# The chat's thinking switch, for families that pass template variables on (`chat_template_kwargs`);
# sent only to switch thinking off, so a server's own default stands otherwise.
_THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
THINKING_SWITCH = ("llama.cpp server", "tui-chat serve", "vLLM")


def ignored_settings(server: str) -> tuple[str, ...]:
    """The settings this server family cannot take (for `ModelInfo.ignored_params`)."""
    accepted = SERVER_FIELDS.get(server, _OPENAI)
    return tuple(name for name in SAMPLER_OF if name not in accepted)


def server_fields(server: str, params: SamplingParams) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The request fields for every setting this server takes, and the names of the settings in use
    (their sampler on) that it cannot take: say so rather than pretend.

    Settings are sent even when off, since a server's own defaults may differ from ours (llama-server
    applies top-k 40 unless told 0).
    """
    accepted = SERVER_FIELDS.get(server, _OPENAI)
    body: dict[str, Any] = {}
    for name, sampler in SAMPLER_OF.items():
        spec = accepted.get(name)
        if spec is None:
            continue
        if spec.off is not None and not _in_use(sampler, params):
            body.update(spec.off)
        else:
            value = getattr(params, name)
            body[spec.name] = spec.convert(value) if spec.convert else value
            body.update(spec.also)
    return body, unsent_settings(ignored_settings(server), params)


def unsent_settings(ignored: tuple[str, ...], params: SamplingParams) -> tuple[str, ...]:
    """Of the settings a server is not sent (`ModelInfo.ignored_params`), those `params` turn on: what a
    user asked for and will not get."""
    return tuple(name for name in ignored if _in_use(SAMPLER_OF[name], params))


def _in_use(sampler: str, params: SamplingParams) -> bool:
    if sampler == "thinking":
        return params.thinking_budget >= 0
    return params.sampler_order != DEFAULT_ORDER if sampler == "order" else is_on(sampler, params)


def thinking_fields(server: str, on: bool) -> dict[str, Any]:
    """The request fields that switch a reasoning model's thinking off, where this family takes them."""
    return _THINKING_OFF if not on and server in THINKING_SWITCH else {}


def _openai_schema(output: OutputFormat) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "reply", "schema": json.loads(output.source)}}}


# Per family: output kind -> the request fields asking for it; a kind left out cannot be asked for. JSON mode is
# an object at the top everywhere, as OpenAI's json_object (and the local engine's): llama-server reads a bare
# json_object as the empty schema (any JSON value), so it is sent the object's schema; OpenAI's, vLLM's and
# llama-cpp-python's json_object is an object already. OpenAI and vLLM take no GBNF.
_FORMAT_FIELDS: dict[str, dict[str, Callable[[OutputFormat], dict[str, Any]]]] = {
    "llama.cpp server": {
        "json": lambda o: {"response_format": {"type": "json_object", "schema": {"type": "object"}}},
        "json_schema": lambda o: {"response_format": {"type": "json_schema",
                                                      "json_schema": {"schema": json.loads(o.source)}}},
        "grammar": lambda o: {"grammar": o.source},
    },
    "tui-chat serve": {
        "json": lambda o: {"response_format": {"type": "json_object", "schema": {"type": "object"}}},
        "json_schema": lambda o: {"response_format": {"type": "json_schema",
                                                      "json_schema": {"schema": json.loads(o.source)}}},
        "grammar": lambda o: {"grammar": o.source},
    },
    "llama-cpp-python server": {
        "json": lambda o: {"response_format": {"type": "json_object"}},
        "json_schema": lambda o: {"response_format": {"type": "json_object", "schema": json.loads(o.source)}},
        "grammar": lambda o: {"grammar": o.source},
    },
    "vLLM": {"json": lambda o: {"response_format": {"type": "json_object"}}, "json_schema": _openai_schema},
    "OpenAI-compatible server": {"json": lambda o: {"response_format": {"type": "json_object"}},
                                 "json_schema": _openai_schema},
}


def ignored_formats(server: str) -> tuple[str, ...]:
    """The output formats this server family cannot be asked for (for `ModelInfo.ignored_formats`)."""
    known = _FORMAT_FIELDS.get(server, _FORMAT_FIELDS["OpenAI-compatible server"])
    return tuple(kind for kind in KINDS if kind != TEXT.kind and kind not in known)


def format_fields(server: str, output: OutputFormat) -> dict[str, Any] | None:
    """The request fields that ask this server family for `output`; None where it cannot be asked:
    refuse the format for that server (and say so in the model info) rather than send free text."""
    if not output.constrained:
        return {}
    make = _FORMAT_FIELDS.get(server, _FORMAT_FIELDS["OpenAI-compatible server"]).get(output.kind)
    return make(output) if make else None


def server_notes(server: str) -> tuple[str, ...]:
    """Where this family's meaning of a setting or a format differs from ours, a line each (for the model info)."""
    fields = SERVER_FIELDS.get(server, _OPENAI)
    return tuple(f"{name.replace('_', ' ')}: {spec.note}" for name, spec in fields.items() if spec.note)
