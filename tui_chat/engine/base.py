"""What every backend speaks: requests in, events out. No UI and no llama.cpp here.

A generation is a `Stream` of events produced on the backend's own worker thread; the consumer
drains it in batches (`Stream.drain`) so a UI never takes one message per token.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, Self, runtime_checkable

from .formats import KINDS, TEXT, OutputFormat
from .params import LiveParams, SamplingParams, label

Role = Literal["system", "user", "assistant", "tool"]
# context: the KV cache is full; cut: the server ended it unasked (llama-cpp-python's, for another request);
# format: the output format's engine allowed no next token (a limit of its own reached)
StopReason = Literal["eos", "stop", "length", "context", "cancelled", "cut", "format"]
PREFILL_RATE_MIN_TOKENS = 8  # below this a prompt-reading rate says nothing


class EngineError(Exception):
    """A failure the user must read: the message is one clear line, never a traceback."""


@dataclass(frozen=True, slots=True)
class EngineDeath:
    """The engine process ended under a job, as facts: what ended it (its signal, what it was doing, llama.cpp's
    last words), and its log ("" where it wrote nothing: killed). No advice: what happens next is each
    front-end's to say (the chat keeps the chat, `run` exits, `serve` loads again for its clients)."""

    cause: str
    log: str = ""

    def said(self, then: str) -> str:
        """In a front-end's words: the cause, `then` (what that front-end does now), and where the log is."""
        details = f"; details in {self.log}" if self.log else ""
        return f"{self.cause}; {then}{details}" if then else f"{self.cause}{details}"


class InputRefused(EngineError):
    """An input the engine will not take (a text longer than it reads at once, or one of no tokens): the caller's to
    fix, not a failure of the engine. One line, which says the limit."""


class EngineDied(EngineError):
    """A call that found the engine process dead (or saw it die): the facts ride along for the front-end."""

    def __init__(self, death: EngineDeath) -> None:
        super().__init__(death.said(""))
        self.death = death


@dataclass(frozen=True, slots=True)
class Message:
    """`reasoning`: an assistant reply's thinking, kept apart from its answer (`content`); templates that
    show earlier thinking read it as `reasoning_content`, as transformers' and llama.cpp's do."""

    role: Role
    content: str
    reasoning: str = ""
    # An assistant step that called tools, in transformers' form ({"id", "type": "function", "function": {"name",
    # "arguments"}}); a `tool` message is the result of the call `tool_call_id` names.
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str = ""


@dataclass(slots=True)
class Request:
    messages: list[Message]
    params: LiveParams = field(default_factory=LiveParams)
    top_logprobs: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    # A branch: the tokens the reply must start with (those kept before the cut, then the chosen
    # alternative). The engine rewinds its KV cache to them instead of reading the chat again.
    forced: tuple[int, ...] = ()
    # Their text, one each: a server continues a reply from text (it may not have sent ids: then they are -1).
    forced_text: tuple[str, ...] = ()
    continuing: bool = False  # the forced tokens are a whole reply going on: max tokens counts after them
    # The chat this turn belongs to (the history's ID; "" when none): the KV state saved after the reply
    # is filed under it, so deleting the chat can delete it.
    conversation: str = ""
    # Each drawn token carries its X-ray (`Token.stages`); costs a pass of the chain per token.
    xray: bool = False
    format: OutputFormat = TEXT  # free text, JSON, a JSON schema or a grammar (formats.py)
    # The chat's thinking switch: passed to templates that take one (`enable_thinking`); off, a thinking
    # block the model opens anyway is ended at once. How long it may think is `params.thinking_budget`.
    thinking: bool = True
    # Tools the chat template is given, in transformers' JSON-schema form ({"type": "function", "function":
    # {"name", "description", "parameters"}}); none: the template renders as for a chat without tools.
    tools: tuple[dict[str, Any], ...] = ()
    # How the model may call them (auto, none, required or a tool's name): a server is sent it as `tool_choice`;
    # the in-process engine is held to it by the calls' grammar (`format`) instead.
    tool_choice: str = "auto"
    # A plain completion (`serve`'s /v1/completions): this text is the whole prompt, read as it is, no template.
    text_prompt: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What llama.cpp allocated on one device as it loaded (its own log of each buffer, in bytes): the weights, the
    KV cache (all its cells: the panel's KV bar says how many are filled), the compute and output buffers; and
    what the device had left after, where it says (a GPU; None for the CPU's memory)."""

    device: str
    weights: int = 0
    kv: int = 0
    compute: int = 0
    free: int | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    path: str
    description: str
    quantization: str
    size_bytes: int
    n_params: int
    n_layers: int
    gpu_layers: int
    n_ctx: int
    n_ctx_train: int
    chat_format: str
    backend: str = "llama"
    remote_host: str = ""  # host:port of the server a remote backend talks to
    params_per_token: bool = True  # False: sampling changes apply from the next reply on
    ignored_params: tuple[str, ...] = ()  # sampling settings this backend cannot pass on
    ignored_formats: tuple[str, ...] = ()  # output formats (`OutputFormat.kind`) it cannot be asked for
    notes: tuple[str, ...] = ()  # where it reads a setting or a format otherwise than tui-chat, a line each
    cpu: str = ""  # the CPU path llama.cpp runs on, e.g. "AVX-512 · AMX off (self-test crashed)"
    threads: int = 0  # decode threads when it loaded (they follow the load: TurnMetrics.threads)
    thinking: str = ""  # the thinking markers recognised, e.g. "<think>…</think>" ("" where it cannot tell)
    thinking_switch: bool = False  # its chat template takes `enable_thinking`
    draft: str = ""  # speculative decoding's drafter: "ngram" or the draft model's file name ("" none)
    tool_syntax: str = ""  # how its chat template writes tool calls (prompts.CALL_SYNTAXES); "": it takes no tools
    call_tokens: tuple[tuple[str, int], ...] = ()  # that syntax's markers that are one token each, and their ids
    memory: tuple[DeviceMemory, ...] = ()  # where the model, its KV cache and its buffers sit (a local model)

    @property
    def server_facts(self) -> tuple[str, ...]:
        """What the model info says of a backend that takes settings or formats otherwise than tui-chat, a
        line each: the settings it is not sent, the output formats it cannot be asked for, and its notes."""
        lines = [f"Not sent: {', '.join(label(name) for name in self.ignored_params)}"] if self.ignored_params else []
        if self.ignored_formats:
            lines.append(f"No {' or '.join(KINDS[kind] for kind in self.ignored_formats)} output")
        return (*lines, *(note[:1].upper() + note[1:] for note in self.notes))

    @property
    def offload(self) -> str:
        if self.remote_host:
            return f"server {self.remote_host}"
        if self.gpu_layers <= 0:
            return f"CPU {self.cpu}" if self.cpu else "CPU"
        return f"GPU {self.gpu_layers}/{self.n_layers} layers"


@dataclass(frozen=True, slots=True)
class TurnMetrics:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    context_tokens: int = 0
    n_ctx: int = 0
    dropped_turns: int = 0  # oldest turns left out of the prompt to fit the context
    server_decode_tok_s: float | None = None  # a server's own decode rate, where it reports one
    threads: int = 0  # CPU threads decoding at the end of the turn (0: not a local CPU model)
    restored_tokens: int = 0  # prompt tokens taken from a KV state saved on disk (counted in cached_tokens too)
    restore_s: float = 0.0  # finding, checking and loading that state
    restore_avoided_s: float | None = None  # how long reading those tokens would have taken, at the measured rate
    grammar_s: float = 0.0  # time an output format's grammar took (checks, masks, draws again)
    reasoning_tokens: int = 0  # of completion_tokens, those the model drew while it was thinking
    thinking_s: float | None = None  # from the first reply token to the end of the thinking; None: no thinking
    # prompt_tokens is the client's estimate (4 characters a token, or the server's tokenizer on the messages):
    # the server has not reported it (yet)
    prompt_estimated: bool = False
    # of completion_tokens, those a server wrote but never sent (the stop sequence it ended on): not timed here
    withheld_tokens: int = 0
    # of completion_tokens, those a server sent no record of (in a reply that did not end on a stop sequence):
    # llama-server holds back tokens that might begin one, then sends them merged into the next token's chunk
    # under its record, or, at max tokens, not at all
    unrecorded_tokens: int = 0
    # speculative decoding (local/draft.py): the drafter ("" none), the tokens it guessed, those the model kept,
    # and the batches that checked them; plain decoding's time per token as measured with this model
    draft_kind: str = ""
    drafted: int = 0
    draft_accepted: int = 0
    verifications: int = 0
    plain_ms_per_token: float | None = None
    # A reply that called tools (tools/loop.py): the tokens the model drew writing its calls, in the steps before
    # the one these figures are of; and the prompt tokens the calls' results added to the steps after them
    tool_call_tokens: int = 0
    tool_result_tokens: int = 0
    consent_s: float = 0.0  # time the reply waited for the user's yes to its calls (no model time: in no figure above)
    reload_s: float = 0.0  # the model loading again first, after its engine process died (not in ttft_s)
    # ttft_s in its parts, where the engine times them (a local model): waiting for the worker, the chat template,
    # tokenising, matching the cached prefix (restore_s and prefill_s are parts too), and the first draw
    queued_s: float = 0.0
    template_s: float = 0.0
    tokenize_s: float = 0.0
    prefix_s: float = 0.0
    first_draw_s: float = 0.0
    sampling_path: str = ""  # where a local reply's tokens are drawn now: "llama.cpp" (in its graph) or "python"

    @property
    def output_tokens(self) -> int:
        """What a paid API bills as this reply's output: its own tokens and the calls it wrote before them."""
        return self.completion_tokens + self.tool_call_tokens

    @property
    def answer_tokens(self) -> int:
        return self.completion_tokens - self.reasoning_tokens

    @property
    def read_tokens(self) -> int:
        """Prompt tokens evaluated this turn (the rest came from the cache)."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def prefill_tok_s(self) -> float | None:
        """None for a read of a few tokens: one token's time is a decode step, not a prompt-reading rate."""
        evaluated = self.read_tokens
        return evaluated / self.prefill_s if self.prefill_s > 0 and evaluated >= PREFILL_RATE_MIN_TOKENS else None

    @property
    def grammar_ms_per_token(self) -> float | None:
        """An output format's cost per drawn token; None without one."""
        return self.grammar_s * 1000 / self.completion_tokens if self.grammar_s and self.completion_tokens else None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first, over the time since the first: the first one comes from prefill. Only the
        tokens that time covers: a server's withheld ones came after the last one timed."""
        steps = self.completion_tokens - self.withheld_tokens - 1
        return steps / self.decode_s if self.decode_s > 0 and steps > 0 else None

    @property
    def acceptance(self) -> float | None:
        """The share of the drafted tokens the model kept; None where nothing was drafted."""
        return self.draft_accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_verification(self) -> float | None:
        """Tokens each verification batch gave: the guesses kept and the one drawn after them."""
        return (self.draft_accepted + self.verifications) / self.verifications if self.verifications else None

    @property
    def draft_speedup(self) -> float | None:
        """This reply's decode rate against plain decoding's measured with the same model; None without a draft."""
        rate = self.decode_tok_s
        if not self.draft_kind or not self.plain_ms_per_token or rate is None:
            return None
        return rate * self.plain_ms_per_token / 1000

    def as_dict(self) -> dict[str, float | int | None]:
        """Every field, and the rates a stored reply's footer reads: what the history and `run --json` keep."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s,
            "grammar_ms_per_token": self.grammar_ms_per_token}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Self:
        """A stored reply's figures; those it was stored without keep their defaults."""
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


@dataclass(frozen=True, slots=True)
class Candidate:
    token_id: int
    text: str
    prob: float
    allowed: bool | None = None  # under an output format: whether the grammar allowed it; None: no format


@dataclass(frozen=True, slots=True)
class GrammarMask:
    """What an output format's grammar did at one token, judged over the whole vocabulary: the probability
    mass it forbade, how many tokens it allowed, and whether it left one choice (`forced`: the text that
    comes next is fixed, or only the end of the reply is allowed; tokens may split the text differently)."""

    removed: float
    allowed: int
    forced: bool


@dataclass(frozen=True, slots=True)
class PoolCut:
    """How many candidates each sampling cut left, in the order llama.cpp applies them.
    None: more than the engine scanned (only possible with top-k off)."""

    top_k: int | None
    top_p: int | None
    min_p: int | None


@dataclass(frozen=True, slots=True)
class Stage:
    """One element of the sampler chain as it acted on one token: how many candidates it left, the
    share of the raw distribution they hold, and the drawn token's rank and probability among them
    (both None when this stage removed it). `note` says what the figures assume, where they guess."""

    name: str
    label: str
    kept: int
    mass: float
    rank: int | None
    prob: float | None
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "kept": self.kept, "mass": self.mass, "rank": self.rank, "prob": self.prob}


@dataclass(frozen=True, slots=True)
class XRay:
    """Why a token was drawn: its rank and probability under the raw distribution, the chain stage by
    stage, and a one-line verdict. `elapsed_s`: what computing it took (recompute included)."""

    token_id: int
    piece: str
    prob: float
    rank: int
    stages: tuple[Stage, ...]
    verdict: str
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class WordProbability:
    """The exact probability of `text` at a position: the product of its tokens' conditional
    probabilities (`tokens`, each with its own), under the raw distribution. `rank`: where its first
    token stands among all the vocabulary's (1 = likeliest)."""

    text: str
    tokens: tuple[Candidate, ...]
    prob: float
    rank: int


@dataclass(frozen=True, slots=True)
class LoadProgress:
    fraction: float
    stage: str = ""  # what the load is doing besides reading weights


@dataclass(frozen=True, slots=True)
class Loaded:
    info: ModelInfo


@dataclass(frozen=True, slots=True)
class PromptProgress:
    done: int
    total: int
    elapsed_s: float
    prompt_ids: tuple[int, ...] = ()  # on the first one: the prompt the reply follows (as Done.prompt_ids)

    @property
    def eta_s(self) -> float | None:
        if self.done <= 0 or self.elapsed_s <= 0:
            return None
        return (self.total - self.done) * self.elapsed_s / self.done


@dataclass(frozen=True, slots=True)
class Token:
    """One sampled token. `text` is what became visible with it (may be empty while a stop sequence
    or a split UTF-8 character is pending). `params_version` names the settings it was drawn with.
    With top_logprobs on (and only then, to keep the per-token path lean): the token's own text (a
    character split across tokens belongs to the one that completes it), its
    probability under the raw distribution, the likeliest candidates and where the settings cut the pool.
    A `forced` token was given by the request (a branch), not drawn: it carries no probabilities.
    With `Request.xray`: the chain stage by stage for this token (`stages`). Under an output format,
    with top_logprobs on: what its grammar masked (`grammar`; the candidates say which it forbade).

    Reasoning: `reasoning` is the thinking text that became visible with it (as `text` is the answer's);
    `thinking` says the token belongs to the thinking as far as was known when it came (the final word is
    `Done.answer_from`). A `special` one is no text (its `piece` is empty): its name is for the inspector.
    An `inserted` token was written by the engine, not drawn: the end of the thinking,
    once its budget was spent (its probabilities, when recorded, are what the model gave it there).
    With speculative decoding, a `drafted` token was guessed and then drawn by the model all the same (so
    it is exactly what it would have been); `rejected` names the guess a correction replaced.
    A backend whose server sends the thinking apart (`reasoning_content`) emits the same: tokens with
    `reasoning` and `thinking` set, then the answer's."""

    token_id: int
    text: str
    at: float
    params_version: int
    piece: str = ""
    prob: float | None = None
    top: tuple[Candidate, ...] = ()
    pool: PoolCut | None = None
    forced: bool = False
    stages: tuple[Stage, ...] = ()
    grammar: GrammarMask | None = None
    reasoning: str = ""
    thinking: bool = False
    inserted: bool = False
    special: str = ""  # a token that is not text (end of text, a control or media token): its name, e.g. <eos>
    drafted: bool = False  # speculative decoding guessed it and the model's own draw kept it
    rejected: str = ""  # the guess the model's draw replaced here (this token is the correction)

    def is_candidate(self, candidate: Candidate) -> bool:
        """Whether `candidate` is this token: by id, or by text where a server sent no ids (-1)."""
        if self.token_id >= 0 and candidate.token_id >= 0:
            return candidate.token_id == self.token_id
        return candidate.text == self.piece


@dataclass(frozen=True, slots=True)
class Metrics:
    metrics: TurnMetrics


@dataclass(frozen=True, slots=True)
class Done:
    """`incomplete`: under an output format, the reply stopped (max tokens, a stop sequence, cancel)
    before its grammar was satisfied, so e.g. its JSON does not parse.

    `text` is the answer as it enters the conversation; `reasoning` the thinking before it (the markers
    and the whitespace around it left out). The reply's first `answer_from` tokens are the thinking's.
    `prompt_ids`: the prompt the reply follows; a branch's given tokens (`Request.forced`) are the
    reply's first tokens, not part of it, so token i of the reply came after `prompt_ids + tokens[:i]`."""

    stop_reason: StopReason
    text: str
    metrics: TurnMetrics
    prompt_ids: tuple[int, ...] = ()
    incomplete: bool = False
    reasoning: str = ""
    answer_from: int = 0
    note: str = ""  # what the user should check that the reply itself does not say (a server's empty reply)
    stop_sequence: str = ""  # the one it ended on (stop_reason "stop"), where known
    tool_calls: tuple[ToolCall, ...] = ()  # the tools it called before this answer, in order (tools/loop.py)
    # The calls a server said this reply makes (streamed `tool_calls`), in OpenAI's form: {"id", "type",
    # "function": {"name", "arguments"}}, the arguments as the text it sent (untrusted: checked before use).
    server_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ColumnEvent:
    """One column's `Token`, `Metrics` or `Done` in the sampling lab (`column`: its place among the settings
    compared). A lab's tokens carry their probability under the raw distribution (`prob`) even with the
    inspector off: the lab marks where columns diverge and how surprised each was by what it drew."""

    column: int
    event: Token | Metrics | Done


@dataclass(frozen=True, slots=True)
class LabDone:
    """The end of a lab: each column's `Done`, in order, and how many times the prompt they share was read
    (None: a server did not say). `parallel`: the columns were decoded at the same time; where not, or where
    a server cut one short, `note` says so in one line."""

    columns: tuple[Done, ...]
    prompt_reads: int | None
    parallel: bool = True
    note: str = ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call a reply made and what came of it. `approved` False: it did not run (the user said no, or
    nobody was asked, as in `run` without --approve). `result` is the tool's whole text (terminal escapes made
    visible); the model read at most its first part, and `cut` says how many characters it did not.
    `error`: why there is no result (denied, failed, timed out, the tool's own error). `before` and `reasoning`:
    the text and the thinking the model wrote before the call in the step that made it (kept, shown and read again
    on later turns); `tokens`: that step's tokens, call included, for the heatmap and the inspector (this session
    only: the history keeps text, not probabilities)."""

    server: str
    name: str
    arguments: dict[str, Any]
    approved: bool = False
    result: str | None = None
    error: str | None = None
    ms: float | None = None  # how long the call took; None: it did not run
    cut: int = 0
    before: str = ""
    reasoning: str = ""
    tokens: tuple[Token, ...] = field(default=(), compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """What `run --json` prints for it, and the history keeps."""
        return {"server": self.server, "name": self.name, "arguments": self.arguments, "approved": self.approved,
                "result": self.result, "error": self.error, "ms": self.ms, "cut": self.cut, "before": self.before,
                "reasoning": self.reasoning}


@dataclass(frozen=True, slots=True)
class ToolActivity:
    """A reply's tool call as it goes: `asked` (the model wrote it; consent is being sought), `running`, then
    `done` (its `ToolCall` complete). Sessions go on without it; a view shows it."""

    call: ToolCall
    stage: Literal["asked", "running", "done"]


@dataclass(frozen=True, slots=True)
class Error:
    """`text` (and `reasoning`): the part of a reply written before the failure (a remote stream cut mid-reply)."""

    message: str
    text: str = ""
    reasoning: str = ""
    tools_refused: bool = False  # a server refused a request for carrying tools: it cannot take them
    code: str = ""  # a request refused before any work, in OpenAI's words (e.g. context_length_exceeded)
    died: EngineDeath | None = None  # the engine process died under it (`message` is then its cause)


@dataclass(frozen=True, slots=True)
class Embedded:
    """Texts' pooled embeddings (`Embedding.embed`), a row each, L2-normalised: `size` float32s a row, little-endian,
    as bytes (a quarter of a pickled tuple of floats, and base64's payload as it is). `tokens`: each text's count."""

    model: str
    size: int
    data: bytes
    tokens: tuple[int, ...]

    def row(self, index: int) -> bytes:
        width = self.size * 4
        return self.data[index * width : (index + 1) * width]

    def vector(self, index: int) -> list[float]:
        floats = array("f", self.row(index))
        if sys.byteorder == "big":
            floats.byteswap()
        return floats.tolist()


def written(final: Done | Error) -> bool:
    """Whether a reply that ended wrote anything to keep: answer or thinking."""
    return bool((final.text + final.reasoning).strip())


Event = (LoadProgress | Loaded | PromptProgress | Token | Metrics | Done | Error | XRay | WordProbability
         | ToolActivity | ColumnEvent | LabDone)
FINAL_EVENTS = (Loaded, Done, Error, XRay, WordProbability, LabDone)


class Stream:
    """Events of one job, produced on the worker thread and drained by any other thread."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Event | list[Event]] = queue.SimpleQueue()
        self.cancelled = threading.Event()
        self.finished = False

    def put(self, event: Event) -> None:
        self._queue.put(event)

    def put_batch(self, events: list[Event]) -> None:
        """A batch from the engine process, kept one item: the reader drains it whole, as it came."""
        self._queue.put(events)

    def cancel(self) -> None:
        self.cancelled.set()

    def drain(self, timeout: float | None = None) -> list[Event]:
        """Everything queued now; waits up to `timeout` for the first event. Empty once finished."""
        if self.finished:
            return []
        events: list[Event] = []
        try:
            item = self._queue.get(timeout=timeout)
            while True:
                if isinstance(item, list):
                    events += item
                else:
                    events.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        if any(isinstance(e, FINAL_EVENTS) for e in events):
            self.finished = True
        return events

    def __iter__(self) -> Iterator[Event]:
        while not self.finished:
            yield from self.drain(timeout=None)

    def result(self) -> Event:
        """Block until the job ends; returns its final event (Loaded, Done, XRay, WordProbability, LabDone or
        Error)."""
        final: Event | None = None
        for event in self:
            if isinstance(event, FINAL_EVENTS):
                final = event
        assert final is not None
        return final


class Backend(Protocol):
    """What the UI and the headless runner use; the in-process engine and remote servers implement it."""

    info: ModelInfo | None

    def load(self) -> Stream: ...

    def generate(self, request: Request) -> Stream: ...

    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class WatchesItsDeath(Protocol):
    """A backend in a process of its own: told, on another thread, when that process dies between jobs (a job
    open at the time ends with the line itself)."""

    on_idle_death: Callable[[EngineDeath], None] | None


@runtime_checkable
class FormatChecking(Backend, Protocol):
    """A backend that enforces output formats itself (the in-process engine): it can refuse one before a
    reply starts, and say what of one it only checks when the reply is done."""

    def check_format(self, output: OutputFormat) -> str: ...


@runtime_checkable
class Comparing(Backend, Protocol):
    """A backend that decodes several sampling settings over one read of a prompt: the sampling lab."""

    def compare(self, request: Request, columns: Sequence[LiveParams]) -> Stream: ...


@runtime_checkable
class Serving(Backend, Protocol):
    """Answers several requests at once (`tui-chat serve`), each using at most `room` tokens of context."""

    def generate_together(self, request: Request, room: int) -> Stream: ...

    def tokenize(self, text: str) -> list[int]: ...


@runtime_checkable
class Recomputing(Backend, Protocol):
    """A backend that recomputes a position's logits on demand: the in-process engine (no server offers it)."""

    def xray(self, context: Sequence[int], token: int, params: SamplingParams) -> Stream: ...

    def word_probability(self, context: Sequence[int], text: str) -> Stream: ...


@runtime_checkable
class Embedding(Backend, Protocol):
    """Pooled embeddings of texts (`tui-chat serve`'s /v1/embeddings), read in a llama.cpp context of their own: the
    chats and the serving slots are not touched. A text longer than the model reads at once is an `InputRefused`."""

    def embed(self, texts: Sequence[str]) -> Embedded: ...
