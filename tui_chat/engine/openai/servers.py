"""What each family of OpenAI-compatible servers accepts beyond OpenAI's own fields, as data.

The backend reads these rows instead of asking "is this vLLM?" in every method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXTRA_PARAMS = ("top_k", "min_p", "repeat_penalty")  # sampling settings outside OpenAI's API


@dataclass(frozen=True, slots=True)
class ServerKind:
    name: str
    extra_params: dict[str, str]  # our sampling name -> the server's field; missing ones are not sent
    tokenize_path: str | None = None  # relative to the server root; None: counts are estimated from characters
    tokenize_body: Callable[[str, str | None], dict[str, Any]] | None = None  # (text, model) -> request body
    counts_bos: bool = False  # its tokenize count includes a BOS token (subtracted once, measured at load)
    top_k_off: int = 0  # how it spells "no top-k limit"

    def ignored(self) -> tuple[str, ...]:
        return tuple(name for name in EXTRA_PARAMS if name not in self.extra_params)


LLAMA_SERVER = ServerKind(
    "llama.cpp server", {p: p for p in EXTRA_PARAMS}, "tokenize",
    lambda text, _model: {"content": text, "add_special": False},
)
LLAMA_CPP_PYTHON = ServerKind(
    "llama-cpp-python server", {p: p for p in EXTRA_PARAMS}, "extras/tokenize/count",
    lambda text, model: {"input": text, "model": model}, counts_bos=True,
)
VLLM = ServerKind(
    "vLLM", {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repetition_penalty"}, "tokenize",
    lambda text, model: {"model": model, "prompt": text, "add_special_tokens": False},
    top_k_off=-1,  # older versions reject 0
)
GENERIC = ServerKind("OpenAI-compatible server", {})
