"""What each family of OpenAI-compatible servers does beyond OpenAI's own API, as data: how it counts
tokens, what it reports while a reply streams, and whether it can continue a reply from a given start.
Which sampling settings and output formats it takes is in ../server_params.py, keyed by `ServerKind.name`.

The backend reads these rows instead of asking "is this vLLM?" in every method.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..prompts import choose_format
from ..server_params import SERVE_BUILD, ignored_formats, ignored_settings
from ..templates import PLAIN


@dataclass(frozen=True, slots=True)
class ServerKind:
    name: str
    tokenize_path: str | None = None  # relative to the server root; None: counts are estimated from characters
    tokenize_body: Callable[[str, str | None], dict[str, Any]] | None = None  # (text, model) -> request body
    counts_bos: bool = False  # its tokenize count includes a BOS token (subtracted once, measured at load)
    # Sent with every reply: what makes the server report the prompt while it streams, not only at the end.
    reporting: dict[str, Any] = field(default_factory=dict)
    # Sent to continue the final assistant message instead of answering after it (a branch); None: it cannot.
    continues: dict[str, Any] | None = None
    one_request_at_a_time: bool = False  # a second request, even a token count, ends a reply streaming
    # What to check when its first reply comes back empty: most often the chat format it renders the model with.
    empty_reply: str = ("check the chat template the server renders this model's chats with (a base model needs "
                        "a plain transcript: README, \"A base model behind a server\")")

    def ignored(self) -> tuple[str, ...]:
        return ignored_settings(self.name)

    def ignored_formats(self) -> tuple[str, ...]:
        return ignored_formats(self.name)


# timings_per_token: the prompt's figures with every chunk; return_progress: its size, reuse and reading
# progress before the first token. An assistant message last is continued (its `--no-prefill-assistant` off).
LLAMA_SERVER = ServerKind(
    "llama.cpp server", "tokenize", lambda text, _model: {"content": text, "add_special": False},
    reporting={"timings_per_token": True, "return_progress": True}, continues={},
)
# `tui-chat serve`: llama-server's dialect (its /props, /tokenize, timings and progress), the engine's meanings.
TUI_CHAT_SERVE = replace(LLAMA_SERVER, name=SERVE_BUILD)
# Its chat formats always open a new assistant turn after the messages: no branch can continue a reply.
# Any request arriving mid-stream makes it end the stream at once (its `interrupt_requests`, on by default).
LLAMA_CPP_PYTHON = ServerKind(
    "llama-cpp-python server", "extras/tokenize/count", lambda text, model: {"input": text, "model": model},
    counts_bos=True, one_request_at_a_time=True,
    empty_reply=("llama-cpp-python's server renders a model whose file has no chat template in llama-2's format, "
                 "which a base model answers with nothing: start it with a format the model follows, for a base "
                 "model `--chat_format snoozy` (README, \"A base model behind a server\")"),
)
VLLM = ServerKind(
    "vLLM", "tokenize", lambda text, model: {"model": model, "prompt": text, "add_special_tokens": False},
    reporting={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    continues={"continue_final_message": True, "add_generation_prompt": False},
)
GENERIC = ServerKind("OpenAI-compatible server")

PLAIN_FORMAT = choose_format(PLAIN, None)


@dataclass(frozen=True, slots=True)
class Served:
    """What loading learnt about a server and its model."""

    kind: ServerKind
    n_ctx: int = 0
    quantization: str = "unknown"
    plain: bool = False  # its chat template is tui-chat's plain transcript (a base model): turns end at `\nUser:`


def is_plain(template: Any) -> bool:
    """Whether a server's chat template (llama-server's `/props`) is tui-chat's plain transcript, as README says
    to give it with `--chat-template-file`."""
    return isinstance(template, str) and template.strip() == PLAIN_FORMAT.source.strip()


def shown_name(model_id: str) -> str:
    """A model id that is a file path (llama-server names its model by the path it loaded) as the file's
    name, as a local model is shown; any other id as it is."""
    if not model_id.lower().endswith(".gguf") or not any(sep in model_id for sep in "/\\"):
        return model_id
    return model_id.replace("\\", "/").rsplit("/", 1)[-1][: -len(".gguf")]


_FTYPE_SIZES = {"Small": "S", "Medium": "M", "Large": "L", "Extra Small": "XS"}


def quantization(ftype: Any) -> str:
    """llama.cpp's name of a file type (`Q4_K - Medium`, `IQ2_XXS - 2.0625 bpw`, `all F32`) as a GGUF file
    name spells it (`Q4_K_M`, `IQ2_XXS`, `F32`); "unknown" for anything else."""
    if not isinstance(ftype, str) or not re.fullmatch(r"[\w .()-]{1,60}", ftype):
        return "unknown"
    base, _, size = ftype.removeprefix("all ").partition(" - ")
    return f"{base}_{_FTYPE_SIZES[size]}" if size in _FTYPE_SIZES else base
