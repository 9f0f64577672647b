"""Any JSON value as the GBNF grammar a llama-cpp-python server is sent (../server_params.py), its own JSON
mode being an object only. The local engine enforces formats with LLGuidance (grammar.py).

llama_cpp is imported only when the grammar is written, so naming a format loads no native library."""

from __future__ import annotations

import re


def json_value_gbnf() -> str:
    """llama-cpp-python's JSON grammar, rooted at any value rather than only an object."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return re.sub(r"^root\s*::=.*$", "root ::= value", JSON_GBNF, count=1, flags=re.MULTILINE)
