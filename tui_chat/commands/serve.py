"""`tui-chat serve`: the model as an OpenAI- and Anthropic-compatible server for other programs (an editor, a
script, an agent, a second tui-chat), with the chat's figures for each request in the terminal.

The model runs in the engine process the app uses; several requests are decoded together (`--parallel`), each
in its share of the context. It listens on 127.0.0.1 unless told otherwise, and any other address needs an API
key. A request can reach the model and nothing else: no file, tool or other model.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config
from ..engine.base import Backend, EngineError, Error, Loaded, LoadProgress, ModelInfo, Serving
from ..engine.compare import MAX_SLOTS
from ..engine.factory import REMOTE_MARK
from ..engine.params import InvalidParameter
from ..pricing import find_preset
from .common import RUNTIME_ERROR, add_local_model_options, fail, opener_for

if TYPE_CHECKING:
    from ..serve.monitor import Monitor
    from ..serve.server import ServeOptions, TuiChatServer

KEY_ENV = "TUI_CHAT_API_KEY"
MAX_QUEUE = 1024
MAX_TIMEOUT_S = 3600.0
DEFAULT_CONNECTIONS, MAX_CONNECTIONS = 64, 4096


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", description="Serve the model over OpenAI's API (/v1/chat/completions, "
                                                     "/v1/completions, /v1/embeddings, /v1/models) and Anthropic's "
                                                     "(/v1/messages), several clients at once.")
    add_local_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="the address to listen on (default 127.0.0.1, this machine only; any other needs a key)")
    serve.add_argument("--port", type=int, default=8080, help="the port (default 8080; 0: any free one)")
    serve.add_argument("--api-key", metavar="KEY",
                       help=f"the key every request must send as `Authorization: Bearer KEY` (default: ${KEY_ENV})")
    serve.add_argument("--parallel", type=int, default=2, metavar="N",
                       help=f"requests decoded together, 1 to {MAX_SLOTS}, each in 1/N of the context (default 2; "
                            "llama-server's -np)")
    serve.add_argument("--queue", type=int, default=8, metavar="N",
                       help="requests that may wait for a place; more are answered 429 with Retry-After (default 8)")
    serve.add_argument("--max-body", type=int, metavar="BYTES", help="the largest request body taken (default 4 MiB)")
    serve.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="a connection that sends nothing this long (headers, a body, or between requests) is "
                            "closed (default 30)")
    serve.add_argument("--max-connections", type=int, default=DEFAULT_CONNECTIONS, metavar="N",
                       help="connections open at once, each a thread; one more is answered 503 with Retry-After "
                            f"and closed (default {DEFAULT_CONNECTIONS})")
    serve.add_argument("--embeddings", metavar="MODEL",
                       help="a dedicated embedding model for /v1/embeddings (a .gguf file or a downloaded model, "
                            "named as --model is), loaded beside the model (default: the model's own embeddings)")
    serve.add_argument("--no-ui", action="store_true", help="a line per request instead of the live view")
    serve.add_argument("--json-log", metavar="FILE", help="append one JSON line per request to FILE")
    serve.set_defaults(run=run)


def run(args: argparse.Namespace, config: Config) -> int:
    from ..serve.server import DEFAULT_MAX_BODY, DEFAULT_TIMEOUT_S, ServeOptions

    key = args.api_key if args.api_key is not None else os.environ.get(KEY_ENV, "")
    options = ServeOptions(args.host, _port(args.port), key, _within(args.parallel, "--parallel", 1, MAX_SLOTS),
                           _within(args.queue, "--queue", 0, MAX_QUEUE),
                           _within(args.max_body or DEFAULT_MAX_BODY, "--max-body", 1024, 2**31),
                           _timeout(DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout),
                           max_connections=_within(args.max_connections, "--max-connections", 4, MAX_CONNECTIONS))
    if not key and not _loopback(options.host):
        raise InvalidParameter(f"--host {options.host} can be reached from other machines: give --api-key KEY "
                               f"(or set {KEY_ENV}); without a key, listen on 127.0.0.1")
    if args.model and args.model.startswith(REMOTE_MARK):
        raise InvalidParameter("serve serves a local model (a .gguf file or a downloaded one), not another server's")
    # a server's slots draw a token a step each: no drafting, so no draft model loaded for nothing
    opener, model = opener_for(replace(config, draft="off"), args, engine_process=True)
    if args.embeddings:
        from ..config import models_dir
        from ..engine.factory import named_model

        options = replace(options, embeddings=named_model(args.embeddings, models_dir())[1])
        opener = opener.reconfigured(embeddings=args.embeddings)
    backend = opener(model)
    try:
        return _serve(backend, options, config, Path(args.json_log) if args.json_log else None, args.no_ui)
    finally:
        backend.close()


def _serve(backend: Backend, options: ServeOptions, config: Config, json_log: Path | None, plain: bool) -> int:
    from ..serve.monitor import Monitor
    from ..serve.server import TuiChatServer

    if not isinstance(backend, Serving):
        raise InvalidParameter("this model's engine cannot serve several requests")
    info = _loaded(backend)
    monitor = Monitor(find_preset(config.prices, config.price), json_log)
    try:
        server = TuiChatServer(options, backend, info, config.sampling, monitor)
    except OSError as error:
        return fail(f"cannot listen on {options.host}:{options.port}: {error.strerror or error}", RUNTIME_ERROR)
    where = f"http://{options.host}:{server.server_port}/v1"
    try:
        if plain:
            return _plain(server, monitor, where)
        from ..ui.serve import ServeApp

        ServeApp(server, monitor, where).run()
        return 0
    finally:
        server.server_close()
        monitor.close()


def _plain(server: TuiChatServer, monitor: Monitor, where: str) -> int:
    """`--no-ui`: a line as the server starts, one per request as it ends, the totals at Ctrl+C."""
    from ..serve.monitor import RequestRecord, request_line, totals_line

    def ended(record: RequestRecord) -> None:
        if record.state not in ("waiting", "running"):
            print(request_line(record), flush=True)

    monitor.watchers.append(ended)
    info = server.info
    print(f"tui-chat serve: {info.name} ({info.offload}) at {where} · {server.options.parallel} at once, "
          f"{server.room:,} tokens of context each{_embedding_words(server.options.embeddings)} · Ctrl+C stops",
          flush=True)
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    print(f"tui-chat serve: stopped · {totals_line(monitor.totals)}", flush=True)
    return 0


def _embedding_words(name: str) -> str:
    return f" · embeddings by {name}" if name else ""


def _loaded(backend: Backend) -> ModelInfo:
    """Load the model, its progress on stderr (a terminal's); the model's facts once loaded."""
    shown = -1
    for event in backend.load():
        if isinstance(event, LoadProgress) and sys.stderr.isatty() and int(event.fraction * 20) != shown:
            shown = int(event.fraction * 20)
            print(f"\rloading {event.fraction:4.0%} {event.stage}"[:79].ljust(79), end="", file=sys.stderr, flush=True)
        elif isinstance(event, Loaded):
            if shown >= 0:
                print("\r" + " " * 79 + "\r", end="", file=sys.stderr, flush=True)
            return event.info
        elif isinstance(event, Error):
            raise EngineError(event.message)
    raise EngineError("the model did not load")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port(port: int) -> int:
    return _within(port, "--port", 0, 65535)


def _within(value: int, flag: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidParameter(f"{flag} must be from {low:,} to {high:,} (got {value:,})")
    return value


def _timeout(seconds: float) -> float:
    if not 0.1 <= seconds <= MAX_TIMEOUT_S:
        raise InvalidParameter(f"--timeout must be from 0.1 to {MAX_TIMEOUT_S:,g} seconds (got {seconds:g})")
    return seconds
