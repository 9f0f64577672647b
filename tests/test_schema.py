"""JSON schemas under LLGuidance: the keywords the engine claims, as JSON-Schema-Test-Suite cases on the tiny
model's vocabulary (valid instances accepted as complete documents, invalid ones refused); what it cannot
enforce said and checked when the reply is done; each refusal one line; real replies on the starter model
validated with jsonschema; where a cut-off reply stopped."""

import json

import jsonschema
import pytest

from conftest import GREEDY, collect, open_backend
from tui_chat.engine.base import Done, Error, Message, Request
from tui_chat.engine.formats import FormatError, OutputFormat, json_schema
from tui_chat.engine.local.grammar import check_format, compile_format, new_matcher, tokenizer_for
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.engine.schema import (
    ARRAY_CAP,
    DECIMALS,
    NUMBER_CAP,
    SHALLOW,
    STRING_CAP,
    path_at,
    violation,
    writing_schema,
)

# (schema, valid instances, invalid instances): hand-picked after the JSON-Schema-Test-Suite's draft2020-12
# cases for each keyword the engine claims to enforce while writing.
CASES = [
    ({"type": "integer"}, [1, -7, 0], [1.5, "1", None, [1]]),
    ({"type": ["string", "null"]}, ["a", None], [1, True]),
    ({"enum": ["red", 3, None]}, ["red", 3, None], ["blue", 4, False]),
    ({"const": {"a": 1}}, [{"a": 1}], [{"a": 2}, {}]),
    ({"type": "integer", "minimum": 3, "maximum": 9}, [3, 9], [2, 10]),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, [0.5], [0, 1, 1.5]),
    ({"type": "integer", "multipleOf": 5}, [0, 15, -10], [7]),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ["ab", "abc"], ["a", "abcd"]),
    ({"type": "string", "pattern": "b+c"}, ["abbcd", "bc"], ["ac", "cb"]),  # unanchored, as JSON Schema says
    ({"type": "string", "pattern": "^a[0-9]{2}$"}, ["a12"], ["a123", "xa12"]),
    ({"type": "string", "format": "date-time"}, ["2024-02-29T12:30:00Z"], ["2024-02-29", "noon"]),
    ({"type": "string", "format": "date"}, ["2024-02-29"], ["2024-13-01"]),
    ({"type": "string", "format": "email"}, ["ada@example.com"], ["ada.example.com"]),
    ({"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567"]),
    ({"type": "string", "format": "uri"}, ["https://example.com/a?b=c"], ["not a uri"]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
     [[1], [1, 2]], [[], [1, 2, 3], ["a"]]),
    ({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
     [[1, "a"], [1]], [["a", 1], [1, "a", 2]]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
     [{"a": 1}], [{}, {"a": "x"}, {"a": 1, "b": 2}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}},
     [{}, {"a": 1}, {"a": 1, "zz": [True]}], [{"a": "x"}]),
    ({"type": "object", "additionalProperties": {"type": "boolean"}}, [{"x": True, "y": False}], [{"x": 1}]),
    ({"type": "object", "required": ["id"]}, [{"id": 1}, {"id": "x", "more": None}], [{}, {"other": 1}]),
    ({"type": "object", "patternProperties": {"^n_": {"type": "integer"}}, "additionalProperties": False},
     [{"n_a": 1}], [{"n_a": "x"}, {"m": 1}]),
    ({"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/$defs/pos"}},
     [[1, 2]], [[0], ["1"]]),
    ({"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
      "required": ["v"], "additionalProperties": False},
     [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": []}]}], [{"v": 1, "kids": [{}]}]),
    ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]}, [1, "a"], ["ab", None]),
    ({"allOf": [{"type": "string"}, {"minLength": 2}, {"maxLength": 2}]}, ["ab"], ["a", "abc", 12]),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, [1, "a"], [None]),  # disjoint: enforced exactly
    ({"title": "T", "description": "d", "examples": [1], "$comment": "c", "deprecated": True, "x-unknown": {},
      "type": "boolean"}, [True, False], [1, "true"]),  # annotations and unknown keywords ignored
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    backend = open_backend(tiny_model)
    yield tokenizer_for(backend.session)
    backend.close()


def accepts(tokenizer, schema: dict, instance) -> bool:
    """Whether the matcher takes `instance`, written as JSON, as a whole reply."""
    matcher = new_matcher(tokenizer, compile_format(tokenizer, OutputFormat("json_schema", json.dumps(schema))).grammar)
    tokens = tokenizer.tokenize_str(json.dumps(instance))
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and matcher.is_accepting()


@pytest.mark.parametrize(("schema", "valid", "invalid"), CASES, ids=[json.dumps(c[0])[:60] for c in CASES])
def test_the_claimed_keywords_accept_the_valid_and_refuse_the_invalid(tokenizer, schema, valid, invalid):
    """Valid instances are written whole, but for what the writing narrows on purpose (`writing_schema`: no
    keys an object does not list, no string past STRING_CAP); invalid ones never."""
    json_schema(json.dumps(schema))  # a schema the suite calls valid passes the checks made when it is chosen
    note = compile_format(tokenizer, OutputFormat("json_schema", json.dumps(schema))).note
    assert "not enforced" not in note  # (an allOf is written without the bounds added elsewhere: said so)
    narrowed = jsonschema.Draft202012Validator(writing_schema(schema))
    for instance in valid:
        jsonschema.validate(instance, schema)  # the case itself is right
        assert accepts(tokenizer, schema, instance) == narrowed.is_valid(instance), instance
    for instance in invalid:
        assert not accepts(tokenizer, schema, instance), instance


def test_json_is_written_compact_or_indented_never_padded(tokenizer):
    """Issue 38: `"paid":   true  }` under a schema: blanks where one space, or a newline and an indent, do."""
    schema = {"type": "object", "properties": {"paid": {"type": "boolean"}}, "required": ["paid"]}
    grammar = compile_format(tokenizer, OutputFormat("json_schema", json.dumps(schema))).grammar

    def whole(text: str) -> bool:
        matcher, tokens = new_matcher(tokenizer, grammar), tokenizer.tokenize_str(text)
        return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and \
            matcher.is_accepting()

    assert whole('{"paid":true}') and whole('{"paid": true}') and whole('{\n  "paid": true\n}')
    assert not whole('{"paid":   true  }') and not whole('{"paid": true  }')


NARROWED = [  # (schema, what writing_schema makes of it)
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
     {"type": "object", "properties": {"a": {"type": "string", "maxLength": STRING_CAP}}, "required": ["a"],
      "additionalProperties": False}),
    ({"type": "string", "minLength": 600}, {"type": "string", "minLength": 600, "maxLength": 600}),
    ({"type": "integer", "minimum": 0}, {"type": "integer", "minimum": 0, "maximum": NUMBER_CAP}),
    ({"type": "number", "exclusiveMaximum": 1},
     {"type": "number", "exclusiveMaximum": 1, "minimum": -NUMBER_CAP, "multipleOf": DECIMALS}),
    ({"type": "string", "pattern": "a+"}, {"type": "string", "pattern": "a+", "maxLength": STRING_CAP}),
    ({"type": "string", "format": "uri", "maxLength": 32767},
     {"type": "string", "format": "uri", "maxLength": STRING_CAP}),
    ({"enum": ["a", "b"], "type": "string"}, {"enum": ["a", "b"], "type": "string"}),
    ({"type": "array", "items": {"type": "boolean"}},
     {"type": "array", "items": {"type": "boolean"}, "maxItems": ARRAY_CAP}),
    ({"type": "array", "minItems": 40, "maxItems": 50}, {"type": "array", "minItems": 40, "maxItems": 40}),
    ({"type": ["number", "null"]}, {"type": ["number", "null"], "maximum": NUMBER_CAP, "minimum": -NUMBER_CAP,
     "multipleOf": DECIMALS}),
    ({"type": "number", "multipleOf": 0.5}, {"type": "number", "multipleOf": 0.5, "maximum": NUMBER_CAP,
     "minimum": -NUMBER_CAP}),
    ({"type": "object", "required": ["b"], "properties": {"a": {"type": "null"}}},  # requires a key not listed
     {"type": "object", "required": ["b"], "properties": {"a": {"type": "null"}}, "additionalProperties": SHALLOW}),
    ({"properties": {"a": {}}, "dependentRequired": {"a": ["b"]}},  # "a" then requires a key it does not list
     {"properties": {"a": SHALLOW}, "dependentRequired": {"a": ["b"]}, "additionalProperties": SHALLOW}),
    ({"type": "object", "additionalProperties": {"description": "anything"}},
     {"type": "object", "additionalProperties": SHALLOW}),
    ({"type": "object", "patternProperties": {"^x": True}}, {"type": "object", "patternProperties": {"^x": SHALLOW}}),
    ({"properties": {"kind": {"enum": [1]}}, "anyOf": [{"properties": {"x": {"type": "boolean"}}}]},
     {"properties": {"kind": {"enum": [1]}}, "anyOf": [{"properties": {"x": {"type": "boolean"}}}]}),
    ({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
     {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}),
    ({"not": {"type": "string"}}, {"not": {"type": "string"}}),
]


@pytest.mark.parametrize(("schema", "narrowed"), NARROWED, ids=[json.dumps(c[0])[:60] for c in NARROWED])
def test_a_reply_is_written_under_a_narrower_schema_only_where_its_instances_stay_valid(schema, narrowed):
    """A small model loops in a string with no bound, or writes keys of its own into an object that lists
    its keys (seen on real schemas); where another part could add keys (anyOf beside properties, allOf) or
    a narrower part could let more through ("not"), the schema is kept as it is."""
    assert writing_schema(schema) == narrowed


EVERY_KEYWORD = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "A city",
    "type": "object",
    "$defs": {"name": {"type": "string", "minLength": 1, "maxLength": 30, "pattern": "[A-Z]"}},
    "properties": {
        "city": {"$ref": "#/$defs/name"},
        "country": {"$ref": "#/$defs/name"},
        "population": {"type": "integer", "minimum": 0, "maximum": 40_000_000},
        "area_km2": {"type": "number", "exclusiveMinimum": 0},
        "founded": {"type": "string", "format": "date"},
        "capital": {"type": "boolean"},
        "kind": {"enum": ["town", "city", "metropolis"]},
        "planet": {"const": "Earth"},
        "coordinates": {"prefixItems": [{"type": "number", "minimum": -90, "maximum": 90},
                                        {"type": "number", "minimum": -180, "maximum": 180}],
                        "items": False, "minItems": 2},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "mayor": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"name": {"$ref": "#/$defs/name"}},
                                                "required": ["name"], "additionalProperties": False}]},
    },
    "required": ["city", "country", "population", "kind", "planet"],
    "additionalProperties": False,
}


def test_a_schema_with_every_common_keyword_is_enforced_whole(tokenizer):
    assert compile_format(tokenizer, json_schema(json.dumps(EVERY_KEYWORD))).note == ""
    paris = {"city": "Paris", "country": "France", "population": 2_100_000, "founded": "0300-01-01", "kind": "city",
             "planet": "Earth", "coordinates": [48.85, 2.35], "tags": ["old"], "mayor": None}
    assert accepts(tokenizer, EVERY_KEYWORD, paris)
    # LLGuidance's one departure that matters here: the properties come in the schema's order
    assert not accepts(tokenizer, EVERY_KEYWORD, {"country": "France"} | paris)
    for broken in ({"population": -1}, {"planet": "Mars"}, {"city": "paris"}, {"coordinates": [1, 2, 3]},
                   {"extra": 1}, {"mayor": {"name": "A", "age": 3}}):
        assert not accepts(tokenizer, EVERY_KEYWORD, paris | broken), broken


@pytest.mark.parametrize(
    ("schema", "note"),
    [
        ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
         '"uniqueItems" at $.tags'),
        ({"properties": {"spec": {"properties": {"template": {"if": {"type": "string"}, "then": {"maxLength": 3}}}}}},
         '"if" and "then" at $.spec.template; no length bounds added while writing ("if" at $.spec.template): '
         'a reply may run to max tokens'),
        ({"type": "array", "items": {"not": {"type": "null"}}},
         '"not" at $[*]; no length bounds added while writing ("not" at $[*]): a reply may run to max tokens'),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, '"oneOf" (as "anyOf") at $'),
        ({"properties": {"site": {"type": "string", "format": "hostname-ish"}}}, 'format "hostname-ish" at $.site'),
    ],
)
def test_what_cannot_be_enforced_while_writing_is_said_with_where(tiny, schema, note):
    said = check_format(tiny.session, json_schema(json.dumps(schema)))
    assert said == f"not enforced while writing, checked when the reply is done: {note}"


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"allOf": [{"type": "object", "properties": {"name": {"type": "string"}}}]}, '"allOf" at $'),
        ({"type": "array", "items": {"type": "integer", "allOf": [{"minimum": 0}]}}, '"allOf" at $[*]'),
    ],
)
def test_a_schema_written_without_its_bounds_says_where_and_why(tokenizer, schema, where):
    """writing_schema keeps such a schema whole (a narrower part could clash with it): the user is told a
    reply under it may run on, and where the keyword is that kept it whole."""
    note = compile_format(tokenizer, json_schema(json.dumps(schema))).note
    assert note == f"no length bounds added while writing ({where}): a reply may run to max tokens"


def test_nothing_is_said_of_bounds_where_none_were_needed(tokenizer):
    assert compile_format(tokenizer, json_schema(json.dumps({"allOf": [{"enum": [1, 2]}]}))).note == ""


def write(backend, output, prompt: str = "Hello", params: SamplingParams = GREEDY) -> Done:
    _, final = collect(backend.generate(Request([Message("user", prompt)], LiveParams(params), format=output)))
    assert isinstance(final, Done), final
    return final


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "array", "items": {"enum": [1]}, "minItems": 2, "maxItems": 2, "uniqueItems": True},
         "the reply does not match the schema at $: [1, 1] has non-unique elements"),
        ({"oneOf": [{"const": 1}, {"enum": [1]}]},
         "the reply does not match the schema at $: 1 is valid under each of "),
    ],
)
def test_a_finished_reply_that_breaks_what_was_not_enforced_is_flagged_never_passed(tiny, schema, problem):
    """The only replies these schemas allow while writing break what is checked afterwards."""
    done = write(tiny, json_schema(json.dumps(schema)))
    assert done.stop_reason == "eos" and done.incomplete and done.note.startswith(problem)


def test_a_cut_off_reply_names_the_path_it_stopped_at(tiny):
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
        "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False}
    done = write(tiny, json_schema(json.dumps(schema)), params=GREEDY.with_changes(max_tokens=12))
    assert done.stop_reason == "length" and done.incomplete
    assert done.note == f"the JSON stopped at {path_at(done.text)}"
    assert done.note.startswith("the JSON stopped at $.items")


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('{"a": [1, {"b": "x', "$.a[1].b"),
        ('{"a": 1, "b', "$"),
        ('[[1, 2], [3', "$[1][0]"),
        ('{"odd key": {"x\\"y": [', '$["odd key"]["x\\"y"][0]'),
        ('{"a": "}]", "b": {', "$.b"),
    ],
)
def test_path_at(text, path):
    assert path_at(text) == path


def test_violation_names_the_place_and_reads_formats():
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}
    assert violation(schema, '{"when": "2024-02-30"}').startswith("the reply does not match the schema at $.when: ")
    assert violation(schema, '{"when": "2024-02-29"}') == ""
    assert violation(schema, '{"when": ').startswith("the reply is not valid JSON: ")


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"properties": {"code": {"pattern": "(?<!x)y"}}},
         "the JSON schema cannot be enforced: $.code: pattern '(?<!x)y': look-around, including look-ahead and "
         "look-behind, is not supported"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]},
         "the JSON schema cannot be enforced: $: Unsatisfiable schema: incompatible types"),
        ({"$ref": "#"}, "the output format allows no text at all: does a rule or a $ref only refer to itself?"),
        ({"$ref": "https://example.com/other.json"}, "the JSON schema cannot be enforced: $: Resource "),
    ],
)
def test_schemas_no_engine_here_can_enforce_are_refused_in_one_line(tiny, schema, message):
    with pytest.raises(FormatError) as refused:
        check_format(tiny.session, json_schema(json.dumps(schema)))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    _, final = collect(tiny.generate(Request([Message("user", "Hi")], LiveParams(GREEDY),
                                             format=json_schema(json.dumps(schema)))))
    assert final == Error(str(refused.value))


@pytest.fixture(scope="module")
def gemma(starter_model):
    backend = open_backend(starter_model, n_ctx=2048, chat_template="gemma")
    yield backend
    backend.close()


STARTER_SCHEMAS = [
    EVERY_KEYWORD,
    {"type": "object", "properties": {"name": {"type": "string", "pattern": "[a-z]"},
                                      "email": {"type": "string", "format": "email"},
                                      "id": {"type": "string", "format": "uuid"}},
     "required": ["name", "email", "id"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
                                      "steps": {"type": "array", "items": {"type": "string", "maxLength": 40},
                                                "maxItems": 3, "uniqueItems": True}},
     "required": ["answer", "steps"], "additionalProperties": False},
]


@pytest.mark.parametrize("seed", [None, 1, 2])
@pytest.mark.parametrize("schema", STARTER_SCHEMAS, ids=["every-keyword", "formats", "approximated"])
def test_real_replies_on_the_starter_validate_unless_flagged(gemma, schema, seed):
    """The guarantee: a reply that ends unflagged validates with jsonschema (formats included)."""
    params = GREEDY if seed is None else SamplingParams(seed=seed, temperature=1.0)
    done = write(gemma, json_schema(json.dumps(schema)), "Respond in JSON: describe Paris.",
                 params.with_changes(max_tokens=300))
    if seed is None and schema is not STARTER_SCHEMAS[2]:
        assert not done.incomplete, done  # greedy, the starter completes both schemas it is held to throughout
    if not done.incomplete:
        checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
        jsonschema.Draft202012Validator(schema, format_checker=checker).validate(json.loads(done.text))
    else:
        assert done.note, "a flagged reply says why"
