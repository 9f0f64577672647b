"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`, `/api/version`) over the
same engine requests as OpenAI's: a chat or a templated generation is read as a `/v1/chat/completions` body
(protocol.parse_chat: its conversation, tools, format and sampling checked there), a `raw` generation as a
`/v1/completions` one, so that a conversation gets the same reply on either endpoint; the engine's events
become Ollama's NDJSON lines (its default, `stream` left out) or its whole reply, and a refusal Ollama's
`{"error": "…"}`, the field named in its message.

Where Ollama and tui-chat differ, Ollama's meaning is kept: sampling comes in `options` (`num_predict` the
reply's limit: -1 and -2 the slot's end), the durations are nanoseconds, `tool_calls` carry their arguments as
an object, and a reply that called a tool ends `stop`. What a served model cannot do is refused, naming the
field: images, a `template` or `context` of the client's, `suffix` (fill-in-the-middle), a `num_ctx` past the
request's share of the context (below it, the slot's context stays as it is). Ollama's model management (pull,
push, create, copy, delete) is refused: this server serves the model it was started with. Other options
Ollama knows (`num_thread`, `num_gpu`, `keep_alive`…) are ignored, as Ollama ignores those it cannot apply.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from ..engine.base import Done, Embedded, ModelInfo, Token
from ..engine.params import SamplingParams
from ..engine.templates import NAMED_TEMPLATES
from ..gguf import GgufProblem, UnusableModel, check_model_file, read_metadata
from . import embeddings, protocol
from .embeddings import EmbeddingsAsked
from .monitor import RequestRecord
from .protocol import Asked, BadRequest, Outcome

VERSION = "0.12.0"  # the Ollama whose API this follows: clients gate features (thinking, tools) on it
TAG = ":latest"  # Ollama's tag for a name without one: listed with it, taken with it or without
# `options` that are sampling fields of the same name; `num_predict` is max_tokens, `num_ctx` is checked
OPTIONS = (*protocol.SAMPLING_FIELDS, "mirostat", "mirostat_tau", "stop")
# The shared reader's names for Ollama's fields, a longer name before its prefix
NAMES = {"response_format.json_schema.schema": "format", "response_format": "format",
         "max_tokens": "options.num_predict"} | {name: f"options.{name}" for name in OPTIONS}
LEVELS = ("low", "medium", "high")  # `think` as an effort: thinking on (its budget is the model's)
MANAGING = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")
EMBEDDING = ("/api/embed", "/api/embeddings")
POSTED = ("/api/chat", "/api/generate", "/api/show", *MANAGING, *EMBEDDING)  # POSTs routed here; GETs: all /api/
# A generation's fields refused, and why
UNSUPPORTED = {"suffix": "fill-in-the-middle is not offered here; send the prompt alone",
               "template": "the model's own chat template is used; send raw: true and the prompt as the model reads it",
               "context": "no context is returned or read back here; send the whole conversation (or use /api/chat)",
               "images": "this model reads text only"}
NEVER = "9999-12-31T23:59:59Z"  # `expires_at` of a model kept loaded until the server stops


@dataclass(frozen=True, slots=True)
class Asking:
    """A request for the engine: what it asks, the monitor's name for it, and the writer of its answer."""

    asked: Asked
    kind: str
    writer: type[WholeReply]


def answer(method: str, path: str, body: dict[str, Any], info: ModelInfo, defaults: SamplingParams,
           room: int) -> dict[str, Any] | Asking | Embedding:
    """An `/api/…` request: the facts it asks for (a JSON reply), or the engine request a chat or a generation is."""
    if method == "POST" and path in ("/api/chat", "/api/generate"):
        return _asking(path, body, info, defaults, room)
    if method == "POST" and path == "/api/show":
        check_model({"model": body.get("model", body.get("name"))}, info.name)  # `name`: older clients' field
        return show(info, defaults, room)
    if method == "GET" and path in ("/api/tags", "/api/ps"):
        return {"models": [model_entry(info, room if path == "/api/ps" else 0)]}
    if method == "GET" and path == "/api/version":
        return {"version": VERSION}
    if path in MANAGING:
        raise BadRequest(f"{path} is not supported: this server serves the one model it was started with "
                         f"({info.name!r})", status=501)
    if method == "POST" and path == "/api/embed":
        return Embedding(embeddings.parse_embeddings({"input": body.get("input"),
                                                      "dimensions": body.get("dimensions")}), embedded)
    if method == "POST" and path == "/api/embeddings":  # the older endpoint: one text, `prompt`
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt must be a non-empty string: the text to embed", "prompt")
        return Embedding(embeddings.parse_embeddings({"input": prompt}), embedded_one)
    raise BadRequest(f"no such endpoint: {method} {path[:200]}", status=404)


@dataclass(frozen=True, slots=True)
class Embedding:
    """`/api/embed` (or the older `/api/embeddings`): the texts, read as OpenAI's `input` is (`embeddings.py`; a
    text longer than the embedding context is refused, not cut: Ollama's `truncate` would embed another text),
    and the answer's shape."""

    asked: EmbeddingsAsked
    shape: Callable[[Embedded, EmbeddingsAsked, float], dict[str, Any]]


def embedded_one(vectors: Embedded, _asked: EmbeddingsAsked, _took_s: float) -> dict[str, Any]:
    """The older `/api/embeddings` answer: one vector."""
    return {"embedding": vectors.vector(0)}


def embedded(vectors: Embedded, asked: EmbeddingsAsked, took_s: float) -> dict[str, Any]:
    """Ollama's `/api/embed` answer: the vectors as lists of floats, its figures in nanoseconds."""
    return {"model": f"{vectors.model}{TAG}", "embeddings": [vectors.vector(row) for row in range(len(asked.texts))],
            "total_duration": int(took_s * 1e9), "load_duration": 0, "prompt_eval_count": sum(vectors.tokens)}


def refusal(error: BadRequest) -> dict[str, Any]:
    """A refusal as Ollama sends one: its message alone (the field it names leads it)."""
    message, param = str(error), error.param
    named = not param or error.status != 400 or message.startswith(param)
    return {"error": message if named else f"{param}: {message}"}


def check_model(body: dict[str, Any], served: str) -> None:
    """The model asked for: the one served, named with its tag or without (an unknown one is a 404)."""
    model = body.get("model")
    protocol.check_model(body | {"model": model.removesuffix(TAG)} if isinstance(model, str) else body, served)


def _asking(path: str, body: dict[str, Any], info: ModelInfo, defaults: SamplingParams,
            room: int) -> dict[str, Any] | Asking:
    """A chat or a generation as the engine's request; one with nothing to say (no messages, no prompt) is
    Ollama's way to load the model, answered at once: it is loaded."""
    check_model(body, info.name)
    chat = path == "/api/chat"
    wanted = _common(body, room)
    if chat:
        if body.get("messages") == []:
            return _loaded(info.name, chat)
        with protocol.renamed(NAMES):
            asked = protocol.parse_chat(wanted | {"messages": _conversation(body.get("messages")),
                                                  "tools": body.get("tools")}, defaults, info, room)
    else:
        for name in ("suffix", "template", "context", "images"):
            if body.get(name):
                raise BadRequest(f"{name} is not supported: {UNSUPPORTED[name]}", name)
        raw = body.get("raw", False)
        if not isinstance(raw, bool | None):
            raise BadRequest("raw must be true or false", "raw")
        messages = _prompt(body.get("prompt"), body.get("system"))
        if not messages[-1]["content"]:
            return _loaded(info.name, chat)
        with protocol.renamed(NAMES | {"messages": "prompt"}):
            asked = protocol.parse_completion(wanted | {"prompt": messages[-1]["content"]}, defaults, room) if raw \
                else protocol.parse_chat(wanted | {"messages": messages}, defaults, info, room)
    asked.chat = chat
    asked.format_field = NAMES.get(asked.format_field, asked.format_field)
    return Asking(asked, "ollama " + path.removeprefix("/api/"), StreamedReply if asked.stream else WholeReply)


def _loaded(model: str, chat: bool) -> dict[str, Any]:
    said = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {"model": tagged(model), "created_at": _stamp(), **said, "done": True, "done_reason": "load"}


def _common(body: dict[str, Any], room: int) -> dict[str, Any]:
    """What a chat and a generation share, as the shared reader's fields: `options`, `format`, `think`, `stream`
    (true when left out, as Ollama streams) and logprobs."""
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("options must be an object: temperature, top_p, num_predict…", "options")
    context = options.get("num_ctx")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= room):
        raise BadRequest(f"options.num_ctx must be a whole number from 1 to {room:,}: each request's share of the "
                         "context this server was started with (a smaller one leaves it as it is)", "options.num_ctx")
    wanted = {name: options[name] for name in OPTIONS if options.get(name) is not None}
    limit = options.get("num_predict")
    if limit is not None and limit not in (-1, -2):  # Ollama's "no limit" and "to the context's end"
        wanted["max_tokens"] = limit
    stream = body.get("stream")
    wanted["stream"] = True if stream is None else stream
    wanted |= {name: body[name] for name in ("logprobs", "top_logprobs") if body.get(name) is not None}
    return wanted | _format(body.get("format")) | _think(body.get("think"))


def _format(value: Any) -> dict[str, Any]:
    """`format`: "json" or a JSON schema (an object), as the shared reader's `response_format`."""
    if value is None or value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if not isinstance(value, dict):
        raise BadRequest('format must be "json" or a JSON schema object', "format")
    return {"response_format": {"type": "json_schema", "json_schema": {"schema": value}}}


def _think(value: Any) -> dict[str, Any]:
    """`think`: true or false, or an effort (low, medium, high: on); left out, the model's own way."""
    if value is None:
        return {}
    if not isinstance(value, bool) and value not in LEVELS:
        raise BadRequest("think must be true, false, or an effort: low, medium or high", "think")
    return {"chat_template_kwargs": {"enable_thinking": value is not False}}


def _conversation(messages: Any) -> Any:
    """Ollama's messages as chat's: a call's arguments an object (chat's: its JSON text), the thinking of an
    assistant's turn its `reasoning_content`, a tool's result named by its tool. What is not a list of messages
    goes on as it is, for the shared reader to refuse."""
    if not isinstance(messages, list):
        return messages
    read = []
    for index, entry in enumerate(messages):
        if not isinstance(entry, dict):
            read.append(entry)
            continue
        if entry.get("images"):
            raise BadRequest(f"images are not supported: {UNSUPPORTED['images']}", f"messages[{index}].images")
        message = {name: entry[name] for name in ("role", "content") if name in entry}
        if isinstance(entry.get("thinking"), str):
            message["reasoning_content"] = entry["thinking"]
        if entry.get("role") == "tool":
            message["tool_call_id"] = str(entry.get("tool_call_id") or entry.get("tool_name") or "")
        if isinstance(calls := entry.get("tool_calls"), list):
            message["tool_calls"] = [_call(call) for call in calls]
        read.append(message)
    return read


def _call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), dict):
        return call  # the shared reader refuses it, naming it
    assert isinstance(call, dict)
    return {"id": str(call.get("id", "")), "type": "function",
            "function": {"name": function.get("name"), "arguments": json.dumps(function["arguments"])}}


def _prompt(prompt: Any, system: Any) -> list[dict[str, Any]]:
    """A generation's prompt and system prompt as a conversation (the model's template reads it as a chat's)."""
    if not isinstance(prompt, str | None):
        raise BadRequest("prompt must be a string", "prompt")
    if not isinstance(system, str | None):
        raise BadRequest("system must be a string", "system")
    return [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": prompt or ""}]


# --- the model's facts ------------------------------------------------------------------------------


def model_entry(info: ModelInfo, room: int = 0) -> dict[str, Any]:
    """The model as `/api/tags` lists it; with `room` (each request's context), as `/api/ps` does."""
    name = tagged(info.name)
    entry = {"name": name, "model": name, "modified_at": _modified(info.path), "size": info.size_bytes,
             "digest": _digest(info.path), "details": _details(info)}
    if not room:
        return entry
    placed = [(memory.weights + memory.kv + memory.compute, memory.free is not None) for memory in info.memory]
    return entry | {"size": sum(size for size, _ in placed) or info.size_bytes, "expires_at": NEVER,
                    "size_vram": sum(size for size, on_gpu in placed if on_gpu), "context_length": room}


def show(info: ModelInfo, defaults: SamplingParams, room: int) -> dict[str, Any]:
    """`/api/show`: the details, the GGUF's own facts (its general and architecture keys), the chat template the
    model is read with (a named one of tui-chat's, else its own), the sampling the server answers with, and what
    the model can do."""
    metadata = _metadata(info.path)
    template = NAMED_TEMPLATES.get(info.chat_format) or metadata.get("tokenizer.chat_template")  # the one read with
    params = {"temperature": defaults.temperature, "top_k": defaults.top_k, "top_p": defaults.top_p,
              "min_p": defaults.min_p, "repeat_penalty": defaults.repeat_penalty, "num_ctx": room}
    capabilities = ["completion", "tools", *(["thinking"] if info.thinking else [])]  # any model: the generic form
    return {"license": "", "modelfile": "", "template": template if isinstance(template, str) else "",
            "parameters": "\n".join(f"{name} {value}" for name, value in params.items()),
            "details": _details(info), "modified_at": _modified(info.path), "capabilities": capabilities,
            "model_info": {key: value for key, value in metadata.items()
                           if key.startswith(("general.", f"{metadata.get('general.architecture')}."))}
            | {"general.parameter_count": info.n_params}}


def tagged(name: str) -> str:
    return name if ":" in name else name + TAG


def _details(info: ModelInfo) -> dict[str, Any]:
    family = info.description.split(" ", 1)[0]  # llama.cpp's description: architecture, size, file type
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family] if family else None,
            "parameter_size": _size(info.n_params), "quantization_level": info.quantization}


def _size(count: int) -> str:
    """A parameter count as Ollama writes it: 268.10M, 8.0B."""
    for unit, scale, digits in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 2)):
        if count >= scale:
            return f"{count / scale:.{digits}f}{unit}"
    return str(count)


def _modified(path: str) -> str:
    try:
        seconds = Path(path).stat().st_mtime
    except OSError:
        seconds = time.time()
    return _stamp(seconds)


def _stamp(seconds: float | None = None) -> str:
    """A time as Ollama writes one (RFC 3339, UTC); none: now."""
    moment = datetime.fromtimestamp(time.time() if seconds is None else seconds, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _digest(path: str) -> str:
    """The SHA-256 of the file's header (its settings, vocabulary and tensor list: two versions of a model differ
    there), without reading the weights; of its name where it cannot be read."""
    try:
        return check_model_file(Path(path)).sha256
    except UnusableModel:
        return hashlib.sha256(path.encode()).hexdigest()


def _metadata(path: str) -> dict[str, Any]:
    """The GGUF's metadata, its text as text (a file read once per size and time); none where it cannot be read."""
    try:
        stat = Path(path).stat()
        return _read(path, stat.st_size, stat.st_mtime_ns)
    except (OSError, GgufProblem):
        return {}


@functools.lru_cache(maxsize=4)
def _read(path: str, _size: int, _mtime_ns: int) -> dict[str, Any]:
    return {key: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            for key, value in read_metadata(Path(path), keep_vocabulary=False).items()
            if isinstance(value, bytes | str | int | float)}


# --- replies ---------------------------------------------------------------------------------------


class WholeReply(protocol.WholeAnswer):
    """A chat's or a generation's reply answered whole (`stream: false`), once it is done."""

    def __init__(self, wire: protocol.Wire, asked: Asked, record: RequestRecord, model: str) -> None:
        super().__init__(wire, asked, record, tagged(model))
        self.entries: list[dict[str, Any]] = []

    def token(self, token: Token) -> None:
        if self.asked.logprobs and not token.thinking and not token.forced:
            self.entries.append(protocol.logprob_entry(token))

    def done(self, done: Done) -> None:
        said = protocol.outcome(done, self.asked, self.record.number)
        logprobs = {"logprobs": self.entries} if self.asked.logprobs else {}
        self.wire.reply_json(200, self._line(said.content or "", said.reasoning, _calls(said)) | logprobs
                             | self._final(done, said))

    def failed(self, message: str) -> None:
        self.wire.reply_json(500, {"error": message})

    def _line(self, text: str, thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """A line of the reply (or the whole of it): its text and thinking as a chat's message or a generation's
        `response`."""
        said: dict[str, Any] = {"content": text} if self.asked.chat else {"response": text}
        said |= {"thinking": thinking} if thinking else {}
        if calls:
            said["tool_calls"] = calls
        return {"model": self.model, "created_at": _stamp(), **({"message": {"role": "assistant", **said}}
                                                                if self.asked.chat else said), "done": False}

    def _final(self, done: Done, said: Outcome) -> dict[str, Any]:
        """The last line's figures: why it ended, the tokens read and written, and the time each took (ns)."""
        metrics, record = done.metrics, self.record
        return {"done": True, "done_reason": "length" if said.finish_reason == "length" else "stop",
                "total_duration": _ns(time.perf_counter() - record.arrived),
                "load_duration": _ns(record.queued_s + metrics.reload_s),  # as Ollama's: waiting for the model
                "prompt_eval_count": metrics.prompt_tokens, "prompt_eval_duration": _ns(metrics.prefill_s),
                "eval_count": metrics.completion_tokens, "eval_duration": _ns(metrics.decode_s)}


class StreamedReply(WholeReply):
    """A reply as Ollama streams it: a JSON line per token (`done: false`), then the last with the figures. A tool
    call's text is held back (protocol.CallGate) and goes out as its line's `tool_calls`."""

    def __init__(self, wire: protocol.Wire, asked: Asked, record: RequestRecord, model: str) -> None:
        super().__init__(wire, asked, record, model)
        self.gate = protocol.CallGate(asked)
        assert isinstance(wire, BaseHTTPRequestHandler)  # the server's handler: its own headers, not events'
        wire.send_response(200)
        wire.send_header("Content-Type", "application/x-ndjson")
        wire.send_header("Connection", "close")
        wire.end_headers()
        wire.close_connection = True

    def token(self, token: Token) -> None:
        logprobs = {"logprobs": [protocol.logprob_entry(token)]} if self.asked.logprobs and not token.thinking else {}
        if token.reasoning:
            self._write(self._line("", token.reasoning))
        elif (text := self.gate.shown(token.text)) or logprobs:
            self._write(self._line(text) | logprobs)

    def flush(self) -> None:
        self.wire.wfile.flush()

    def done(self, done: Done) -> None:
        said = protocol.outcome(done, self.asked, self.record.number)
        calls = _calls(said)
        if (rest := self.gate.rest(said)) or calls:
            self._write(self._line(rest, calls=calls))
        self._write(self._line("") | self._final(done, said))
        self.flush()

    def failed(self, message: str) -> None:
        self._write({"error": message})
        self.flush()

    def _write(self, line: dict[str, Any]) -> None:
        self.wire.wfile.write(json.dumps(line, ensure_ascii=False).encode() + b"\n")


def _calls(said: Outcome) -> list[dict[str, Any]]:
    """The reply's whole calls as Ollama's `tool_calls`, their arguments an object (one cut short at the limit has
    none to run: the reply ends `length` without it)."""
    if said.finish_reason != "tool_calls":
        return []
    return [{"id": call["id"], "function": {"index": index, "name": call["function"]["name"],
                                            "arguments": json.loads(call["function"]["arguments"])}}
            for index, call in enumerate(said.calls)]


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)
