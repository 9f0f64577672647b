"""Output formats: free text, any JSON value, JSON that matches a schema, or a GBNF grammar; each
reply has its own (`Request.format`).

A format becomes a GBNF grammar (local/gbnf.py) for llama.cpp's grammar sampler (local/grammar.py);
JSON schemas are converted by llama-cpp-python's own converter. That converter skips the schema
keywords it does not implement, which would let through replies the schema forbids, so a schema that
uses one is refused here, by name, when the format is chosen. The conversion itself happens when a
reply starts (it needs llama_cpp, which a session with a remote server does not load for a format).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .params import InvalidParameter

FormatKind = Literal["text", "json", "json_schema", "grammar"]
KINDS: dict[str, str] = {"text": "free text", "json": "JSON", "json_schema": "JSON schema", "grammar": "grammar"}

# Keywords that constrain values but that the converter ignores (llama_cpp/llama_grammar.py).
_UNSUPPORTED = (
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then", "else",
    "uniqueItems", "contains", "minContains", "maxContains", "patternProperties", "propertyNames",
    "dependentRequired", "dependentSchemas", "dependencies", "minProperties", "maxProperties",
    "unevaluatedProperties", "unevaluatedItems", "additionalItems",
)
_FORMATS = re.compile(r"^(uuid[1-5]?|date|time|date-time)$")
_TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}
# Keywords whose value is a schema, or a list or table of schemas: the walk goes into these only.
_SUBSCHEMA = {"items", "additionalProperties"}
_SUBSCHEMAS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_SCHEMA_TABLES = {"properties", "$defs", "definitions"}


class FormatError(InvalidParameter):
    """A schema or grammar that cannot be used; the message is one line. The engine reports one met
    when a reply starts as that reply's `Error`."""


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """How a reply must be written. `source`: the schema (JSON text) or the grammar (GBNF text)."""

    kind: FormatKind = "text"
    source: str = ""

    @property
    def label(self) -> str:
        return KINDS[self.kind]

    @property
    def constrained(self) -> bool:
        return self.kind != "text"

    def as_dict(self) -> dict[str, str]:
        """For a conversation's saved settings; `from_dict` reads it back."""
        return {"kind": self.kind, "source": self.source}


TEXT = OutputFormat()


def choose(kind: str, source: str = "") -> OutputFormat:
    """The format for a selector or a flag: `kind` text, json, json_schema (`source` a schema, or a path
    to one) or grammar (`source` GBNF text, or a path to a file of it). Raises FormatError."""
    if kind == "text":
        return TEXT
    if kind == "json":
        return OutputFormat("json")
    if kind == "json_schema":
        return json_schema(source)
    if kind == "grammar":
        return grammar(source)
    raise FormatError(f"unknown output format {kind!r}: choose {', '.join(KINDS)}")


def from_dict(saved: Any) -> OutputFormat:
    """A format saved with `as_dict`; validated again, since the file may have been edited."""
    if not isinstance(saved, dict) or not isinstance(saved.get("kind"), str):
        raise FormatError("a saved output format must be a table with a kind")
    return choose(saved["kind"], str(saved.get("source", "")))


def json_schema(schema_or_path: str) -> OutputFormat:
    """A JSON schema given inline (it starts with `{`) or as a file path."""
    text = schema_or_path if schema_or_path.lstrip().startswith(("{", "[")) else _read(schema_or_path, "JSON schema")
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise FormatError(f"the JSON schema is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise FormatError("a JSON schema must be a JSON object")
    _check_schema(schema, "the schema")
    return OutputFormat("json_schema", json.dumps(schema))


def grammar(gbnf_or_path: str) -> OutputFormat:
    """A GBNF grammar given as text (it holds `::=`) or as a file path. Whether it parses is for
    llama.cpp to say, when a reply starts (local/grammar.py)."""
    text = gbnf_or_path if "::=" in gbnf_or_path else _read(gbnf_or_path, "grammar")
    if "::=" not in text:
        raise FormatError("a GBNF grammar needs rules such as: root ::= \"yes\" | \"no\"")
    return OutputFormat("grammar", text)


def _read(path_text: str, what: str) -> str:
    if not path_text.strip():
        raise FormatError(f"give the {what} as text or as a file path")
    path = Path(path_text).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise FormatError(f"cannot read the {what} file {path}: {getattr(error, 'strerror', None) or error}") from None


def _check_schema(schema: Any, where: str) -> None:
    """Refuse what the converter would silently skip, naming the keyword and where it is."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise FormatError(f"{where} must be a JSON object")
    for keyword in _UNSUPPORTED:
        if keyword in schema:
            raise FormatError(f"JSON schema keyword {keyword!r} ({where}) is not supported by the grammar converter")
    if "format" in schema and not _FORMATS.match(str(schema["format"])):
        raise FormatError(f"JSON schema format {schema['format']!r} ({where}) is not supported: "
                          "only date, time, date-time and uuid are")
    types = schema.get("type")
    for name in types if isinstance(types, list) else [types] if types is not None else []:
        if name not in _TYPES:
            raise FormatError(f"JSON schema type {name!r} ({where}) is not a JSON type")
    for keyword, value in schema.items():
        if keyword in _SUBSCHEMA:
            _check_schema(value, f"{where} → {keyword}")
        elif keyword in _SUBSCHEMAS and isinstance(value, list):
            for index, item in enumerate(value):
                _check_schema(item, f"{where} → {keyword}[{index}]")
        elif keyword in _SCHEMA_TABLES and isinstance(value, dict):
            for name, item in value.items():
                _check_schema(item, f"{where} → {name}")
