"""`tui-chat serve`'s HTTP side: OpenAI's endpoints (protocol.py, and its Responses API: responses.py) and
Anthropic's Messages API (anthropic.py) over the engine process, several clients at once.

A thread per connection (the standard library's server): each request is checked (key, size, JSON, fields),
admitted (at most `parallel` in the engine, `queue` more waiting, `429` with Retry-After past that), handed to
the engine (`generate_together`: decoded beside the others in flight) and answered from its events, streamed
as server-sent events or whole. A client that goes away (its socket closed) cancels its reply at once, which
frees its slot for the next; one that sends nothing for `timeout_s` (headers, a body, or between requests) is
let go. What the engine says of each request goes to the `Monitor` (the live view, the JSON log); its death,
to `/health` until a request finds the model loaded again.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import unquote

from ..engine.base import (
    Done,
    Embedded,
    Embedding,
    EngineDeath,
    EngineError,
    Error,
    Event,
    FormatChecking,
    InputRefused,
    Loaded,
    Metrics,
    ModelInfo,
    PromptProgress,
    Serving,
    Token,
    WatchesItsDeath,
)
from ..engine.formats import FormatError
from ..engine.params import SamplingParams
from ..engine.prompts import choose_format
from ..engine.server_params import SERVE_BUILD
from ..engine.templates import PLAIN
from . import anthropic, embeddings, ollama, protocol, responses
from .embeddings import EmbeddingsAsked
from .monitor import Monitor, RequestRecord, prometheus_text
from .protocol import Asked, BadRequest, Wire

DEFAULT_MAX_BODY = 4 * 2**20  # bytes of a request body: 4 MiB, a long conversation with room to spare
DISCARD_LIMIT = 64 * 2**20  # a refused body larger than this is not read away: the connection is closed
POLL_S = 0.05  # how often a waiting request looks whether its client is still there
DEFAULT_TIMEOUT_S = 30.0  # a connection silent this long (headers, a body, between requests) is let go
_TURNED_AWAY = json.dumps({"error": {"message": "too many connections are open: try again", "type": "server_error",
                                     "param": None, "code": "too_many_connections"}}).encode()
TOO_MANY_CONNECTIONS = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_TURNED_AWAY), _TURNED_AWAY))
EMBED_CALL_TEXTS = 8  # texts the engine embeds a call: 8 of the longest take ~60 s on 2 busy cores, under its timeout


EmbeddingsShape = Callable[[Embedded, EmbeddingsAsked, float], dict[str, Any]]  # an API's answer, with the seconds


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str = ""
    parallel: int = 1  # requests decoded together
    queue: int = 8  # requests waiting beyond those; more are answered 429
    max_body: int = DEFAULT_MAX_BODY
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_connections: int = 64  # open at once: each holds a thread (an idle one up to `timeout_s`)
    embeddings: str = ""  # the dedicated embedding model's name (`--embeddings`); "": the model makes its own


class Admission:
    """At most `parallel` requests in the engine and `queue` waiting for a place; the rest are turned away."""

    def __init__(self, parallel: int, queue: int) -> None:
        self.parallel, self.queue = parallel, queue
        self.in_flight = self.waiting = 0
        self._changed = threading.Condition()

    def enter(self, gone: Callable[[], bool]) -> bool | None:
        """True once admitted; False when the queue is full (429); None when the client left while waiting."""
        with self._changed:
            if self.in_flight >= self.parallel and self.waiting >= self.queue:
                return False
            self.waiting += 1
            try:
                while self.in_flight >= self.parallel:
                    if self._changed.wait(POLL_S) is False and gone():
                        return None
            finally:
                self.waiting -= 1
            self.in_flight += 1
            return True

    def leave(self) -> None:
        with self._changed:
            self.in_flight -= 1
            self._changed.notify()


class TuiChatServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, options: ServeOptions, backend: Serving, info: ModelInfo, defaults: SamplingParams,
                 monitor: Monitor) -> None:
        self.options, self.backend, self.info, self.defaults, self.monitor = options, backend, info, defaults, monitor
        self.room = max(info.n_ctx // options.parallel, 1)  # each request's share of the context
        self.admission = Admission(options.parallel, options.queue)
        self.connections = threading.BoundedSemaphore(options.max_connections)
        self.responses = responses.Memory()  # the last responses' conversations, for previous_response_id
        self.numbers = iter(range(1, 2**62))
        self._numbers_lock = threading.Lock()
        self.trouble = ("", 0.0)  # the engine's death in the server's words, and when it was heard of
        self.reloading = False  # a new engine process loading the model after a death
        if isinstance(backend, WatchesItsDeath):
            backend.on_idle_death = self.engine_died
        # The kernel's queue of connections not yet accepted holds as many as may be open: the standard library's
        # 5 let a burst of clients (16 streams sent at once) overflow it, and a connection whose handshake the
        # kernel dropped was reset or waited a second for its SYN to be sent again.
        self.request_queue_size = options.max_connections
        super().__init__((options.host, options.port), _Handler)

    def next_number(self) -> int:
        with self._numbers_lock:
            return next(self.numbers)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, at most `max_connections` open: one more is answered 503 at once and closed,
        before anything of it is read (each holds a thread, an idle one up to `timeout_s`; beyond loopback,
        connections left open would otherwise take threads without end)."""
        if not self.connections.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(TOO_MANY_CONNECTIONS)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def engine_died(self, death: EngineDeath) -> None:
        """The engine process ended (between requests, or under one): `/health` says why until it is back, and it
        is started again at once, not at the next request (a probe that saw the error would otherwise never send
        one, and the server would stay out of rotation)."""
        with self._numbers_lock:
            reloading, self.reloading = self.reloading, True
            self.trouble = (protocol.died_words(death), time.perf_counter())
        if not reloading:
            threading.Thread(target=self._reload, name="engine-reload", daemon=True).start()

    def _reload(self) -> None:
        try:
            loaded = isinstance(self.backend.load().result(), Loaded)
        finally:
            self.reloading = False
        if loaded:
            self.trouble = ("", 0.0)

    def engine_answered(self, since: float) -> None:
        """A request sent at `since` is being read: if it was sent after the death, the model is loaded again."""
        said, heard = self.trouble
        if said and since > heard:
            self.trouble = ("", 0.0)


class _Handler(BaseHTTPRequestHandler):
    server: TuiChatServer
    protocol_version = "HTTP/1.1"
    server_version = "tui-chat"
    api = "openai"  # whose endpoint the request is ("anthropic", "ollama"): its refusals in that API's shape

    def setup(self) -> None:
        """Every read and write of the connection waits at most `timeout_s`: a client that sends its headers or
        body a byte now and then, or keeps an idle connection, holds a thread that long, not for ever."""
        super().setup()
        self.connection.settimeout(self.server.options.timeout_s)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
        """Requests are the monitor's to show; the standard library would write each to stderr."""

    # --- routes ------------------------------------------------------------------------------------

    def _path(self) -> str:
        path = self.path.split("?", 1)[0].rstrip("/")
        self.api = ("anthropic" if path.startswith("/v1/messages") else "ollama" if path.startswith("/api/") else
                    "openai")
        return path

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        path = self._path()
        if path == "/health":
            self._health()
            return
        if not self._authorized():
            return
        if path in ("/v1/models", "/models"):
            self.reply_json(200, {"object": "list", "data": [self._model_entry(), *self._embedding_entries()]})
        elif path.startswith(("/v1/models/", "/models/")):
            self._model(unquote(path.split("/models/", 1)[1]))
        elif path == "/props":
            self.reply_json(200, self._props())
        elif path == "/metrics":
            self._metrics()
        elif path.startswith("/api/"):
            self._ollama({})
        else:
            self.reply_error(BadRequest(f"no such endpoint: GET {path[:200]}", code="not_found", status=404))

    def _health(self) -> None:
        """Open without the key, as llama-server's is (load balancers probe it); the figures and the cause of a
        stopped engine only with it. 503 from the engine's death until the model is loaded again (started at
        once), as llama-server answers 503 while it loads."""
        said = self.server.trouble[0]
        health: dict[str, Any] = {"status": "error" if said else "ok"}
        if self._key_sent():
            admission = self.server.admission
            health |= ({"error": said} if said else {}) | {"in_flight": admission.in_flight,
                                                           "waiting": admission.waiting}
        self.reply_json(503 if said else 200, health)

    def _model(self, name: str) -> None:
        """`GET /v1/models/{id}` (the openai client's `models.retrieve`)."""
        if name in (entry["id"] for entry in self._embedding_entries()):
            self.reply_json(200, self._embedding_entries()[0])
            return
        if name != self.server.info.name:
            self.reply_error(BadRequest(f"the model {name[:200]!r} does not exist; this server serves "
                                        f"{self.server.info.name!r}", "model", "model_not_found", status=404))
            return
        self.reply_json(200, self._model_entry())

    def _metrics(self) -> None:
        """Prometheus' text format: requests, tokens in and out, the queue, the decode rate, the engine."""
        server, admission = self.server, self.server.admission
        _, _, totals = server.monitor.snapshot()
        data = prometheus_text(totals, admission.in_flight, admission.waiting, not server.trouble[0]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        path = self._path()
        if not self._authorized():
            return
        routes: dict[str, Callable[[dict[str, Any]], None]] = {
            "/v1/chat/completions": self._chat, "/chat/completions": self._chat,
            "/v1/completions": self._completion, "/completions": self._completion, "/tokenize": self._tokenize,
            "/v1/messages": self._messages, "/v1/messages/count_tokens": self._count_tokens,
            "/v1/responses": self._responses, "/responses": self._responses,
            "/v1/embeddings": self._embeddings, "/embeddings": self._embeddings,
            **dict.fromkeys(ollama.POSTED, self._ollama)}
        route = routes.get(path)
        try:
            if route is None:
                self._drain_body()
                raise BadRequest(f"no such endpoint: POST {path[:200]}", code="not_found", status=404)
            route(protocol.parse_body(self._body()))
        except BadRequest as error:
            if not error.recorded:
                self.server.monitor.turned_away()
            self.reply_error(error)
        except (ConnectionError, TimeoutError):  # gone, or not reading what it asked for: nobody to answer
            self.close_connection = True

    def _chat(self, body: dict[str, Any]) -> None:
        server = self.server
        protocol.check_model(body, server.info.name)
        asked = protocol.parse_chat(body, server.defaults, server.info, server.room)
        self._answer(asked, "chat", _StreamWriter if asked.stream else _WholeWriter)

    def _completion(self, body: dict[str, Any]) -> None:
        server = self.server
        protocol.check_model(body, server.info.name)
        asked = protocol.parse_completion(body, server.defaults, server.room)
        self._answer(asked, "completion", _StreamWriter if asked.stream else _WholeWriter)

    def _messages(self, body: dict[str, Any]) -> None:
        """Anthropic's `/v1/messages` (anthropic.py): the same engine request as a chat's."""
        server = self.server
        protocol.check_model(body, server.info.name)
        asked = anthropic.parse_messages(body, server.defaults, server.info, server.room)
        self._answer(asked, "messages", anthropic.StreamedMessage if asked.stream else anthropic.WholeMessage)

    def _responses(self, body: dict[str, Any]) -> None:
        """OpenAI's `/v1/responses` (responses.py): the same engine request as a chat's; a refusal of its prompt
        names `input`."""
        server = self.server
        protocol.check_model(body, server.info.name)
        with protocol.renamed(responses.NAMES):
            asked = responses.parse_responses(body, server.defaults, server.info, server.room, server.responses)
            self._answer(asked, "responses", responses.StreamedResponse if asked.stream else responses.WholeResponse)

    def _ollama(self, body: dict[str, Any]) -> None:
        """Ollama's API (ollama.py): the model's facts, or a chat or a generation as the engine's request; a refusal
        in Ollama's shape, `{"error": …}`."""
        server = self.server
        try:
            answer = ollama.answer(self.command, self._path(), body, server.info, server.defaults, server.room)
            if isinstance(answer, ollama.Asking):
                self._answer(answer.asked, answer.kind, answer.writer)
            elif isinstance(answer, ollama.Embedding):
                ollama.check_model(body, server.options.embeddings or server.info.name)
                self._embed(answer.asked, answer.shape)
            else:
                self.reply_json(200, answer)
        except BadRequest as error:
            if not error.recorded:
                server.monitor.turned_away()
            self.reply_error(error)

    def _count_tokens(self, body: dict[str, Any]) -> None:
        """Anthropic's `/v1/messages/count_tokens`: the prompt read by the engine as the message's would be (the
        model's template, its tools and thinking switch), for one token; the next message reuses that read."""
        server = self.server
        protocol.check_model(body, server.info.name)
        self._answer(anthropic.parse_messages(body, server.defaults, server.info, server.room, counting=True),
                     "count", anthropic.TokenCount)

    def _tokenize(self, body: dict[str, Any]) -> None:
        """llama.cpp's server's `/tokenize` (the text's token ids, no BOS): tui-chat's remote backend counts a
        draft's tokens with it."""
        content = body.get("content")
        if not isinstance(content, str):
            raise BadRequest("content must be a string", "content")
        try:
            tokens = self.server.backend.tokenize(content)
        except EngineError as error:
            raise protocol.engine_failure(Error(str(error), died=getattr(error, "death", None)), chat=False) from None
        self.reply_json(200, {"tokens": tokens, "count": len(tokens)})

    def _embeddings(self, body: dict[str, Any]) -> None:
        """OpenAI's `/v1/embeddings` (embeddings.py)."""
        protocol.check_model(body, self.server.options.embeddings or self.server.info.name)
        self._embed(embeddings.parse_embeddings(body), embeddings.answer)

    def _embed(self, asked: EmbeddingsAsked, shape: EmbeddingsShape) -> None:
        """The texts' pooled vectors, made by the engine in a context of their own (the slots go on), a few texts a
        call; by the dedicated embedding model where `--embeddings` named one; written in the API's `shape` (with the
        seconds they took). Not admitted as a reply is: it takes no slot, and the engine reads one request's texts
        at a time."""
        server, backend = self.server, self.server.backend
        started = time.perf_counter()
        if not isinstance(backend, Embedding):
            raise BadRequest("this server's engine makes no embeddings", code="not_supported", status=501,
                             kind="server_error")
        record = server.monitor.new_record(server.next_number(), self.client_address[0], "embeddings", False)
        record.admitted()
        parts = []
        try:
            for start in range(0, len(asked.texts), EMBED_CALL_TEXTS):
                if self._gone():
                    server.monitor.finish(record, "gone")
                    return
                parts.append(backend.embed(asked.texts[start : start + EMBED_CALL_TEXTS]))
            embedded = embeddings.joined(parts)
            embeddings.check_dimensions(asked, embedded.size)
        except (InputRefused, BadRequest) as error:
            server.monitor.finish(record, "refused", str(error))
            raise BadRequest(str(error), error.param if isinstance(error, BadRequest) else "input",
                             error.code if isinstance(error, BadRequest) else "context_length_exceeded",
                             recorded=True) from None
        except EngineError as error:
            server.monitor.finish(record, "failed", str(error))
            failure = Error(str(error), died=getattr(error, "death", None))
            self._heard_of(failure)
            raise protocol.engine_failure(failure, chat=False) from None
        server.monitor.finish(record, "embedded", f"{len(asked.texts)} texts, {sum(embedded.tokens):,} tokens, "
                                                  f"{embedded.size} floats each")
        self.reply_json(200, shape(embedded, asked, time.perf_counter() - started))

    # --- one request ---------------------------------------------------------------------------------

    def _answer(self, asked: Asked, kind: str, writer: type[Writer]) -> None:
        server = self.server
        self._check_format(asked)
        record = server.monitor.new_record(server.next_number(), self.client_address[0], kind, asked.stream)
        admitted = server.admission.enter(self._gone)
        if admitted is False:
            server.monitor.refused(record, 429)
            raise BadRequest(f"the server is busy: {server.options.parallel} requests in flight and "
                             f"{server.options.queue} waiting; try again shortly", code="rate_limit_exceeded",
                             status=429, kind="rate_limit_error", recorded=True)
        if admitted is None:
            server.monitor.finish(record, "gone")
            return
        try:
            record.admitted()
            events = server.backend.generate_together(asked.request, server.room)
            try:
                self._reply(asked, record, _Events(events.drain, events.cancel, self._gone), writer)
            finally:
                events.cancel()  # a client gone, or an answer that failed to send: the slot goes at once
        finally:
            server.admission.leave()
            if record.state == "running":  # the connection broke while the answer was sent
                server.monitor.finish(record, "gone")

    def _check_format(self, asked: Asked) -> None:
        """A grammar or schema the engine cannot use is the client's mistake: a 400 naming its field before the
        request takes a place, not the engine's failure (a 500, which clients send again)."""
        backend, output = self.server.backend, asked.request.format
        if not output.constrained or not isinstance(backend, FormatChecking):
            return
        try:
            backend.check_format(output)
        except FormatError as error:
            raise BadRequest(str(error), asked.format_field, "invalid_value") from None
        except EngineError:
            return  # the engine is down: the request loads it again, and is told there what it makes of the format

    def _reply(self, asked: Asked, record: RequestRecord, events: _Events, writer_type: type[Writer]) -> None:
        first = events.first()
        if events.gone:  # left before its prompt was taken: nobody to answer, and no failure
            self.server.monitor.finish(record, "gone")
            return
        if isinstance(first, Error):
            self.server.monitor.finish(record, "refused" if first.code else "failed", first.message)
            self._heard_of(first)
            refusal = protocol.engine_failure(first, asked.chat)
            refusal.recorded = True
            raise refusal
        writer = writer_type(self, asked, record, self.server.info.name)
        for batch in events.batches():
            if any(self._take(event, writer, record, events) for event in batch):
                return
            writer.flush()  # a batch's chunks go out together: one write to the socket, not one a token
        self.server.monitor.finish(record, "gone")

    def _take(self, event: Event, writer: Writer, record: RequestRecord,
              events: _Events) -> bool:
        """One engine event into the answer; True once it was the last."""
        if isinstance(event, Token):
            writer.token(event)
        elif isinstance(event, Metrics):
            record.metrics = event.metrics
            writer.metrics()
        elif isinstance(event, PromptProgress):
            self.server.engine_answered(record.admitted_at or record.arrived)
            writer.progress(event)
        elif isinstance(event, Done):
            record.metrics = event.metrics
            writer.done(event)
            self.server.monitor.finish(record, "gone" if events.gone else event.stop_reason)
            return True
        elif isinstance(event, Error):
            self._heard_of(event)
            writer.failed(protocol.client_words(event))
            self.server.monitor.finish(record, "failed", event.message)
            return True
        return False

    def _heard_of(self, error: Error) -> None:
        """An engine's death under a request: `/health` says so too."""
        if error.died is not None:
            self.server.engine_died(error.died)

    # --- the wire ----------------------------------------------------------------------------------

    def _authorized(self) -> bool:
        if self._key_sent():
            return True
        self._drain_body()
        self.server.monitor.turned_away()
        self.reply_error(BadRequest("a valid API key is needed: send it as Authorization: Bearer KEY or as "
                                    "x-api-key: KEY", code="invalid_api_key", status=401))
        return False

    def _key_sent(self) -> bool:
        """No key is needed, or `Authorization` carries it (the scheme in any case: HTTP's are case-insensitive),
        or `x-api-key` does (Anthropic's clients send it there)."""
        key = self.server.options.api_key.encode()
        scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
        bearer = given.strip() if scheme.lower() == "bearer" else ""
        return not key or any(hmac.compare_digest(sent.encode(), key)
                              for sent in (bearer, self.headers.get("x-api-key", "").strip()) if sent)

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise BadRequest("the request needs a Content-Length header (chunked bodies are not read)", status=411)
        size, limit = int(length), self.server.options.max_body
        if size > limit:
            self.close_connection = True
            self._discard(size)  # read away, so the client is not cut off mid-send and reads the answer
            raise BadRequest(f"the request body is {size:,} bytes; this server takes at most {limit:,}",
                             code="request_too_large", status=413)
        try:
            return self.rfile.read(size)
        except TimeoutError:
            self.close_connection = True
            raise BadRequest(f"the request body did not arrive: nothing came for {self.server.options.timeout_s:g} s",
                             code="timeout", status=408) from None

    def _drain_body(self) -> None:
        """A body not wanted (a refused request's) is read away, so the connection can carry the next."""
        length = self.headers.get("Content-Length", "0")
        self._discard(int(length) if length.isdigit() else 0)

    def _discard(self, size: int) -> None:
        """Read `size` bytes away, a chunk at a time; past DISCARD_LIMIT the connection is closed instead."""
        if size > DISCARD_LIMIT:
            self.close_connection = True
            return
        try:
            while size > 0:
                chunk = self.rfile.read(min(size, 2**16))
                if not chunk:
                    break
                size -= len(chunk)
        except TimeoutError:
            self.close_connection = True

    def _gone(self) -> bool:
        """Whether the client closed its connection (a socket that reads as ended)."""
        connection: socket.socket = self.connection
        try:
            readable, _, _ = select.select([connection], [], [], 0)
            return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def reply_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def reply_error(self, error: BadRequest) -> None:
        """A refusal in the endpoint's shape (OpenAI's, or Anthropic's on its endpoints); a busy server's says
        when to try again."""
        status, body = (anthropic.refusal(error) if self.api == "anthropic" else
                        (error.status, ollama.refusal(error)) if self.api == "ollama" else (error.status, error.body()))
        retry = {"Retry-After": "1"} if error.status == 429 else {}
        try:
            self.reply_json(status, body, retry)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def open_events(self) -> None:
        """The answer as server-sent events: its headers now, the events as they come, the connection closed
        after the last."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _model_entry(self) -> dict[str, Any]:
        info = self.server.info
        return {"id": info.name, "object": "model", "created": 0, "owned_by": "tui-chat",
                "meta": {"n_ctx": info.n_ctx, "n_ctx_per_request": self.server.room, "n_params": info.n_params,
                         "size": info.size_bytes, "quantization": info.quantization, "offload": info.offload}}

    def _embedding_entries(self) -> list[dict[str, Any]]:
        """The dedicated embedding model (`--embeddings`), listed beside the model; none without one."""
        name = self.server.options.embeddings
        return [{"id": name, "object": "model", "created": 0, "owned_by": "tui-chat",
                 "meta": {"embeddings": True}}] if name else []

    def _props(self) -> dict[str, Any]:
        """llama.cpp's server's `/props`, which tui-chat's remote backend reads: each request's context, the
        model's file type, and the template (a base model's plain transcript is recognised by it)."""
        server = self.server
        template = choose_format(PLAIN, None).source if server.info.chat_format == PLAIN else ""
        return {"default_generation_settings": {"n_ctx": server.room}, "total_slots": server.options.parallel,
                "model_path": server.info.path, "model_ftype": server.info.quantization, "chat_template": template,
                "build_info": SERVE_BUILD}


class Writer(Protocol):
    """An answer written from the engine's events: whole when the reply is done, or streamed as they come."""

    def __init__(self, wire: Wire, asked: Asked, record: RequestRecord, model: str) -> None: ...

    def token(self, token: Token) -> None: ...

    def metrics(self) -> None: ...

    def progress(self, progress: PromptProgress) -> None: ...

    def flush(self) -> None: ...

    def done(self, done: Done) -> None: ...

    def failed(self, message: str) -> None: ...


class _Events:
    """A request's engine events, read in batches, while watching that its client is still there."""

    def __init__(self, drain: Callable[[float], list[Event]], cancel: Callable[[], None],
                 gone: Callable[[], bool]) -> None:
        self._drain, self._cancel, self._gone = drain, cancel, gone
        self.gone = False
        self._held: list[Event] = []

    def _batches(self) -> Iterator[list[Event]]:
        """Batches while the client is there, looked at after each (a whole reply writes nothing until it is
        done, so a busy stream of tokens is no sign of it)."""
        while True:
            batch = self._drain(POLL_S)
            if self._gone():
                self.gone = True
                self._cancel()
                return
            yield batch

    def first(self) -> Event:
        """The first event that says the prompt was taken (or refused): nothing is sent before it."""
        for batch in self._batches():
            if batch:
                self._held = batch
                return batch[0]
        return Error("the client went away")

    def batches(self) -> Iterator[list[Event]]:
        """Every batch from the first event's on (that one included)."""
        yield self._held
        yield from self._batches()


class _WholeWriter(protocol.WholeAnswer):
    """A reply answered whole, once it is done."""

    def __init__(self, wire: protocol.Wire, asked: Asked, record: RequestRecord, model: str) -> None:
        super().__init__(wire, asked, record, model)
        self.entries: list[dict[str, Any]] = []

    def token(self, token: Token) -> None:
        if self.asked.logprobs and not token.thinking and not token.forced:
            self.entries.append(protocol.logprob_entry(token))

    def done(self, done: Done) -> None:
        asked, record = self.asked, self.record
        said = protocol.outcome(done, asked, record.number)
        logprobs = protocol.logprobs_field(self.entries, asked.chat) if asked.logprobs else None
        if asked.chat:
            message: dict[str, Any] = {"role": "assistant", "content": said.content}
            if said.reasoning:
                message["reasoning_content"] = said.reasoning
            if said.calls:
                message["tool_calls"] = said.calls
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": said.finish_reason}
        else:
            choice = {"index": 0, "text": said.content or "", "logprobs": logprobs, "finish_reason": said.finish_reason}
        payload = {"id": record.ident, "object": "chat.completion" if asked.chat else "text_completion",
                   "created": int(record.wall_started), "model": self.model, "choices": [choice],
                   "usage": protocol.usage(done.metrics), "timings": protocol.timings(done.metrics),
                   "x_tui_chat": protocol.extras(done, record.queued_s)}
        self.wire.reply_json(200, payload)


class _StreamWriter:
    """A reply as server-sent events: a chunk per token. With tools, the text a call could begin with is held
    back until it is clear that it is text: a call goes out as `tool_calls`, never as content."""

    def __init__(self, wire: protocol.Wire, asked: Asked, record: RequestRecord, model: str) -> None:
        self.wire, self.asked, self.record, self.model = wire, asked, record, model
        self.gate = protocol.CallGate(asked)
        wire.open_events()
        if asked.chat:
            self._send({"role": "assistant", "content": ""})

    def token(self, token: Token) -> None:
        logprobs = protocol.logprobs_field([protocol.logprob_entry(token)], self.asked.chat) \
            if self.asked.logprobs and not token.thinking else None
        if token.reasoning:
            self._send({"reasoning_content": token.reasoning}, logprobs=logprobs)
            return
        text = self.gate.shown(token.text)
        if text or logprobs:
            self._send({"content": text}, logprobs=logprobs)

    def metrics(self) -> None:
        if self.asked.timings_per_token and self.record.metrics is not None:
            self._send({}, timings=protocol.timings(self.record.metrics))

    def progress(self, progress: PromptProgress) -> None:
        if self.asked.progress and progress.total:
            record = self.record
            self._send({}, prompt_progress={"total": progress.total + record.cached, "cache": record.cached,
                                            "processed": progress.done + record.cached,
                                            "time_ms": progress.elapsed_s * 1000})

    def done(self, done: Done) -> None:
        said = protocol.outcome(done, self.asked, self.record.number)
        if rest := self.gate.rest(said):
            self._send({"content": rest})
        if said.calls:
            self._send({"tool_calls": [dict(call, index=index) for index, call in enumerate(said.calls)]})
        metrics = done.metrics
        tail: dict[str, Any] = {"timings": protocol.timings(metrics),
                                "x_tui_chat": protocol.extras(done, self.record.queued_s)}
        self._send({}, finish=said.finish_reason, **tail)
        if self.asked.usage_in_stream:
            self._write({"id": self.record.ident, "object": self._object(), "created": int(self.record.wall_started),
                         "model": self.model, "choices": [], "usage": protocol.usage(metrics)})
        self.wire.wfile.write(b"data: [DONE]\n\n")
        self.wire.wfile.flush()

    def failed(self, message: str) -> None:
        self._write(protocol.error_body(message, "server_error", code="engine_error"))
        self.wire.wfile.write(b"data: [DONE]\n\n")

    def _object(self) -> str:
        return "chat.completion.chunk" if self.asked.chat else "text_completion"

    def _send(self, delta: dict[str, Any], *, finish: str | None = None, logprobs: dict[str, Any] | None = None,
              **extra: Any) -> None:
        if self.asked.chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta.get("content", ""), "logprobs": logprobs, "finish_reason": finish}
        self._write({"id": self.record.ident, "object": self._object(), "created": int(self.record.wall_started),
                     "model": self.model, "choices": [choice], **extra})

    def flush(self) -> None:
        self.wire.wfile.flush()

    def _write(self, payload: dict[str, Any]) -> None:
        self.wire.wfile.write(b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n")
