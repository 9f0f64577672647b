"""A reply's output format (../formats.py) enforced by LLGuidance, applied the fast way.

JSON schemas compile to LLGuidance's grammar (draft 2020-12: `$ref`, `anyOf`/`allOf`, `prefixItems`,
unanchored `pattern`s, `format`s, numeric bounds...); GBNF grammars are converted to its Lark dialect;
JSON mode is the schema of an object (JSON_MODE). What it cannot enforce while writing (`oneOf` it cannot prove
disjoint, `uniqueItems`, `if`/`then`, `not`, unknown formats...) it is compiled without, the note says
which and where, and the finished reply is validated (../schema.py): a reply that breaks the schema is
flagged, never passed as complete.

As llama.cpp's own common sampler does: the chain draws as if there were no grammar; the matcher checks
that one token (microseconds); only when it is not allowed is the whole vocabulary's mask computed (tens
of µs on a 262k vocabulary) and the chain draws again among the tokens it allows. The inspector reads the
same mask, computed once per position.

The tokenizer LLGuidance needs is built from the model's vocabulary once per loaded model (1–4 s on a 262k
vocabulary; it holds a trie and pointers into the loaded model, so it is kept in memory, not on disk).
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llama_cpp
import llguidance
import numpy as np
from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from llguidance.llamacpp import lltokenizer_from_vocab
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from ..formats import FormatError, OutputFormat
from ..schema import locate, one_line, path_at, unnarrowed, violation, writing_schema
from .chain import Candidates, Chain
from .llamacpp import LlamaSession

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# At each place JSON allows whitespace: nothing, one space, or a newline and an indent, so a small model cannot
# loop in blanks (LLGuidance's default allows any run of them) nor pad a line (`"paid":   true  }`). A schema's
# own "x-guidance" options still win.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_pattern": r"(?: |\n(?: {0,16}|\t{0,4}))?"}
# LLGuidance's work for one mask, raised from its default 200,000 (~14 ms): a JSON Schema pattern beside a
# length bound (`(?:\\S+\\s+){0,99}\\S+` in at most 5,000 characters, a real schema's) ran out of it mid-reply
# and left no token allowed; 1,000,000 still did on another path of the same reply. Only such a step spends it.
# Its parser's open alternatives at one point, and the work to build its first lexer state, raised tenfold and
# twentyfold from 2,000 and 1,000,000: a 1,000-property object whose properties are optional has ~4,000 at its
# start (a 37 KB schema was refused, issue 38); so raised, that reply masks in ~2.5 ms a token here.
LIMITS = LLParserLimits(step_lexer_fuel=5_000_000, max_items_in_row=20_000, initial_lexer_fuel=20_000_000)
_OVER_LIMIT = (  # LLGuidance's words for its limits, and ours
    (re.compile(r"Current row has (\d+) items; max is (\d+)"),
     "the format allows too many ways to go on at one point ({0} open alternatives, the grammar engine's limit {1}): "
     "make fewer properties optional, or split the schema"),
    (re.compile(r"Too many items \(limit (\d+)"),
     "the format allows too many ways to go on at once (over the grammar engine's limit of {0} items): make "
     "fewer properties optional, or split the schema"),
    (re.compile(r"initial lexer configuration \(grammar\) too big \(limit for this grammar: (\d+)\)"),
     "the format is too big for the grammar engine to start (its first lexer state needs over {0} steps): "
     "fewer properties, patterns or alternatives"),
    (re.compile(r"fuel exhausted"),
     "the format needs more work for one token than the grammar engine allows: simpler patterns"),
)
# JSON mode, as OpenAI's `json_object`: an object at the top, written under schema.writing_schema's bounds (its
# values shallow, numbers within ±10^15 with at most 6 decimals, strings of at most 256 characters, arrays of at
# most 24 items), so a small model cannot write digits to max tokens, as any JSON value had let it
JSON_MODE: dict[str, Any] = {"type": "object"}
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[(.*)\]')
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (.*)")

_tokenizers: weakref.WeakKeyDictionary[LlamaSession, LLTokenizer] = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def tokenizer_for(session: LlamaSession) -> LLTokenizer:
    """LLGuidance's tokenizer for the loaded model, built on first use; both ends of a reply (EOS and
    end-of-turn) count as its end."""
    with _tokenizers_lock:
        tokenizer = _tokenizers.get(session)
        if tokenizer is None:
            vocab = session.vocab
            ends = [t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if t >= 0]
            with warnings.catch_warnings():  # it calls a deprecated llama_cpp function once per token
                warnings.simplefilter("ignore", DeprecationWarning)
                tokenizer = _tokenizers[session] = lltokenizer_from_vocab(vocab, eos_token=ends or None)
        return tokenizer


@dataclass(frozen=True, slots=True)
class Compiled:
    """A format as LLGuidance's grammar. `note`: what of a schema is not enforced while writing (checked
    when the reply is done), and where its lengths could not be bounded; `schema`: the schema a finished
    reply is validated against."""

    grammar: str
    note: str = ""
    schema: dict[str, Any] | None = None


def compile_format(tokenizer: LLTokenizer, output: OutputFormat) -> Compiled:
    """The grammar for a constrained `output`, or a one-line FormatError."""
    if output.kind == "lark":
        grammar = llguidance.grammar_from("lark", output.source)
        _refused(grammar, tokenizer, "the tool call grammar cannot be used")
        return Compiled(grammar)
    if output.kind == "grammar":
        try:
            grammar = llguidance.grammar_from("gbnf", output.source)
        except ValueError as error:
            raise FormatError(f"the grammar does not parse: {_cause(str(error))}") from None
        _refused(grammar, tokenizer, "the grammar does not parse")
        return Compiled(grammar)
    schema = json.loads(output.source) if output.kind == "json_schema" else JSON_MODE
    writing = writing_schema(schema)
    unbounded = unnarrowed(schema)
    bounds = f"no length bounds added while writing ({unbounded}): a reply may run to max tokens" if unbounded else ""
    grammar = LLMatcher.grammar_from_json_schema(writing, defaults=JSON_OPTIONS)
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer, limits=LIMITS)
    if not failed:
        return Compiled(grammar, bounds, schema if output.kind == "json_schema" else None)
    lenient = LLMatcher.grammar_from_json_schema(writing, defaults=JSON_OPTIONS, overrides={"lenient": True})
    failed_again, dropped = LLMatcher.validate_grammar_with_warnings(lenient, tokenizer, limits=LIMITS)
    if failed_again:
        raise FormatError(_refusal(schema, messages[0]))
    dropped_note = "; ".join(dict.fromkeys(_approximation(schema, message) for message in dropped))
    note = f"not enforced while writing, checked when the reply is done: {dropped_note}"
    return Compiled(lenient, "; ".join(filter(None, (note, bounds))), schema)


def _refused(grammar: str, tokenizer: LLTokenizer, prefix: str) -> None:
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer, limits=LIMITS)
    if failed:
        raise FormatError(f"{prefix}: {_cause(messages[0])}")


def _cause(message: str) -> str:
    """LLGuidance's message in one line: a limit of its own in our words with its figures, a regex's caret
    drawing dropped, the reason kept."""
    for pattern, said in _OVER_LIMIT:
        if found := pattern.search(message):
            return said.format(*(f"{int(figure):,}" for figure in found.groups()))
    message = message.removeprefix("Failed to convert the grammar from GBNF to Lark: ")
    if "regex parse error" in message:
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        reason = next((line.removeprefix("error: ") for line in lines if line.startswith("error:")), lines[-1])
        return f"pattern {lines[1]!r}: {reason}" if len(lines) > 1 else reason
    return one_line(message)


def _refusal(schema: dict[str, Any], message: str) -> str:
    """Why a schema cannot be enforced, with where: `$.spec.template: …`."""
    cause = _cause(message)
    if "regex parse error" in message:
        pattern = message.splitlines()[1].strip() if len(message.splitlines()) > 1 else None
        where = next((path for path in (locate(schema, "pattern", pattern), locate(schema, "patternProperties"))
                      if path != "$"), "$") if pattern else "$"
    elif "min/maxProperties" in message:
        where = _either(schema, "minProperties", "maxProperties")
    else:
        where = "$"
    return f"the JSON schema cannot be enforced: {where}: {cause}"


def _either(schema: dict[str, Any], *keywords: str) -> str:
    return next((path for path in (locate(schema, keyword) for keyword in keywords) if path != "$"), "$")


def _approximation(schema: dict[str, Any], message: str) -> str:
    """One warning of a lenient compile as `"uniqueItems" at $.tags`."""
    if found := _UNIMPLEMENTED.search(message):
        keys = [key.strip().strip('"') for key in found.group(1).split(",")]
        return " and ".join(f'"{key}"' for key in keys) + f" at {locate(schema, keys[0])}"
    if found := _UNKNOWN_FORMAT.search(message):
        return f'format "{found.group(1)}" at {locate(schema, "format", found.group(1))}'
    if "oneOf" in message:
        return f'"oneOf" (as "anyOf") at {locate(schema, "oneOf")}'
    if "min/maxProperties" in message:
        return f'"minProperties"/"maxProperties" at {_either(schema, "minProperties", "maxProperties")}'
    return one_line(message)


class FormatStuck(FormatError):
    """The grammar engine allows no token at this point of a reply (a limit of its own reached, or a rule
    that leads nowhere): the reply ends there, flagged incomplete, with what it wrote so far."""

    def __init__(self, cause: str) -> None:
        why = _cause(cause.splitlines()[0]) if cause.strip() else "does a rule only refer to itself?"
        super().__init__(f"the output format allowed no next token there: {why}")


class Constraint:
    """One reply's matcher: the check-first draw, the accepts, and the mask it shows. Worker thread only."""

    def __init__(self, session: LlamaSession, output: OutputFormat, opening: frozenset[int] = frozenset()) -> None:
        self.session = session
        self.kind = output.kind
        # Tokens the reply may start with outside the format: the one that opens its thinking (Qwen3 opens it
        # itself), which the format does not govern; taken, they leave the matcher at its start.
        self._opening = opening
        tokenizer = tokenizer_for(session)
        self.compiled = compile_format(tokenizer, output)
        self.matcher = new_matcher(tokenizer, self.compiled.grammar)
        self._ends = np.asarray(tokenizer.eos_tokens, dtype=np.int64)
        self._vocabulary = np.arange(session.n_vocab, dtype=np.int32)
        self._candidates = Candidates(self._vocabulary, np.zeros(session.n_vocab, dtype=np.float32))
        self._masked = Candidates(self._vocabulary, np.zeros(session.n_vocab, dtype=np.float32))
        self._bitmask = allocate_token_bitmask(1, tokenizer.vocab_size)
        self._allowed: np.ndarray | None = None  # the mask at this position, once computed
        self.spent_s = 0.0  # the format's own time this reply: checks, masks, accepts, draws again

    def allows(self, token: int) -> bool:
        """The fast check of one token. The end of the reply only where what was written is complete."""
        if token in self._opening:
            return True
        if token in self._ends:
            return self.matcher.is_accepting()
        return self.matcher.validate_tokens([token]) == 1

    def allowed(self) -> np.ndarray:
        """Which tokens the format allows next, one bool per token of the vocabulary; computed once a position."""
        if self._allowed is None:
            self._allowed = mask_of(self.matcher, self._bitmask, self.session.n_vocab)
            self._allowed[self._ends] = self.matcher.is_accepting()
            self._allowed[list(self._opening)] = True
        return self._allowed

    def draw(self, chain: Chain, logits: np.ndarray) -> int:
        """The chain's pick from `logits` within the format, recorded in the chain; `accept` records it in
        the matcher, once the inspector has read the mask (`judge`)."""
        token = chain.apply(self._candidates.refill(self._vocabulary, logits))
        started = time.perf_counter()
        if not self.allows(token):
            ids = np.flatnonzero(self.allowed())
            if not len(ids):
                raise FormatStuck(_cause(self.matcher.get_error()) if self.matcher.is_error() else "")
            masked = self._masked.refill(ids, logits[ids])
            token = chain.apply(masked)
            if masked.selected_logit == -np.inf or not self.allows(token):
                raise FormatError("nothing the format allows is left to draw: a logit bias may ban it")
        chain.accept(token)
        self.spent_s += time.perf_counter() - started
        return token

    def accept(self, token: int) -> None:
        """Record `token`, one `draw` returned (it checked it), in the matcher."""
        started = time.perf_counter()
        if token not in self._opening:
            self.matcher.consume_token(token)
        self._opening = frozenset()  # only the reply's first token may open it
        self._allowed = None
        self.spent_s += time.perf_counter() - started

    def accept_given(self, tokens: Sequence[int]) -> None:
        """A branch's given tokens, checked one by one before any is written."""
        for token in tokens:
            if not self.allows(token):
                piece = self.session.piece(token).decode("utf-8", errors="replace")
                raise FormatError(f"the output format does not allow {piece!r} there")
            self.accept(token)

    def judge(self) -> tuple[np.ndarray, bool]:
        """For the inspector, before `accept`: which tokens the format allows at the position just drawn
        (the whole vocabulary), and whether it left one choice of what comes next (forced bytes, or only
        the end of the reply)."""
        started = time.perf_counter()
        allowed = self.allowed()
        forced = bool(self.matcher.compute_ff_bytes()) or self.matcher.is_stopped()
        self.spent_s += time.perf_counter() - started
        return allowed, forced

    def can_end(self) -> bool:
        """Whether what was written so far is complete: the format would let the reply end here."""
        return self.matcher.is_accepting()

    def verdict(self, ended: bool, answer: str) -> tuple[bool, str]:
        """Whether a finished reply is to be flagged incomplete, and the note that says why: where a JSON
        reply was cut off, or why a complete one does not validate (what the matcher could not enforce)."""
        if not ended and not self.can_end():
            return True, f"the JSON stopped at {path_at(answer)}" if self.kind in ("json", "json_schema") else ""
        if self.compiled.schema is not None:
            problem = violation(self.compiled.schema, answer)
            return bool(problem), problem
        return False, ""


def new_matcher(tokenizer: LLTokenizer, grammar: str) -> LLMatcher:
    """A matcher at the start of a reply, or a one-line FormatError where it cannot start or where no text
    at all is allowed (a rule or a `$ref` that only refers to itself)."""
    matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=LIMITS)
    if matcher.is_error():
        raise FormatError(f"the output format cannot be used: {_cause(matcher.get_error())}")
    allowed = mask_of(matcher, allocate_token_bitmask(1, tokenizer.vocab_size), tokenizer.vocab_size)
    allowed[tokenizer.eos_tokens] = False
    if not matcher.is_accepting() and not allowed.any():
        raise FormatError("the output format allows no text at all: does a rule or a $ref only refer to itself?")
    return matcher


def mask_of(matcher: LLMatcher, bitmask: np.ndarray, n_vocab: int) -> np.ndarray:
    """The matcher's next-token mask as one bool per token (a new array)."""
    fill_next_token_bitmask(matcher, bitmask)
    return np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:n_vocab].view(bool)


def check_format(session: LlamaSession, output: OutputFormat) -> str:
    """Raises the FormatError a reply in `output` would end with (a grammar that does not parse, a schema
    that cannot be enforced), before any reply starts; returns what of it is only checked afterwards."""
    if not output.constrained:
        return ""
    tokenizer = tokenizer_for(session)
    compiled = compile_format(tokenizer, output)
    new_matcher(tokenizer, compiled.grammar)
    return compiled.note
