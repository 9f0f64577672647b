"""OpenAI's `/v1/embeddings`, read and written: texts in, the engine's pooled vectors out (`Embedding.embed`, made in
a llama.cpp context of their own: engine/local/embed.py). Pure functions over untrusted input: a bad field is a
`BadRequest` naming it, in OpenAI's error shape.

As OpenAI's: `input` a string or a list of strings (token ids are refused: the server reads text), `encoding_format`
`float` (the default) or `base64` (the float32s, little-endian, as the `openai` client decodes them),
`dimensions` only the model's own size (its vectors are not shortened), `usage` the tokens read.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from ..engine.base import Embedded
from .protocol import BadRequest

MAX_INPUTS = 2048  # texts a request, as OpenAI's limit
ENCODINGS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbeddingsAsked:
    texts: list[str]
    base64: bool = False
    dimensions: int | None = None


def parse_embeddings(body: dict[str, Any]) -> EmbeddingsAsked:
    """A `/v1/embeddings` body."""
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if isinstance(texts, list) and texts and all(_token_ids(item) for item in texts):
        raise BadRequest("input as token ids is not supported here: send the text", "input")
    if not (isinstance(texts, list) and texts and all(isinstance(text, str) for text in texts)):
        raise BadRequest("input must be a string or a non-empty list of strings", "input")
    if len(texts) > MAX_INPUTS:
        raise BadRequest(f"input must be at most {MAX_INPUTS:,} texts (got {len(texts):,})", "input")
    if (empty := next((index for index, text in enumerate(texts) if not text), None)) is not None:
        raise BadRequest(f"input[{empty}] is an empty string: give every text something to embed", "input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise BadRequest("encoding_format must be float or base64", "encoding_format", "invalid_value")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise BadRequest("dimensions must be a whole number, 1 or more", "dimensions", "invalid_value")
    return EmbeddingsAsked(texts, encoding == "base64", dimensions)


def _token_ids(item: Any) -> bool:
    """Whether `item` is a token id, or a list of them (OpenAI's other forms of `input`)."""
    if isinstance(item, list):
        return bool(item) and all(_token_ids(part) and not isinstance(part, list) for part in item)
    return isinstance(item, int) and not isinstance(item, bool)


def check_dimensions(asked: EmbeddingsAsked, size: int) -> None:
    if asked.dimensions is not None and asked.dimensions != size:
        raise BadRequest(f"dimensions must be {size}, this model's size (got {asked.dimensions}): its vectors are not "
                         "shortened", "dimensions", "invalid_value")


def joined(parts: list[Embedded]) -> Embedded:
    """The engine's answers to one request's texts, asked for a few at a time, as one."""
    first = parts[0]
    return Embedded(first.model, first.size, b"".join(part.data for part in parts),
                    tuple(count for part in parts for count in part.tokens))


def answer(embedded: Embedded, asked: EmbeddingsAsked, _took_s: float = 0.0) -> dict[str, Any]:
    data = [{"object": "embedding", "index": index,
             "embedding": base64.b64encode(embedded.row(index)).decode() if asked.base64 else embedded.vector(index)}
            for index in range(len(embedded.tokens))]
    read = sum(embedded.tokens)
    return {"object": "list", "data": data, "model": embedded.model,
            "usage": {"prompt_tokens": read, "total_tokens": read}}
