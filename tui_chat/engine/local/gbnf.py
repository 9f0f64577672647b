"""An output format (../formats.py) as the GBNF grammar llama.cpp's grammar sampler takes: JSON schemas
through llama-cpp-python's own converter. Also what a llama-cpp-python server is sent for any JSON
value (../server_params.py), its own JSON mode being an object only.

llama_cpp is imported only when a JSON format is converted, so naming one loads no native library."""

from __future__ import annotations

import re

from ..formats import FormatError, OutputFormat


def to_gbnf(output: OutputFormat) -> str:
    """The grammar for a constrained `output`; raises FormatError where the converter gives up."""
    if output.kind == "json":
        return _json_value_gbnf()
    if output.kind == "json_schema":
        return _converted(output.source)
    return output.source


def _converted(schema_text: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        converted: str = json_schema_to_gbnf(schema_text)
    except (AssertionError, ValueError, KeyError, TypeError, IndexError, RecursionError) as error:
        raise FormatError(f"the JSON schema cannot be converted to a grammar: {error}") from None
    return converted


def _json_value_gbnf() -> str:
    """llama-cpp-python's JSON grammar, rooted at any value rather than only an object."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return re.sub(r"^root\s*::=.*$", "root ::= value", JSON_GBNF, count=1, flags=re.MULTILINE)
