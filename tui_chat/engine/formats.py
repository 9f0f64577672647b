"""Output formats: free text, a JSON object (JSON mode), JSON that matches a schema, or a GBNF grammar; each
reply has its own (`Request.format`).

What holds for any engine is checked here, when the format is chosen: a schema is JSON, valid against its
meta-schema, its local `$ref`s resolve. The local engine enforces a format with LLGuidance (local/grammar.py)
and says there what of a schema it cannot enforce while writing; a server gets the format as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .params import InvalidParameter
from .schema import one_line, resolve, walk

FormatKind = Literal["text", "json", "json_schema", "grammar", "lark"]
KINDS: dict[str, str] = {"text": "free text", "json": "JSON", "json_schema": "JSON schema", "grammar": "grammar"}
# Not a user's choice (not in KINDS): the app's own grammars in LLGuidance's Lark dialect, such as a reply's
# tool calls (tools/calls.py); a reply is never saved with one.
LARK_LABEL = "tool call grammar"

MAX_SCHEMA_BYTES = 1 << 20  # JSONSchemaBench's largest real schemas (Kubernetes) are a few hundred KiB


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
        return KINDS.get(self.kind, LARK_LABEL)

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
    """A JSON schema given inline (it starts with `{`) or as a file path, refused in one line if it is too
    large, not JSON, not valid against its meta-schema, or has a local `$ref` that points nowhere. What an
    engine can enforce of it is the engine's to say (local/grammar.py)."""
    text = schema_or_path if schema_or_path.lstrip().startswith(("{", "[")) else _read(schema_or_path, "JSON schema")
    size = len(text.encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        raise FormatError(f"the JSON schema is {size / (1 << 20):.1f} MiB: the limit is {MAX_SCHEMA_BYTES >> 20} MiB")
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise FormatError(f"the JSON schema is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise FormatError("a JSON schema must be a JSON object")
    _check_schema(schema)
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


def _check_schema(schema: dict[str, Any]) -> None:
    """Valid against its own meta-schema (draft 2020-12 unless `$schema` names another), and each local
    `$ref` resolvable: one line naming where it is not. jsonschema is imported here, not at start-up (~50 ms)."""
    import jsonschema
    from jsonschema.exceptions import SchemaError

    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except SchemaError as error:
        where = "".join(f"/{part}" for part in error.path)
        raise FormatError(f"the JSON schema is not valid at #{where}: {one_line(error.message)}") from None
    except RecursionError:
        raise FormatError("the JSON schema is nested too deeply") from None
    for path, part in walk(schema):
        ref = part.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and resolve(schema, ref) is None:
            raise FormatError(f'{path}: "$ref" {ref!r} points to nothing in the schema')
