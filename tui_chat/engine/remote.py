"""A backend for OpenAI-compatible servers (llama.cpp's llama-server, vLLM, Ollama, llama-cpp-python).

Each reply is one streamed `/chat/completions` request on its own thread, turned into the same events
the in-process engine emits. Metrics come from the client's own clock (TTFT, decode rate) and from what
the server reports: `usage`, and llama.cpp's `timings`. Sampling settings are read once per reply: a
request in flight cannot change them.

The API key goes only into the Authorization header: never into an event, a message or a log line.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from .base import (
    Candidate,
    Done,
    EngineError,
    Error,
    Loaded,
    Metrics,
    ModelInfo,
    Request,
    StopReason,
    Stream,
    Token,
    TurnMetrics,
)
from ..safetext import terminal_safe
from .params import SamplingParams
from .sse import SseDecoder

BACKEND_NAME = "openai"
METRICS_INTERVAL_S = 0.1
CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 120.0
TOKENIZE_TIMEOUT_S = 2.0
CHARS_PER_TOKEN = 4  # the usual rough figure for English text, where a server cannot count
_ERROR_BODY_LIMIT = 16_384
_SERVER_TEXT_LIMIT = 200
_EXTRA_PARAMS = ("top_k", "min_p", "repeat_penalty")


class RemoteError(EngineError):
    """A server or network failure, already phrased for the user."""


class MalformedEvent(RemoteError):
    """A streamed event that is not the JSON chunk the protocol promises."""


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    base_url: str
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class ServerKind:
    """What a family of servers accepts beyond the OpenAI fields, and how it counts tokens."""

    name: str
    extra_params: dict[str, str]  # our sampling name -> the server's field
    tokenize_path: str | None  # relative to the server root; None: estimate from characters


LLAMA_SERVER = ServerKind("llama.cpp server", {p: p for p in _EXTRA_PARAMS}, "tokenize")
LLAMA_CPP_PYTHON = ServerKind("llama-cpp-python server", {p: p for p in _EXTRA_PARAMS}, "extras/tokenize/count")
VLLM = ServerKind("vLLM", {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repetition_penalty"}, "tokenize")
GENERIC = ServerKind("OpenAI-compatible server", {}, None)


# --- parsing streamed chunks (pure) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenProb:
    text: str
    prob: float
    top: tuple[Candidate, ...]


@dataclass(frozen=True, slots=True)
class Chunk:
    """The parts of one `chat.completion.chunk` we use; absent parts are empty or None."""

    content: str = ""
    finish_reason: str | None = None
    tokens: tuple[TokenProb, ...] = ()
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    error: str | None = None


def parse_chunk(data: str) -> Chunk:
    """One event's data as a Chunk; raises MalformedEvent when it is not a chunk."""
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):  # ValueError: bad JSON, or a number past Python's 4300 digits
        raise MalformedEvent(f"the server sent a malformed event: {_excerpt(data)}") from None
    if not isinstance(payload, dict):
        raise MalformedEvent(f"the server sent a malformed event: {_excerpt(data)}")
    if "error" in payload:
        return Chunk(error=_error_text(payload) or "unknown error")
    choices = payload.get("choices") or []
    if not isinstance(choices, list):
        raise MalformedEvent("the server sent a malformed event: 'choices' is not a list")
    choice = choices[0] if choices else {}
    if not isinstance(choice, dict):
        raise MalformedEvent("the server sent a malformed event: a choice is not an object")
    delta = choice.get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    if content is not None and not isinstance(content, str):
        raise MalformedEvent("the server sent a malformed event: 'content' is not text")
    finish = choice.get("finish_reason")
    return Chunk(
        content=content or "",
        finish_reason=finish if isinstance(finish, str) else None,
        tokens=_token_probs(choice.get("logprobs")),
        usage=_table(payload.get("usage")),
        timings=_table(payload.get("timings")),
    )


def _token_probs(logprobs: Any) -> tuple[TokenProb, ...]:
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list):
        return ()
    return tuple(
        TokenProb(str(entry.get("token", "")), _prob(entry.get("logprob")), _candidates(entry.get("top_logprobs")))
        for entry in entries
        if isinstance(entry, dict)
    )


def _candidates(tops: Any) -> tuple[Candidate, ...]:
    """The likeliest tokens; servers do not say their ids, so each has id -1."""
    if not isinstance(tops, list):
        return ()
    return tuple(Candidate(-1, str(top.get("token", "")), _prob(top.get("logprob"))) for top in tops if isinstance(top, dict))


def _prob(logprob: Any) -> float:
    if isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
        return 0.0
    logprob = max(min(logprob, 0), -1e9)  # a JSON integer of any size becomes a float math.exp takes
    return 0.0 if math.isnan(logprob) else math.exp(logprob)


def _table(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _count(table: dict[str, Any] | None, *path: str) -> int | None:
    """A non-negative whole number at `path` in a reported table, or None when absent or nonsense."""
    value: Any = table
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**53:
        return None
    return int(value)


def _rate(table: dict[str, Any] | None, key: str) -> float | None:
    value = table.get(key) if table else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 2**53:
        return None
    return float(value)


def _error_text(payload: Any) -> str:
    """The message inside an OpenAI-style (`error.message`) or FastAPI-style (`detail`) error body."""
    if not isinstance(payload, dict):
        return ""
    error = payload.get("error", payload.get("detail"))
    if isinstance(error, dict):
        error = error.get("message", "")
    if isinstance(error, list):
        error = "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in error)
    return _excerpt(str(error or ""))


def _excerpt(text: str) -> str:
    """Server text made one short line, its control characters made visible: it is untrusted, and
    error messages also go to stderr."""
    line = terminal_safe(" ".join(text.split()))
    return line if len(line) <= _SERVER_TEXT_LIMIT else line[: _SERVER_TEXT_LIMIT - 1] + "…"


# --- the backend -------------------------------------------------------------------------------


def display_url(base_url: str) -> str:
    """The URL without any user:password part, fit for the panel and messages."""
    url = httpx.URL(base_url)
    return str(url.copy_with(username=None, password=None))


def check_base_url(base_url: str) -> str:
    """`base_url` without a trailing slash; raises RemoteError naming what is wrong with it."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        raise RemoteError(f"base URL {base_url!r} is not a URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise RemoteError(f"base URL must start with http:// or https:// and name a host (got {display_url(base_url)!r})")
    return base_url.rstrip("/")


class OpenAIBackend:
    """Talks to one server; `load` picks the model and learns what the server is, `generate` streams."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self.base_url = check_base_url(settings.base_url)
        url = httpx.URL(self.base_url)
        self.host = f"{url.host}:{url.port}" if url.port else url.host
        self.root_url = self.base_url.removesuffix("/v1")
        self.shown_url = display_url(self.base_url)  # a password in the URL stays out of messages
        self.info: ModelInfo | None = None
        self.kind = GENERIC
        self._bos_tokens = 0
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        timeout = httpx.Timeout(settings.read_timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = httpx.Client(headers=headers, timeout=timeout)
        # Replies get a connection of their own, so cancel can cut it even before the headers arrive.
        self._streams = httpx.Client(headers=headers, timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0))
        self._live: set[_Connection] = set()
        self._live_lock = threading.Lock()

    # --- public API ---------------------------------------------------------------------------

    def load(self) -> Stream:
        stream = Stream()
        threading.Thread(target=self._load, args=(stream,), name="remote-load", daemon=True).start()
        return stream

    def list_models(self) -> list[str]:
        """The model ids the server serves (`/v1/models`)."""
        return [entry["id"] for entry in self._model_entries()]

    def generate(self, request: Request) -> Stream:
        connection = _Connection()
        stream = _RemoteStream(connection)
        threading.Thread(target=self._reply, args=(request, stream, connection), name="remote-reply", daemon=True).start()
        return stream

    def count_tokens(self, text: str) -> int:
        """The server's own count where it has a tokenize endpoint, else CHARS_PER_TOKEN characters a token."""
        if self.info is None:
            raise EngineError("no model is loaded")
        if self.kind.tokenize_path is None:
            return math.ceil(len(text) / CHARS_PER_TOKEN)
        return max(0, self._server_count(text) - self._bos_tokens)

    def close(self) -> None:
        with self._live_lock:
            live = list(self._live)
        for connection in live:
            connection.cut()
        self._streams.close()
        self._client.close()

    # --- loading ------------------------------------------------------------------------------

    def _load(self, stream: Stream) -> None:
        try:
            self.info = self._describe()
        except EngineError as error:
            stream.put(Error(self._clean(str(error))))
            return
        stream.put(Loaded(self.info))

    def _describe(self) -> ModelInfo:
        entries = self._model_entries()
        served = [entry["id"] for entry in entries]
        wanted = self.settings.model
        if not served:
            raise RemoteError(f"the server at {self.host} serves no models")
        if wanted is None:
            wanted = served[0]
        elif wanted not in served:
            raise RemoteError(f"model {wanted!r} is not served at {self.host}; it serves: {_excerpt(', '.join(served))}")
        entry = entries[served.index(wanted)]
        self.kind, n_ctx = self._server_kind(entry)
        self.settings = replace(self.settings, model=wanted)
        if self.kind is LLAMA_CPP_PYTHON:
            self._bos_tokens = self._server_count("")
        ignored = tuple(name for name in _EXTRA_PARAMS if name not in self.kind.extra_params)
        counting = "tokens counted by the server" if self.kind.tokenize_path else (
            f"token counts estimated at {CHARS_PER_TOKEN} characters a token")
        return ModelInfo(
            name=wanted,
            path=self.shown_url,
            description=f"{self.kind.name} · settings apply per reply · {counting}",
            quantization="unknown",
            size_bytes=0,
            n_params=0,
            n_layers=0,
            gpu_layers=0,
            n_ctx=n_ctx,
            n_ctx_train=0,
            chat_format="server",
            backend=BACKEND_NAME,
            remote_host=self.host,
            params_per_token=False,
            ignored_params=ignored,
        )

    def _model_entries(self) -> list[dict[str, Any]]:
        listing = self._get_json(f"{self.base_url}/models")
        entries = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(entries, list):
            raise RemoteError(f"{self.host} did not answer /models with a model list: is {self.shown_url} right?")
        return [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]

    def _server_kind(self, entry: dict[str, Any]) -> tuple[ServerKind, int]:
        """Which server family this is (for its extra sampling fields and tokenizer), and its context size."""
        if entry.get("owned_by") == "vllm":
            return VLLM, _count(entry, "max_model_len") or 0
        props = self._probe(f"{self.root_url}/props")
        if isinstance(props, dict) and "default_generation_settings" in props:
            n_ctx = _count(props, "default_generation_settings", "n_ctx") or _count(props, "n_ctx") or 0
            return LLAMA_SERVER, n_ctx
        schema = self._probe(f"{self.root_url}/openapi.json")
        if isinstance(schema, dict) and "/extras/tokenize/count" in (schema.get("paths") or {}):
            return LLAMA_CPP_PYTHON, 0
        return GENERIC, 0

    def _probe(self, url: str) -> Any:
        """JSON at `url`, or None where the server has no such endpoint."""
        try:
            return self._get_json(url)
        except RemoteError:
            return None

    def _get_json(self, url: str) -> Any:
        return self._send(self._client.build_request("GET", url))

    def _server_count(self, text: str) -> int:
        url = f"{self.root_url}/{self.kind.tokenize_path}"
        model = self.settings.model
        if self.kind is LLAMA_SERVER:
            body: dict[str, Any] = {"content": text, "add_special": False}
        elif self.kind is VLLM:
            body = {"model": model, "prompt": text, "add_special_tokens": False}
        else:
            body = {"input": text, "model": model}  # llama-cpp-python always adds BOS: see _bos_tokens
        request = self._client.build_request("POST", url, json=body, timeout=TOKENIZE_TIMEOUT_S)
        answer = self._send(request)
        count = _count(answer, "count")
        if count is None and isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            count = len(answer["tokens"])
        if count is None:
            raise RemoteError(f"{self.host} answered tokenize without a count")
        return count

    def _send(self, request: httpx.Request) -> Any:
        try:
            response = self._client.send(request)
        except httpx.HTTPError as error:
            raise RemoteError(self._clean(self._network_message(error))) from None
        if response.status_code != 200:
            raise RemoteError(self._clean(self._status_message(response.status_code, response.text, request.url.path)))
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RemoteError(f"{self.host} answered {request.url.path} with something other than JSON") from None

    # --- one reply ----------------------------------------------------------------------------

    def _reply(self, request: Request, stream: _RemoteStream, connection: _Connection) -> None:
        version, params = request.params.snapshot()
        reply = _Reply(request, version, self.info.n_ctx if self.info else 0)
        with self._live_lock:
            self._live.add(connection)
        try:
            if self.info is None:
                raise EngineError("no model is loaded")
            self._stream_into(reply, stream, connection, self._body(request, params))
        except (EngineError, httpx.HTTPError) as error:
            if stream.cancelled.is_set():
                stream.put(reply.done("cancelled"))
            else:
                message = error if isinstance(error, EngineError) else self._network_message(error)
                stream.put(Error(self._clean(str(message)), reply.text))
            return
        finally:
            with self._live_lock:
                self._live.discard(connection)
        if stream.cancelled.is_set():
            stream.put(reply.done("cancelled"))
        else:
            stream.put(reply.done(_stop_reason(reply.finish_reason, params)))

    def _body(self, request: Request, params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.seed >= 0:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        for name, wire in self.kind.extra_params.items():
            body[wire] = getattr(params, name)
        if self.kind is VLLM and params.top_k == 0:
            body["top_k"] = -1  # vLLM's "no limit" (older versions reject 0)
        if request.top_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.top_logprobs
        return body

    def _stream_into(self, reply: _Reply, stream: Stream, connection: _Connection, body: dict[str, Any]) -> None:
        url = f"{self.base_url}/chat/completions"
        with self._streams.stream("POST", url, json=body, extensions={"trace": connection.trace}) as response:
            connection.attach(response)
            if response.status_code != 200:
                raise RemoteError(self._status_message(response.status_code, _read_limited(response), url))
            decoder = SseDecoder()
            for line in response.iter_lines():
                data = decoder.feed(line)
                if data is not None and reply.take(data, stream):
                    return
            data = decoder.flush()
            if data is not None and reply.take(data, stream):
                return
        if reply.finish_reason is None and not stream.cancelled.is_set():
            raise RemoteError(f"the server at {self.host} closed the stream mid-reply")

    # --- messages -----------------------------------------------------------------------------

    def _status_message(self, status: int, body: str, path: str) -> str:
        try:
            detail = _error_text(json.loads(body))
        except (ValueError, RecursionError):
            detail = _excerpt(body)
        said = f": {detail}" if detail else ""
        if status in (401, 403):
            return (f"the server at {self.host} refused the request ({status}{said}): check the API key "
                    "(--api-key-env, or api_key_env in [remotes.NAME])")
        if status == 404 and path.endswith("/chat/completions"):
            return f"model {self.settings.model!r} not found at {self.host} (404{said})"
        if status == 404:
            return (f"{self.host} has no {httpx.URL(path).path} (404{said}): is the base URL {self.shown_url} right? "
                    "(the API root usually ends in /v1)")
        return f"the server at {self.host} answered {status}{said}"

    def _network_message(self, error: httpx.HTTPError) -> str:
        if isinstance(error, httpx.ConnectError):
            return f"cannot connect to {self.host}: {_excerpt(str(error)) or 'connection refused'}; is the server running?"
        if isinstance(error, httpx.TimeoutException):
            return f"the server at {self.host} did not answer in time ({type(error).__name__})"
        if isinstance(error, httpx.RemoteProtocolError):
            return f"the server at {self.host} broke off the reply: {_excerpt(str(error))}"
        return f"connection to {self.host} failed: {_excerpt(str(error)) or type(error).__name__}"

    def _clean(self, message: str) -> str:
        """Defence in depth: whatever a server echoes back, the key never reaches the user's screen."""
        key = self.settings.api_key
        return message.replace(key, "[api key]") if key else message


def _read_limited(response: httpx.Response) -> str:
    body = b""
    for part in response.iter_bytes():
        body += part
        if len(body) >= _ERROR_BODY_LIMIT:
            break
    return body[:_ERROR_BODY_LIMIT].decode("utf-8", errors="replace")


def _stop_reason(finish_reason: str | None, params: SamplingParams) -> StopReason:
    """OpenAI's "stop" covers both the end of text and a stop sequence; with stop sequences set we
    cannot tell which, and name the stop sequence."""
    if finish_reason == "length":
        return "length"
    return "stop" if params.stop and finish_reason == "stop" else "eos"


class _Reply:
    """What one streamed reply has produced so far, and its metrics."""

    def __init__(self, request: Request, params_version: int, n_ctx: int) -> None:
        self.request = request
        self.params_version = params_version
        self.n_ctx = n_ctx
        self.text = ""
        self.tokens = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.first_at: float | None = None
        self.visible_at: float | None = None
        self.last_at: float | None = None
        self._next_metrics = 0.0

    def take(self, data: str, stream: Stream) -> bool:
        """Apply one event's data; True once the server said the stream is over."""
        if data.strip() == "[DONE]":
            return True
        chunk = parse_chunk(data)
        if chunk.error is not None:
            raise RemoteError(f"the server stopped the reply: {chunk.error}")
        self.usage = chunk.usage or self.usage
        self.timings = chunk.timings or self.timings
        self.finish_reason = chunk.finish_reason or self.finish_reason
        now = time.perf_counter()
        if chunk.tokens:
            for index, token in enumerate(chunk.tokens):
                self._token(stream, chunk.content if index == 0 else "", now, token)
        elif chunk.content:
            self._token(stream, chunk.content, now, None)
        if now >= self._next_metrics:
            stream.put(Metrics(self.metrics()))
            self._next_metrics = now + METRICS_INTERVAL_S
        return False

    def _token(self, stream: Stream, text: str, now: float, prob: TokenProb | None) -> None:
        self.tokens += 1
        self.text += text
        self.first_at = self.first_at or now
        self.last_at = now
        if text and self.visible_at is None:
            self.visible_at = now
        if prob is None:
            stream.put(Token(-1, text, now, self.params_version))
        else:
            stream.put(Token(-1, text, now, self.params_version, prob.text, prob.prob, prob.top))

    def metrics(self) -> TurnMetrics:
        """Counts the server reported win over our own: it knows the prompt, the cache and the tokens."""
        usage, timings = self.usage, self.timings
        evaluated, cache_n = _count(timings, "prompt_n"), _count(timings, "cache_n")
        from_timings = evaluated + (cache_n or 0) if evaluated is not None else None
        prompt = _count(usage, "prompt_tokens") or from_timings or 0
        cached = _count(usage, "prompt_tokens_details", "cached_tokens")
        cached = cache_n if cached is None else cached
        completion = _count(usage, "completion_tokens") or _count(timings, "predicted_n") or self.tokens
        first = self.visible_at or self.first_at
        ttft = None if first is None else first - self.request.submitted_at
        prompt_ms = _rate(timings, "prompt_ms")
        # Without the server's prompt time, the time to first token bounds it from above.
        prefill_s = prompt_ms / 1000 if prompt_ms else ttft if prompt and ttft else 0.0
        return TurnMetrics(
            prompt_tokens=prompt,
            cached_tokens=min(cached or 0, prompt),
            completion_tokens=completion,
            ttft_s=ttft,
            prefill_s=prefill_s,
            decode_s=0.0 if self.first_at is None else self.last_at - self.first_at,
            context_tokens=prompt + completion,
            n_ctx=self.n_ctx,
            server_decode_tok_s=_rate(timings, "predicted_per_second"),
        )

    def done(self, reason: StopReason) -> Done:
        return Done(reason, self.text, self.metrics())


class _Connection:
    """The socket under one streamed reply, so a cancel from any thread can cut it at once.

    Closing an httpx response from another thread does not wake a thread blocked reading it;
    shutting the socket down does.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._cut = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self._hold(info.get("return_value"))

    def attach(self, response: httpx.Response) -> None:
        self._hold(response.extensions.get("network_stream"))

    def _hold(self, network_stream: Any) -> None:
        sock = network_stream.get_extra_info("socket") if network_stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._socket = sock
            if self._cut:
                _shutdown(sock)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            if self._socket is not None:
                _shutdown(self._socket)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing left to cut


class _RemoteStream(Stream):
    def __init__(self, connection: _Connection) -> None:
        super().__init__()
        self._connection = connection

    def cancel(self) -> None:
        super().cancel()
        self._connection.cut()
