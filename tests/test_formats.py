"""Output formats on real llama.cpp: JSON, JSON schemas (checked by a real validator), GBNF grammars; the
mask made visible; bad input as one line with the backend still working; the remote mapping against a
real llama_cpp.server on loopback."""

import json
import math
from functools import partial
from itertools import pairwise

import httpx
import jsonschema
import numpy as np
import pytest

from conftest import GREEDY, collect, open_backend, run_cli
from tui_chat.engine.base import Done, Error, Message, Request, Token
from tui_chat.engine.formats import TEXT, FormatError, OutputFormat, choose, from_dict, grammar, json_schema
from tui_chat.engine.local.grammar import Constraint
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.engine.server_params import format_fields
from tui_chat.probe import position_context
from tui_chat.ui.widgets.xray import grammar_summary

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["old", "big", "coastal"]}, "maxItems": 3},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}
WORDS = "^$|(^(?:\\S+\\s+){0,99}\\S+$)"  # at most 100 words
PROMPTS = ("Respond in JSON: what is the capital of France?", "Hello, tell me about yourself.")
SAMPLED = [SamplingParams(seed=seed, temperature=1.0, max_tokens=200) for seed in (1, 2)]


def write(backend, prompt: str, output, params: SamplingParams = GREEDY, **request) -> tuple[list[Token], Done]:
    tokens, final = collect(backend.generate(Request([Message("user", prompt)], LiveParams(params), format=output,
                                                     **request)))
    assert isinstance(final, Done), final
    return tokens, final


@pytest.fixture(scope="module")
def gemma(starter_model):
    """The starter model with its own turn format (the file names none, so plain text is the default)."""
    backend = open_backend(starter_model, n_ctx=2048, chat_template="gemma")
    yield backend
    backend.close()


@pytest.mark.parametrize("params", [GREEDY.with_changes(max_tokens=200), *SAMPLED])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_reply_under_json_parses(tiny, gemma, prompt, params):
    for backend in (tiny, gemma):
        _, done = write(backend, prompt, choose("json"), params)
        if done.incomplete:
            assert done.stop_reason == "length"
            continue
        json.loads(done.text)


def test_json_mode_writes_an_object_that_ends_not_digits_to_max_tokens(starter_model):
    """As OpenAI's json_object: an object at the top; a number cannot loop in digits (issue 38: the starter wrote
    `19800000000000000…` to the token limit when any JSON value was allowed)."""
    done = run_cli("run", "-m", str(starter_model), "--temperature", "0", "--format", "json", "--max-tokens", "256",
                   "--json", "-p", "Describe a person as JSON with a name and an age.")
    assert done.returncode == 0, done.stderr
    turn = json.loads(done.stdout)["turns"][0]
    assert not turn["incomplete"] and turn["stop_reason"] == "eos", turn
    assert isinstance(json.loads(turn["text"]), dict)


@pytest.mark.parametrize("params", [GREEDY.with_changes(max_tokens=300), *SAMPLED])
def test_every_reply_under_a_schema_validates(tiny, gemma, params):
    output = json_schema(json.dumps(SCHEMA))
    for backend in (tiny, gemma):
        _, done = write(backend, PROMPTS[0], output, params.with_changes(max_tokens=400))
        assert done.stop_reason == "eos" and not done.incomplete, done
        jsonschema.validate(json.loads(done.text), SCHEMA)


@pytest.mark.parametrize("params", [GREEDY, *SAMPLED])
def test_a_yes_or_no_grammar_gives_exactly_one_of_them(tiny, gemma, params):
    for backend in (tiny, gemma):
        _, done = write(backend, "Is Paris in France?", grammar('root ::= "yes" | "no"'), params)
        assert done.text in ("yes", "no") and done.stop_reason == "eos"


def test_respond_in_json_primes_the_first_token_and_the_format_forces_it(gemma):
    """The first-token demonstration: "Respond in JSON:" makes `{` likelier as the first token (its exact
    probability, even outside the top 20); with a JSON-object format on, the grammar leaves it no choice."""
    primed = gemma.word_probability(_prompt_ids(gemma, PROMPTS[0]), "{").result()
    plain = gemma.word_probability(_prompt_ids(gemma, "What is the capital of France?"), "{").result()
    assert primed.prob > 2 * plain.prob
    tokens, done = write(gemma, PROMPTS[0], json_schema('{"type": "object"}'), top_logprobs=5)
    first = tokens[0]
    assert first.piece.startswith("{") and first.grammar.forced
    assert 0 < first.grammar.removed < 1
    assert all(c.allowed is False for c in first.top if not c.text.startswith("{"))
    free, _ = write(gemma, PROMPTS[0], TEXT, top_logprobs=5)
    assert free[0].grammar is None and free[0].top[0].allowed is None
    assert done.metrics.grammar_ms_per_token > 0


def _prompt_ids(backend, prompt: str) -> tuple[int, ...]:
    return write(backend, prompt, TEXT, GREEDY.with_changes(max_tokens=1))[1].prompt_ids


def test_the_mask_marks_what_the_grammar_forbade(tiny):
    tokens, done = write(tiny, PROMPTS[1], json_schema(json.dumps(SCHEMA)), top_logprobs=10)
    assert all(t.grammar is not None and 0 <= t.grammar.removed <= 1 for t in tokens)
    assert any(c.allowed is False for t in tokens for c in t.top), "some alternatives were forbidden"
    assert all(c.allowed for t in tokens for c in t.top if c.token_id == t.token_id)
    assert any(t.grammar.forced for t in tokens), "the schema's punctuation leaves one choice"


def test_cancel_mid_reply_under_a_format(tiny):
    """A grammar that cannot end before 1,000 tokens, so only the cancellation ends the reply (a closable one
    let the tiny model, at thousands of tokens a second, write `[a]` and stop before the cancellation was seen)."""
    stream = tiny.generate(Request([Message("user", PROMPTS[1])], LiveParams(GREEDY.with_changes(max_tokens=2000)),
                                   format=grammar('root ::= "[" [ab]{1000}')))
    done = None
    for event in stream:
        if isinstance(event, Token):
            stream.cancel()
        done = event
    assert isinstance(done, Done) and done.stop_reason == "cancelled" and done.incomplete
    _, after = write(tiny, "Is Paris in France?", grammar('root ::= "yes" | "no"'))
    assert after.text in ("yes", "no")


def test_a_grammar_that_cannot_end_stops_at_max_tokens_marked_incomplete(tiny):
    _, done = write(tiny, PROMPTS[1], grammar('root ::= "a"{30}'), GREEDY.with_changes(max_tokens=20))
    assert done.stop_reason == "length" and done.incomplete and done.text == "a" * 20


def test_a_grammar_with_no_complete_text_ends_the_reply_incomplete_in_one_line(tiny):
    """`root ::= "a" root` never ends: llama.cpp's sampler let it run to max tokens; LLGuidance sees after the
    first `a` that nothing can complete it. The reply keeps what it wrote, flagged, with why."""
    tokens, final = collect(tiny.generate(Request([Message("user", "Hi")], LiveParams(GREEDY),
                                                  format=grammar('root ::= "a" root'))))
    assert [t.text for t in tokens] == ["a"]
    assert isinstance(final, Done) and final.stop_reason == "format" and final.incomplete and final.text == "a"
    assert final.note.startswith("the output format allowed no next token there: the format allows too many ways to "
                                 "go on at once (over the grammar engine's limit of 50,000 items)")
    assert "\n" not in final.note


def test_a_pattern_that_outran_the_grammar_engines_default_budget_is_followed_to_the_end(gemma):
    """A real schema's pattern beside a length bound (JSONSchemaBench Github_easy o21053) ran out of LLGuidance's
    default work per mask mid-reply on the starter, leaving no token allowed (LIMITS raises it)."""
    schema = json.dumps({
        "$schema": "http://json-schema.org/draft-07/schema#", "title": "Brief clarification question schema",
        "type": "object", "properties": {name: {"minLength": 1, "maxLength": 5000, "pattern": WORDS, "type": "string"}
                                         for name in ("question", "answer")},
        "additionalProperties": False, "required": ["question", "answer"]})
    prompt = f"Reply with one JSON object that follows this JSON schema:\n{schema}"
    _, done = write(gemma, prompt, json_schema(schema), GREEDY.with_changes(max_tokens=100))
    assert done.stop_reason in ("eos", "length"), done.note  # before: "format", 12 tokens in


@pytest.mark.parametrize(
    ("grammar_text", "message"),
    [
        ('root ::= "yes" | foo', "the grammar does not parse: Rule 'foo' not found"),
        ('answer ::= "yes"', "the grammar does not parse: No 'root' rule found"),
        ('root ::= root "x"', "the output format allows no text at all: does a rule or a $ref only refer to itself?"),
        ('root ::= "unterminated', "the grammar does not parse: Unexpected end of input"),
    ],
)
def test_a_grammar_that_does_not_parse_is_one_line_and_the_backend_goes_on(tiny, capfd, grammar_text, message):
    tokens, final = collect(tiny.generate(Request([Message("user", "Hi")], LiveParams(GREEDY),
                                                  format=grammar(grammar_text))))
    assert tokens == [] and isinstance(final, Error) and final.message.startswith(message)
    assert "\n" not in final.message
    assert capfd.readouterr().err == ""
    _, done = write(tiny, "Hi", TEXT, GREEDY.with_changes(max_tokens=4))
    assert done.metrics.completion_tokens > 0


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("{not json", "the JSON schema is not valid JSON: "),
        ("[1, 2]", "a JSON schema must be a JSON object"),
        ('{"type": "strin"}', "the JSON schema is not valid at #/type: 'strin' is not valid under any of the given"),
        ('{"properties": {"n": {"minimum": "3"}}}', "the JSON schema is not valid at #/properties/n/minimum: '3' is "
                                                    "not of type 'number'"),
        ('{"properties": {"a": {"$ref": "#/$defs/nope"}}}', "$.a: \"$ref\" '#/$defs/nope' points to nothing in the"),
        ('{"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"x": {"type": 3}}, "$ref": "#/y"}',
         "the JSON schema is not valid at #/definitions/x/type: 3 is not valid under any of the given schemas"),
        ('{"items": {"$ref": "#/$defs/a~1b"}, "$defs": {"a/b": {}}}', None),
        ("/no/such/schema.json", "cannot read the JSON schema file /no/such/schema.json"),
    ],
)
def test_bad_schemas_are_refused_when_chosen(schema, message):
    if message is None:  # a JSON pointer with an escaped "/" resolves
        json_schema(schema)
        return
    with pytest.raises(FormatError) as refused:
        json_schema(schema)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_schema_over_1_mib_is_one_line():
    huge = json.dumps({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(60_000)}})
    with pytest.raises(FormatError, match=r"^the JSON schema is 1\.\d MiB: the limit is 1 MiB$"):
        json_schema(huge)


def test_a_schema_the_engine_cannot_take_is_the_replys_one_error(tiny):
    output = json_schema('{"properties": {"code": {"type": "string", "pattern": "(?=a)b"}}}')
    tokens, final = collect(tiny.generate(Request([Message("user", "Hi")], LiveParams(GREEDY), format=output)))
    assert tokens == [] and final == Error("the JSON schema cannot be enforced: $.code: pattern '(?=a)b': "
                                           "look-around, including look-ahead and look-behind, is not supported")


def test_a_branch_the_format_forbids_is_refused(tiny):
    tokens, _ = write(tiny, "Is Paris in France?", TEXT, GREEDY.with_changes(max_tokens=3))
    given = tuple(t.token_id for t in tokens)
    _, final = collect(tiny.generate(Request([Message("user", "Is Paris in France?")], LiveParams(GREEDY),
                                             forced=given, format=grammar('root ::= "yes" | "no"'))))
    assert isinstance(final, Error) and final.message.startswith("the output format does not allow ")


def test_formats_are_read_from_files_and_saved_settings(tmp_path):
    path = tmp_path / "yes.gbnf"
    path.write_text('root ::= "yes"\n')
    assert grammar(str(path)).source == 'root ::= "yes"\n'
    schema_path = tmp_path / "schema.json"
    schema_path.write_text(json.dumps(SCHEMA))
    chosen = choose("json_schema", str(schema_path))
    assert json.loads(chosen.source) == SCHEMA and from_dict(chosen.as_dict()) == chosen
    with pytest.raises(FormatError, match="unknown output format 'yaml'"):
        choose("yaml")


def test_the_remote_mapping_against_llama_cpp_server(tiny_server):
    """What server_params sends for each format, as a real llama_cpp.server on loopback answers it."""
    server = "llama-cpp-python server"
    for output, check in (
        (choose("json"), lambda text: text.lstrip().startswith("{") or pytest.fail(text)),
        (json_schema(json.dumps(SCHEMA)), lambda text: jsonschema.validate(json.loads(text), SCHEMA)),
        (grammar('root ::= "yes" | "no"'), lambda text: text in ("yes", "no") or pytest.fail(text)),
    ):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 300,
                "temperature": 0} | format_fields(server, output)
        answer = httpx.post(f"{tiny_server}/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        # JSON mode is the server's json_object: an object, in whose keys the random tiny model may loop to
        # max tokens (the server bounds no string); the other formats end
        assert choice["finish_reason"] == "stop" or output.kind == "json", choice
        check(choice["message"]["content"])
    assert format_fields("vLLM", grammar('root ::= "a"')) is None


def test_a_bias_that_bans_all_the_format_allows_is_one_line(tiny):
    """After `a` the grammar allows only the end of the reply; a logit bias of -inf on it leaves nothing
    to draw: the reply ends with one line, not with llama.cpp aborting on a token the grammar refuses."""
    banned = GREEDY.with_changes(logit_bias=[("</s>", -math.inf)])
    tokens, final = collect(tiny.generate(Request([Message("user", "Hi")], LiveParams(banned),
                                                  format=grammar('root ::= "a"'))))
    assert "".join(t.text for t in tokens) == "a"
    assert final == Error("nothing the format allows is left to draw: a logit bias may ban it")


def test_xtc_under_a_format_draws_the_chains_pick_and_the_reply_still_parses(gemma):
    """XTC removes the likeliest candidates by moving the array's start (issue 25, item 4): the format's
    draw reads the pick there, and refills its array from the start (it used to abort the process)."""
    params = SamplingParams(seed=3, temperature=1.0, xtc_probability=1.0, xtc_threshold=0.1, max_tokens=200)
    tokens, done = write(gemma, PROMPTS[0], choose("json"), params, xray=True)
    assert any(s.name == "xtc" and s.kept < prev.kept for t in tokens for prev, s in pairwise(t.stages))
    if not done.incomplete:
        json.loads(done.text)


def test_the_grammars_removed_mass_is_over_the_whole_vocabulary(gemma):
    """The mask is judged over the whole vocabulary (issue 25, item 5: "forced", "p = 0.0%" and "removed 83.7%"
    together, when only the 1,024 likeliest were judged). Checked against a fresh matcher, token by token."""
    output = choose("json")
    tokens, done = write(gemma, PROMPTS[0], output, SAMPLED[1].with_changes(max_tokens=24), top_logprobs=5)
    session = gemma.session
    constraint = Constraint(session, output)
    for index, token in enumerate(tokens):
        if index:  # the first token's logits came with the prompt's batch: recomputed, they move a little
            logits = session.scratch_logits(position_context(done.prompt_ids, tokens, index))[0]
            probs = np.exp(logits.astype(np.float64) - logits.max())
            allowed, _ = constraint.judge()
            removed = 1.0 - probs[allowed].sum() / probs.sum()
            assert abs(token.grammar.removed - removed) < 1e-3, index
            assert token.grammar.allowed == allowed.sum()
            assert "at least" not in grammar_summary(token.grammar)
        constraint.accept(token.token_id)


def _optional_properties(count: int) -> OutputFormat:
    return json_schema(json.dumps({"type": "object", "properties": {f"property_{i:04d}": {"type": "string"}
                                                                   for i in range(count)}}))


def test_a_thousand_optional_properties_are_written_and_a_schema_past_the_engines_limits_is_said_in_our_words(tiny):
    """Issue 38: a 1,000-property object schema (37 KB) stopped at its first token in LLGuidance's words
    (`Current row has 3999 items; max is 2000`, or `initial lexer configuration (grammar) too big`)."""
    request = partial(Request, [Message("user", "Hi")], LiveParams(GREEDY.with_changes(max_tokens=24)))
    final = tiny.generate(request(format=_optional_properties(1000))).result()
    assert isinstance(final, Done) and final.text.startswith("{") and "no next token" not in final.note, final
    assert final.stop_reason == "length" or isinstance(json.loads(final.text), dict)
    over = tiny.generate(request(format=_optional_properties(6000))).result()
    message = over.message if isinstance(over, Error) else over.note
    assert "the format allows too many ways to go on at" in message and "grammar engine's limit" in message
    assert "Current row" not in message and "Too many items" not in message and len(message) < 300, message
