"""`OpenAIBackend`: one server, the same events as the in-process engine.

Each reply is one streamed `/chat/completions` request on its own thread. Sampling settings are read
once per reply: a request in flight cannot change them; each server gets those it takes, in its own
fields (server_params.py), and an output format it cannot be asked for is refused, not dropped. A branch
(a reply that must start with given tokens) is the reply so far sent as the last, unfinished assistant
message, for servers that continue one. The API key goes only into the Authorization header: never into
an event, a message or a log line.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from ..base import Done, EngineError, Error, LabDone, Loaded, Message, ModelInfo, Request, Stream, written
from ..compare import MAX_COLUMNS, ColumnStream, overlapped
from ..formats import KINDS, FormatError, OutputFormat
from ..params import LiveParams, SamplingParams
from ..server_params import SERVE_BUILD, format_fields, server_fields, server_notes, thinking_fields
from ..templates import PLAIN
from .connection import Connection, CuttableStream
from .servers import (
    GENERIC,
    LLAMA_CPP_PYTHON,
    LLAMA_SERVER,
    PLAIN_FORMAT,
    TUI_CHAT_SERVE,
    VLLM,
    Served,
    is_plain,
    quantization,
    shown_name,
)
from .sse import SseDecoder
from .streamed import StreamedReply, stop_reason
from .wire import RemoteError, count, error_text, excerpt

BACKEND_NAME = "openai"
CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 120.0
TOKENIZE_TIMEOUT_S = 2.0
CHARS_PER_TOKEN = 4  # the usual rough figure for English text, where a server cannot count
_ERROR_BODY_LIMIT = 16_384


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    base_url: str
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S


class CutShort(RemoteError):
    """The server ended a reply without saying why: another request to it may have cut it short."""


class ToolsRefused(RemoteError):
    """The server refused a request for its tools: it cannot take them (llama-server without `--jinja`)."""


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
        raise RemoteError("base URL must start with http:// or https:// and name a host "
                          f"(got {display_url(base_url)!r})")
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
        self._implicit_stops: tuple[str, ...] = ()
        self._hint_empty = True  # until a reply with text comes, or the hint is given once
        # The last reply's conversation (its messages, then the reply) and the tokens the server counted of it
        self._counted: tuple[tuple[Message, ...], int] = ((), 0)
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        timeout = httpx.Timeout(settings.read_timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = httpx.Client(headers=headers, timeout=timeout)
        # Replies get a connection of their own, so cancel can cut it even before the headers arrive.
        self._streams = httpx.Client(headers=headers, timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0))
        self._live: set[Connection] = set()
        self._live_lock = threading.Lock()

    # --- public API ---------------------------------------------------------------------------

    def load(self) -> Stream:
        stream = Stream()
        threading.Thread(target=self._load, args=(stream,), name="remote-load", daemon=True).start()
        return stream

    def generate(self, request: Request) -> Stream:
        connection = Connection()
        stream = CuttableStream(connection)
        args = (request, stream, connection)
        threading.Thread(target=self._reply, args=args, name="remote-reply", daemon=True).start()
        return stream

    def count_tokens(self, text: str) -> int:
        """The server's own count where it has a tokenize endpoint, else CHARS_PER_TOKEN characters a token
        (also while a reply streams from a server that a second request would cut short)."""
        if self.info is None:
            raise EngineError("no model is loaded")
        if self.kind.tokenize_path is None or (self.kind.one_request_at_a_time and self._live):
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
            raise RemoteError(f"model {wanted!r} is not served at {self.host}; it serves: {excerpt(', '.join(served))}")
        facts = self._served(entries[served.index(wanted)])
        self.kind = facts.kind
        self._implicit_stops = PLAIN_FORMAT.implicit_stops if facts.plain else ()
        self.settings = replace(self.settings, model=wanted)
        if self.kind.counts_bos:
            self._bos_tokens = self._server_count("")
        counting = "tokens counted by the server" if self.kind.tokenize_path else (
            f"token counts estimated at {CHARS_PER_TOKEN} characters a token")
        return ModelInfo(
            name=shown_name(wanted),
            path=self.shown_url,
            description=f"{self.kind.name} · settings apply per reply · {counting}",
            quantization=facts.quantization,
            size_bytes=0,
            n_params=0,
            n_layers=0,
            gpu_layers=0,
            n_ctx=facts.n_ctx,
            n_ctx_train=0,
            chat_format=PLAIN if facts.plain else "server",
            backend=BACKEND_NAME,
            remote_host=self.host,
            params_per_token=False,
            ignored_params=self.kind.ignored(),
            ignored_formats=self.kind.ignored_formats(),
            notes=server_notes(self.kind.name),
        )

    def _model_entries(self) -> list[dict[str, Any]]:
        listing = self._get_json(f"{self.base_url}/models")
        entries = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(entries, list):
            raise RemoteError(f"{self.host} did not answer /models with a model list: is {self.shown_url} right?")
        return [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]

    def _served(self, entry: dict[str, Any]) -> Served:
        """Which server family this is (for its fields and tokenizer), and what it says of the model."""
        if entry.get("owned_by") == "vllm":
            return Served(VLLM, count(entry, "max_model_len") or 0)
        props = self._probe(f"{self.root_url}/props")
        if isinstance(props, dict) and "default_generation_settings" in props:
            n_ctx = count(props, "default_generation_settings", "n_ctx") or count(props, "n_ctx") or 0
            meta = entry.get("meta")
            meta = meta if isinstance(meta, dict) else {}
            quantized = quantization(meta.get("ftype") or props.get("model_ftype"))
            kind = TUI_CHAT_SERVE if props.get("build_info") == SERVE_BUILD else LLAMA_SERVER
            return Served(kind, n_ctx, quantized, is_plain(props.get("chat_template")))
        schema = self._probe(f"{self.root_url}/openapi.json")
        if isinstance(schema, dict) and "/extras/tokenize/count" in (schema.get("paths") or {}):
            return Served(LLAMA_CPP_PYTHON)
        return Served(GENERIC)

    def _probe(self, url: str) -> Any:
        """JSON at `url`, or None where the server has no such endpoint."""
        try:
            return self._get_json(url)
        except RemoteError:
            return None

    def _get_json(self, url: str) -> Any:
        return self._send(self._client.build_request("GET", url))

    def _server_count(self, text: str) -> int:
        path, make_body = self.kind.tokenize_path, self.kind.tokenize_body
        assert path is not None and make_body is not None, "asked only of a server that counts tokens"
        url = f"{self.root_url}/{path}"
        body = make_body(text, self.settings.model)
        answer = self._send(self._client.build_request("POST", url, json=body, timeout=TOKENIZE_TIMEOUT_S))
        tokens = count(answer, "count")
        if tokens is None and isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            tokens = len(answer["tokens"])
        if tokens is None:
            raise RemoteError(f"{self.host} answered tokenize without a count")
        return tokens

    def _send(self, request: httpx.Request) -> Any:
        try:
            response = self._client.send(request)
        except httpx.HTTPError as error:
            raise RemoteError(self._clean(self._network_message(error))) from None
        if response.status_code != 200:
            raise RemoteError(self._clean(self._status_message(response.status_code, _detail(response.text),
                                                               request.url.path)))
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RemoteError(f"{self.host} answered {request.url.path} with something other than JSON") from None

    # --- one reply ----------------------------------------------------------------------------

    def _reply(self, request: Request, stream: Stream, connection: Connection) -> None:
        version, params = request.params.snapshot()
        reply = StreamedReply(request, version, self.info.n_ctx if self.info else 0)
        try:
            done = self._answer(reply, params, stream, connection)
            self._remember(request, done)
            stream.put(done)
        except ToolsRefused as error:
            stream.put(Error(self._failure(error), tools_refused=True))
        except (EngineError, FormatError, httpx.HTTPError) as error:
            stream.put(Error(self._failure(error), reply.text, reply.reasoning))

    def _answer(self, reply: StreamedReply, params: SamplingParams, stream: Stream, connection: Connection) -> Done:
        """One request streamed into `stream`: its end (cancelled where it was), or raises what went wrong."""
        request = reply.request
        with self._live_lock:
            self._live.add(connection)
        try:
            if self.info is None:
                raise EngineError("no model is loaded")
            body = self._body(request, params)
            reply.given_start(stream)
            reply.estimated(self._estimate(request), stream)
            self._stream_into(reply, stream, connection, body)
        except (EngineError, FormatError, httpx.HTTPError):
            if stream.cancelled.is_set():
                return reply.done("cancelled")
            raise
        finally:
            with self._live_lock:
                self._live.discard(connection)
        if stream.cancelled.is_set():
            return reply.done("cancelled")
        if reply.metrics().prompt_estimated and self.kind.tokenize_path:
            self._recount(request, reply, stream)
        reason = stop_reason(reply.finish_reason, params, self._implicit_stops, reply.context_full)
        return self._checked(reply.done(reason, (*params.stop, *self._implicit_stops)))

    # --- the sampling lab ---------------------------------------------------------------------

    def compare(self, request: Request, columns: Sequence[LiveParams]) -> Stream:
        """The lab on a server: a request per column, all sent at once (llama-server with `--parallel` decodes
        them together). Each column's events come as `ColumnEvent`s, then one `LabDone` (or an `Error`)."""
        connections = [Connection() for _ in columns]
        stream = CuttableStream(*connections)
        args = (request, columns, stream, connections)
        threading.Thread(target=self._lab, args=args, name="remote-lab", daemon=True).start()
        return stream

    def _lab(self, request: Request, columns: Sequence[LiveParams], stream: Stream,
             connections: list[Connection]) -> None:
        if not 1 <= len(columns) <= MAX_COLUMNS:
            stream.put(Error(f"the lab compares 1 to {MAX_COLUMNS} settings side by side (got {len(columns)})"))
            return
        # each token's probability, even with the inspector off: the lab marks divergence and surprise
        asked = replace(request, top_logprobs=max(request.top_logprobs, 1))
        with ThreadPoolExecutor(len(columns), thread_name_prefix="remote-column") as pool:
            runs = [pool.submit(self._column, replace(asked, params=live), ColumnStream(stream, index), connection)
                    for index, (live, connection) in enumerate(zip(columns, connections, strict=True))]
            if wait(runs, return_when=FIRST_EXCEPTION).not_done:
                stream.cancel()  # one failed: the others stop, and its error is the lab's
        try:
            replies = [run.result() for run in runs]
        except (EngineError, FormatError, httpx.HTTPError) as error:
            stream.put(Error(self._failure(error)))
            return
        reads = [reply.read_prompt() for _, reply in replies]
        # the columns that wrote over a while: one token's moment tells nothing of the others'
        spans = [(reply.first_at, reply.last_at) for _, reply in replies
                 if reply.first_at is not None and reply.last_at is not None and reply.first_at < reply.last_at]
        serial = len(spans) > 1 and not overlapped(spans)
        cut = [str(index + 1) for index, (done, _) in enumerate(replies) if done.stop_reason == "cut"]
        note = " and ".join(filter(None, (
            "ran the columns one after another" if serial else "",
            f"cut column{'s' if len(cut) > 1 else ''} {', '.join(cut)} short" if cut else "")))
        stream.put(LabDone(tuple(done for done, _ in replies), None if None in reads else sum(map(bool, reads)),
                           not (serial or cut), f"the server {note}" if note else ""))

    def _column(self, request: Request, stream: Stream, connection: Connection) -> tuple[Done, StreamedReply]:
        """One column's request; a column the server ended unasked is cut, not failed."""
        version, params = request.params.snapshot()
        reply = StreamedReply(request, version, self.info.n_ctx if self.info else 0)
        try:
            done = self._answer(reply, params, stream, connection)
        except CutShort:
            done = reply.done("cut")
        stream.put(done)
        return done, reply

    def _checked(self, done: Done) -> Done:
        """An empty reply before any with text: the server's chat format is the likely cause; said once."""
        if written(done) or done.server_calls:
            self._hint_empty = False
        elif self._hint_empty and done.stop_reason in ("eos", "stop"):
            self._hint_empty = False
            return replace(done, note=f"the server wrote nothing: {self.kind.empty_reply}")
        return done

    def _estimate(self, request: Request) -> int:
        """The prompt's tokens until the server says: what it counted of the conversation so far, as the draft
        line bills it, and the messages after that at CHARS_PER_TOKEN characters a token."""
        counted, tokens = self._counted
        if request.messages[: len(counted)] != list(counted):
            counted, tokens = (), 0
        rest = replace(request, messages=request.messages[len(counted):])
        return tokens + math.ceil(len(_prompt_text(rest)) / CHARS_PER_TOKEN)

    def _remember(self, request: Request, done: Done) -> None:
        """A reply whose prompt the server counted: the next one's estimate starts from its count."""
        if not done.metrics.prompt_estimated and done.metrics.context_tokens:
            reply = Message("assistant", done.text, done.reasoning)
            self._counted = ((*request.messages, reply), done.metrics.context_tokens)

    def _recount(self, request: Request, reply: StreamedReply, stream: Stream) -> None:
        """The server never said how long the prompt was: its own tokenizer counts the messages, now that no
        reply streams (a request mid-stream cuts llama-cpp-python's). Still an estimate: the template's own
        tokens are not in it."""
        try:
            reply.estimated(self.count_tokens(_prompt_text(request)), stream)
        except EngineError:
            pass  # the characters' estimate stands

    def _body(self, request: Request, params: SamplingParams) -> dict[str, Any]:
        """The request: OpenAI's fields, then what this server takes of the rest. Raises RemoteError for a
        branch or an output format the server cannot be asked for."""
        messages = [_wire_message(m) for m in request.messages]
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": max(1, params.max_tokens - (0 if request.continuing else len(request.forced))),
        }
        if params.seed >= 0:
            body["seed"] = params.seed
        if params.stop or self._implicit_stops:
            body["stop"] = [*params.stop, *self._implicit_stops]
        body |= server_fields(self.kind.name, params)[0] | self._format_fields(request.format) | self.kind.reporting
        body |= thinking_fields(self.kind.name, request.thinking)
        if request.forced:
            messages.append({"role": "assistant", "content": self._given_start(request)})
            body |= self.kind.continues or {}  # `_given_start` refused a server that cannot continue
        if request.tools:
            body["tools"] = list(request.tools)
            body["tool_choice"] = wire_choice(request.tool_choice)
        if request.top_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.top_logprobs
        return body

    def _format_fields(self, output: OutputFormat) -> dict[str, Any]:
        fields = format_fields(self.kind.name, output)
        if fields is None:
            takes = ", ".join(KINDS[kind] for kind in KINDS if kind not in self.kind.ignored_formats())
            raise RemoteError(f"the {self.kind.name} at {self.host} cannot be asked for {output.label} output "
                              f"(it takes {takes}): choose another format")
        return fields

    def _given_start(self, request: Request) -> str:
        """A branch's start, as the text the server continues."""
        if self.kind.continues is None:
            raise RemoteError(f"the {self.kind.name} at {self.host} cannot continue a reply from a chosen token "
                              "(llama-server and vLLM can): regenerate instead")
        if len(request.forced_text) != len(request.forced):
            raise EngineError("a branch without the text of its tokens cannot go to a server")
        return "".join(request.forced_text)

    def _stream_into(self, reply: StreamedReply, stream: Stream, connection: Connection, body: dict[str, Any]) -> None:
        url = f"{self.base_url}/chat/completions"
        # Encoded here: llama-cpp-python reads a ban (-inf logit bias) as -Infinity, which httpx's own JSON refuses.
        content = json.dumps(body).encode()
        with self._streams.stream("POST", url, content=content, headers={"Content-Type": "application/json"},
                                  extensions={"trace": connection.trace}) as response:
            connection.attach(response)
            if response.status_code != 200:
                status, detail = response.status_code, _detail(_read_limited(response))
                if "tools" in body and _refuses_tools(status, detail):
                    raise ToolsRefused(f"the {self.kind.name} at {self.host} cannot take tools (it answered {status}"
                                       f"{f': {detail}' if detail else ''}): this chat goes on without them")
                raise RemoteError(self._status_message(status, detail, url))
            ended = self._read_events(response, reply, stream)
        if reply.finish_reason is None and not stream.cancelled.is_set():
            if ended:  # llama-cpp-python ends a stream so when another request arrives
                raise CutShort(f"the server at {self.host} ended the reply without saying why (another request "
                                  "to it may have cut it short)")
            raise RemoteError(f"the server at {self.host} closed the stream mid-reply")

    @staticmethod
    def _read_events(response: httpx.Response, reply: StreamedReply, stream: Stream) -> bool:
        """Feed the reply each event; True if the server marked the end of the stream ([DONE])."""
        decoder = SseDecoder()
        for line in response.iter_lines():
            data = decoder.feed(line)
            if data is not None and reply.take(data, stream):
                return True
        data = decoder.flush()
        return data is not None and reply.take(data, stream)

    # --- messages -----------------------------------------------------------------------------

    def _status_message(self, status: int, detail: str, path: str) -> str:
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

    def _failure(self, error: EngineError | FormatError | httpx.HTTPError) -> str:
        return self._clean(self._network_message(error) if isinstance(error, httpx.HTTPError) else str(error))

    def _network_message(self, error: httpx.HTTPError) -> str:
        if isinstance(error, httpx.ConnectError):
            reason = excerpt(str(error)) or "connection refused"
            return f"cannot connect to {self.host}: {reason}; is the server running?"
        if isinstance(error, httpx.TimeoutException):
            return f"the server at {self.host} did not answer in time ({type(error).__name__})"
        if isinstance(error, httpx.RemoteProtocolError):
            return f"the server at {self.host} broke off the reply: {excerpt(str(error))}"
        return f"connection to {self.host} failed: {excerpt(str(error)) or type(error).__name__}"

    def _clean(self, message: str) -> str:
        """Defence in depth: whatever a server echoes back, the key never reaches the user's screen."""
        key = self.settings.api_key
        return message.replace(key, "[api key]") if key else message


def wire_choice(choice: str) -> str | dict[str, Any]:
    """`tool_choice` as OpenAI's API takes it: auto, none, required, or the one function the reply must call."""
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _wire_message(message: Message) -> dict[str, Any]:
    """A message as OpenAI's API takes it: a step that called tools with its `tool_calls` (the arguments as JSON
    text), a tool's result with the `tool_call_id` it answers."""
    wire: dict[str, Any] = {"role": message.role, "content": message.content}  # "" not null: llama-cpp-python
    if message.tool_calls:
        wire["tool_calls"] = [call | {"function": call["function"] | {"arguments": _arguments_text(call)}}
                              for call in message.tool_calls]
    if message.tool_call_id:
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _arguments_text(call: dict[str, Any]) -> str:
    arguments = call["function"]["arguments"]
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _detail(body: str) -> str:
    """What an error body says, in one short line."""
    try:
        return error_text(json.loads(body))
    except (ValueError, RecursionError):
        return excerpt(body)


def _refuses_tools(status: int, detail: str) -> bool:
    """A request with tools refused as a bad request (not for the key, the model or the load), or with the
    server saying it is the tools."""
    return (400 <= status < 500 and status not in (401, 403, 404, 429)) or "tool" in detail.lower()


def _prompt_text(request: Request) -> str:
    return "\n".join(message.content for message in request.messages) + "".join(request.forced_text)


def _read_limited(response: httpx.Response) -> str:
    body = b""
    for part in response.iter_bytes():
        body += part
        if len(body) >= _ERROR_BODY_LIMIT:
            break
    return body[:_ERROR_BODY_LIMIT].decode("utf-8", errors="replace")
