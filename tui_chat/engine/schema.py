"""JSON schemas as every engine meets them: their parts found by a path a user can read, local `$ref`s
resolved, a cut-off reply's place named and a finished reply validated (formats.json_schema reads one).

A grammar engine enforces a schema while the reply is written; what it cannot enforce is checked here when
the reply is done, so a reply that ends unflagged always validates. No llama_cpp, no Textual.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
# Keywords whose value is one schema, a list of schemas, or a table of them, and where each applies.
_ONE = {"additionalProperties": ".*", "items": "[*]", "contains": "[*]", "propertyNames": " (a key)",
        "not": "", "if": "", "then": "", "else": "", "unevaluatedProperties": ".*", "unevaluatedItems": "[*]",
        "additionalItems": "[*]"}
_LISTS = {"anyOf", "oneOf", "allOf"}
_TABLES = {"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}


def walk(schema: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema with where it applies: `$.spec.template` (properties), `[*]` (items), `[0]`
    (prefixItems), `.*` (other keys); definitions as `#/$defs/Name`."""
    stack: list[tuple[str, Any, int]] = [(path, schema, 0)]
    while stack:
        where, part, depth = stack.pop()
        if not isinstance(part, dict) or depth > 200:
            continue
        yield where, part
        found: list[tuple[str, Any, int]] = []
        for keyword, value in part.items():
            if keyword in _ONE:
                found.append((where + _ONE[keyword], value, depth + 1))
            elif keyword == "prefixItems" and isinstance(value, list):
                found += [(f"{where}[{index}]", item, depth + 1) for index, item in enumerate(value)]
            elif keyword == "items" and isinstance(value, list):  # draft 4-7 tuples
                found += [(f"{where}[{index}]", item, depth + 1) for index, item in enumerate(value)]
            elif keyword in _LISTS and isinstance(value, list):
                found += [(where, item, depth + 1) for item in value]
            elif keyword in _TABLES and isinstance(value, dict):
                for name, item in value.items():
                    if keyword in ("$defs", "definitions"):
                        found.append((f"#/{keyword}/{name}", item, depth + 1))
                    elif keyword == "patternProperties":
                        found.append((f"{where}.{name!r}", item, depth + 1))
                    else:
                        found.append((where + _key(name), item, depth + 1))
        stack += reversed(found)


NUMBER_CAP = 10**15  # the size a number takes at most while written, where its schema sets no bound
DECIMALS = 10**-6  # a number's written fraction stops at 6 digits, where its schema sets no step of its own
STRING_CAP = 256  # characters a string takes at most while written, where its schema sets no lower bound
ARRAY_CAP = 24  # items an array takes at most while written, where its schema sets no lower bound
# Where one of these appears, a narrower part could let through what the schema refuses (under "not" or an
# "if"), or clash with a sibling part that adds properties: the schema is written as it is.
_NEGATING = {"not", "if", "allOf", "unevaluatedProperties", "$dynamicRef", "$recursiveRef"}
_APPLICATORS = {"anyOf", "oneOf", "$ref", "then", "else", "dependentSchemas", "dependencies"}
_OBJECT_WORDS = {"properties", "required", "patternProperties", "additionalProperties", "propertyNames",
                 "minProperties", "maxProperties"}
_NOTES = {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
_SCALAR = {"anyOf": [{"type": "string", "maxLength": STRING_CAP}, {"type": "boolean"}, {"type": "null"},
                     {"type": "number", "minimum": -NUMBER_CAP, "maximum": NUMBER_CAP, "multipleOf": DECIMALS}]}
# Any value, as written where a schema allows any: one level of arrays or objects around scalars, so a
# small model cannot nest keys inside keys (`properties.properties…`, seen fifty deep on real schemas).
SHALLOW = {"anyOf": [*_SCALAR["anyOf"], {"type": "array", "items": _SCALAR, "maxItems": ARRAY_CAP},
                     {"type": "object", "additionalProperties": _SCALAR}]}


def writing_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A narrower schema to write a reply under, so a small model cannot loop where the schema leaves room:
    a string takes at most STRING_CAP characters and an array ARRAY_CAP items (or what the schema's own
    lower bound needs; a `pattern` or `format` does not bound a length), a number stays within ±NUMBER_CAP
    with at most 6 decimals (a model looping in digits stops), an object that lists its properties gets
    no others, and where any value is allowed one is written SHALLOW. Every instance of it is an instance of
    `schema` (which the finished reply is still validated against); where that could not be promised (see
    _NEGATING) it is `schema` itself."""
    return schema if _kept_whole(schema) else _narrowed(schema)


def unnarrowed(schema: dict[str, Any]) -> str:
    """What kept writing_schema from bounding a schema that leaves room to loop in, as `"not" at $.tags`,
    for the user to know a reply may run to max tokens; "" where it bounds it, or nothing needed bounds."""
    where = _kept_whole(schema)
    return where if where and _narrowed(schema) != schema else ""


def _kept_whole(schema: dict[str, Any]) -> str:
    """The first keyword of _NEGATING in `schema` and where, as `"not" at $.tags`; "" when none."""
    for path, part in walk(schema):
        if found := sorted(part.keys() & _NEGATING):
            return f'"{found[0]}" at {path}'
    return ""


def _narrowed(schema: dict[str, Any]) -> dict[str, Any]:
    closing = not any(part.keys() & _APPLICATORS and part.keys() & _OBJECT_WORDS for _, part in walk(schema))
    narrowed: dict[str, Any] = copy.deepcopy(schema)
    for _, part in walk(narrowed):
        types = _types(part)
        if "string" in types and not part.keys() & {"enum", "const"}:
            _cap(part, "minLength", "maxLength", STRING_CAP)
        if "array" in types:
            _cap(part, "minItems", "maxItems", ARRAY_CAP)
        if types & {"integer", "number"}:
            for bound, exclusive, cap in (("maximum", "exclusiveMaximum", NUMBER_CAP),
                                          ("minimum", "exclusiveMinimum", -NUMBER_CAP)):
                if bound not in part and exclusive not in part:
                    part[bound] = cap
        if "number" in types and "multipleOf" not in part and "integer" not in types:
            part["multipleOf"] = DECIMALS
        if closing and _lists_every_property(part):
            part["additionalProperties"] = False
        elif closing and _takes_any_other_key(part, types):
            part["additionalProperties"] = copy.deepcopy(SHALLOW)
        for keyword in ("properties", "patternProperties"):
            table = part.get(keyword)
            if isinstance(table, dict):
                table.update({name: copy.deepcopy(SHALLOW) for name, value in table.items() if _allows_anything(value)})
    return narrowed


def _takes_any_other_key(part: dict[str, Any], types: set[str]) -> bool:
    """An object schema whose unlisted keys may hold any value (no `patternProperties` to say which)."""
    is_object = "object" in types or "properties" in part
    return is_object and "patternProperties" not in part and _allows_anything(part.get("additionalProperties", True))


def _allows_anything(part: Any) -> bool:
    """`true`, or a schema of notes only (`{}`, `{"description": …}`): any value is valid under it."""
    return part is True or isinstance(part, dict) and part.keys() <= _NOTES


def _types(part: dict[str, Any]) -> set[str]:
    """The types a part names, one (`"string"`) or a list (`["number", "null"]`); none where it names none."""
    named = part.get("type")
    if isinstance(named, str):
        return {named}
    return {name for name in named if isinstance(name, str)} if isinstance(named, list) else set()


def _cap(part: dict[str, Any], least: str, most: str, cap: int) -> None:
    """`most` lowered to `cap` where the part allows more, never below what `least` demands."""
    floor, ceiling = part.get(least), part.get(most)
    bound = max(cap, floor if isinstance(floor, int) else 0)
    if not isinstance(ceiling, int) or ceiling > bound:
        part[most] = bound


def _lists_every_property(part: dict[str, Any]) -> bool:
    """An object schema whose `properties` name every key it allows or requires (`dependentRequired` too)."""
    listed, required = part.get("properties"), part.get("required", [])
    depending = part.get("dependentRequired", {})
    if not (isinstance(required, list) and isinstance(depending, dict)
            and all(isinstance(names, list) for names in depending.values())):
        return False
    named = [*required, *(name for names in depending.values() for name in names)]
    return (isinstance(listed, dict) and not part.keys() & {"additionalProperties", "patternProperties"}
            and all(name in listed for name in named))


def locate(schema: dict[str, Any], keyword: str, value: Any = None) -> str:
    """Where `keyword` (with `value`, if given) first appears in the schema; "$" when nowhere found."""
    for path, part in walk(schema):
        if keyword in part and (value is None or part[keyword] == value):
            return path
    return "$"


def violation(schema: dict[str, Any], text: str) -> str:
    """Why `text` is not a JSON document valid under `schema` (formats checked where the validator knows
    them), in one line; "" when it is. jsonschema is imported here, not at start-up (~50 ms)."""
    import jsonschema

    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        return f"the reply is not valid JSON: {error}"
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    found = jsonschema.exceptions.best_match(validator(schema, format_checker=validator.FORMAT_CHECKER)
                                             .iter_errors(document))
    if found is None:
        return ""
    where = "$" + "".join(f"[{part}]" if isinstance(part, int) else _key(str(part)) for part in found.path)
    return f"the reply does not match the schema at {where}: {one_line(found.message)}"


def path_at(text: str) -> str:
    """The JSON path the end of a cut-off JSON document is at: `$.items[3].name`."""
    stack: list[list[Any]] = []  # per open container: [kind, key or index, reading a key]
    in_string = escaped = False
    token = ""
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if stack and stack[-1][0] == "{" and stack[-1][2]:
                    stack[-1][1] = token
                continue
            token += char
            continue
        if char == '"':
            in_string, token = True, ""
        elif char in "{[":
            stack.append([char, None if char == "{" else 0, char == "{"])
        elif char in "}]" and stack:
            stack.pop()
        elif char == ":" and stack:
            stack[-1][2] = False
        elif char == "," and stack:
            if stack[-1][0] == "[":
                stack[-1][1] += 1
            else:
                stack[-1][1], stack[-1][2] = None, True
    path = "$"
    for kind, key, _ in stack:
        if kind == "[":
            path += f"[{key}]"
        elif key is not None:
            path += _key(_unescaped(key))
    return path


def _unescaped(raw: str) -> str:
    try:
        return str(json.loads(f'"{raw}"'))
    except ValueError:
        return raw


def _key(name: str) -> str:
    return f".{name}" if _NAME.match(name) else f"[{json.dumps(name)}]"


def resolve(schema: dict[str, Any], ref: str) -> Any:
    """A local reference's target: a JSON pointer (`#/$defs/x`) or an anchor (`#name`); None if none."""
    if ref in ("#", "#/"):
        return schema
    if not ref.startswith("#/"):
        anchor = ref[1:]
        return next((part for _, part in walk(schema) if part.get("$anchor") == anchor), None)
    target: Any = schema
    for raw in ref[2:].split("/"):
        name = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and name in target:
            target = target[name]
        elif isinstance(target, list) and name.isdigit() and int(name) < len(target):
            target = target[int(name)]
        else:
            return None
    return target


def one_line(message: str) -> str:
    return " ".join(message.split())
