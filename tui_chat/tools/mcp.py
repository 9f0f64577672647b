"""MCP servers through the official SDK, owned for as long as the app runs (the Workspace holds them).

The SDK is asyncio; the app is threads. One event loop runs on a daemon thread of its own, and every server
is a task there that holds its connection open until it is stopped (the SDK's transports must be entered and
left in the same task). The rest of the app calls `start`, `call` and `close` from any thread, each bounded
by a timeout: a server that does not start, hangs or dies is one line (`ToolError`), never a hang. A stdio
server's stderr goes to `mcp.log` in the log folder, not to the terminal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..safetext import terminal_safe
from .settings import ServerSpec

CANCEL_POLL_S = 0.1  # how soon a stopped reply's running call is given up
STOP_TIMEOUT_S = 5.0  # a server's own shutdown (the SDK's grace period, then a kill), then it is left behind
MAX_ERROR_CHARS = 300


class ToolError(Exception):
    """A server or a call that failed: one line for the user."""


class CallCancelled(ToolError):
    """The reply was stopped while its call ran."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool as a server lists it; `schema` is its `inputSchema` (a JSON schema of the arguments object)."""

    server: str
    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a call returned: its text (every text part, and any other part named), and whether the tool
    itself said it failed (`isError`)."""

    text: str
    is_error: bool
    ms: float


@dataclass(eq=False)
class _Server:
    spec: ServerSpec
    session: Any = None  # mcp.ClientSession once it answers
    tools: list[Tool] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # a line for each listed tool that cannot be used
    stop: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None


class ToolServers:
    """The MCP servers of this run, started on demand. Safe from any thread."""

    def __init__(self, log_dir: Path | None) -> None:
        self.log_dir = log_dir
        self._servers: dict[str, _Server] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._errlog: TextIO | None = None

    @property
    def tools(self) -> list[Tool]:
        return [tool for server in self._servers.values() for tool in server.tools]

    def left_out(self, name: str) -> list[str]:
        """One line for each tool server `name` listed that cannot be used (its schema is not a JSON schema of
        an object, or the listing is not a tool): the server's other tools are."""
        server = self._servers.get(name)
        return list(server.left_out) if server is not None else []

    def start(self, spec: ServerSpec, timeout_s: float) -> list[Tool]:
        """Start `spec` (once: a started one answers with its tools) and list its tools. Raises ToolError."""
        with self._lock:
            running = self._servers.get(spec.name)
            if running is not None and running.session is not None:
                return running.tools
            server = self._servers[spec.name] = _Server(spec)
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        loop = self._event_loop()
        asyncio.run_coroutine_threadsafe(self._begin(server, ready), loop)
        try:
            ready.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self._stop(server)
            raise ToolError(f"MCP server {spec.name!r} ({spec.shown}) did not start within {timeout_s:g} s") from None
        except Exception as error:  # noqa: BLE001 - whatever the SDK or the process raised: one line
            self._stop(server)
            raise ToolError(f"MCP server {spec.name!r} ({spec.shown}) did not start: {_reason(error)}"
                            f"{self._see_log(spec)}") from None
        return server.tools

    def call(self, tool: Tool, arguments: dict[str, Any], timeout_s: float,
             cancelled: threading.Event | None = None) -> Outcome:
        """Run `tool`; raises ToolError when its server is gone, dies or does not answer within `timeout_s`,
        CallCancelled within CANCEL_POLL_S of `cancelled` being set (the SDK tells the server)."""
        server = self._servers.get(tool.server)
        if server is None or server.session is None:
            raise ToolError(f"MCP server {tool.server!r} is not running")
        started = time.perf_counter()
        future = asyncio.run_coroutine_threadsafe(server.session.call_tool(tool.name, arguments),
                                                  self._event_loop())
        try:
            result = _awaited(future, started + timeout_s, cancelled)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolError(f"{tool.name} did not answer within {timeout_s:g} s") from None
        except CallCancelled:
            future.cancel()
            raise
        except Exception as error:  # noqa: BLE001 - the server died, or broke the protocol
            alive = server.task is not None and not server.task.done()
            where = "" if alive else f": MCP server {tool.server!r} stopped{self._see_log(server.spec)}"
            raise ToolError(f"{tool.name} failed: {_reason(error)}{where}") from None
        ms = (time.perf_counter() - started) * 1000
        return Outcome(_text_of(result), bool(getattr(result, "is_error", False)), ms)

    def close(self) -> None:
        """Stop every server (each within its grace period) and the loop."""
        for server in list(self._servers.values()):
            self._stop(server)
        self._servers.clear()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    # --- the event loop's side ------------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mcp-servers", daemon=True).start()
                self._loop = loop
            return self._loop

    async def _begin(self, server: _Server, ready: concurrent.futures.Future[None]) -> None:
        server.stop = asyncio.Event()
        server.task = asyncio.current_task()
        try:
            await self._serve(server, ready)
        except BaseException as error:  # noqa: BLE001 - reported through `ready`, or the server is gone
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else ToolError("cancelled"))
        finally:
            server.session = None

    async def _serve(self, server: _Server, ready: concurrent.futures.Future[None]) -> None:
        from mcp import ClientSession

        async with contextlib.AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(self._transport(server.spec))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            server.tools, server.left_out = await _listed(server.spec.name, session)
            server.session = session
            ready.set_result(None)
            assert server.stop is not None
            await server.stop.wait()

    def _transport(self, spec: ServerSpec) -> contextlib.AbstractAsyncContextManager[Any]:
        if spec.url:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(spec.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client

        env = None if spec.env is None else get_default_environment() | spec.env
        return stdio_client(StdioServerParameters(command=spec.command, args=list(spec.args), env=env),
                            errlog=self._stderr())

    def _stderr(self) -> TextIO:
        """Where the servers' stderr goes: `mcp.log` in the log folder (the null device where it cannot be
        written)."""
        if self._errlog is None:
            path = Path("/dev/null") if self.log_dir is None else self.log_dir / "mcp.log"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._errlog = path.open("a", encoding="utf-8", buffering=1)
            except OSError:
                self._errlog = Path("/dev/null").open("w", encoding="utf-8")
        return self._errlog

    def _see_log(self, spec: ServerSpec) -> str:
        return "" if spec.url or self.log_dir is None else f" (its stderr is in {self.log_dir / 'mcp.log'})"

    def _stop(self, server: _Server) -> None:
        loop = self._loop
        if loop is None or server.task is None:
            return
        stopped = asyncio.run_coroutine_threadsafe(_ended(server), loop)
        try:
            stopped.result(timeout=STOP_TIMEOUT_S + 1)
        except (concurrent.futures.TimeoutError, Exception):  # noqa: BLE001 - left behind: a daemon thread's
            pass
        with self._lock:
            if self._servers.get(server.spec.name) is server:
                del self._servers[server.spec.name]


def _awaited(future: concurrent.futures.Future[Any], deadline: float, cancelled: threading.Event | None) -> Any:
    """The call's result by `deadline` (perf_counter), unless `cancelled` is set first."""
    while True:
        if cancelled is not None and cancelled.is_set():
            raise CallCancelled("stopped while it ran")
        left = deadline - time.perf_counter()
        if left <= 0:
            raise concurrent.futures.TimeoutError
        try:
            return future.result(timeout=min(left, CANCEL_POLL_S) if cancelled is not None else left)
        except concurrent.futures.TimeoutError:
            continue


async def _ended(server: _Server) -> None:
    """Ask the server's task to leave its connection (the SDK ends the process), cancelling it past the grace."""
    if server.stop is not None:
        server.stop.set()
    if server.task is None:
        return
    try:
        await asyncio.wait_for(asyncio.shield(server.task), STOP_TIMEOUT_S)
    except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - ending it is all that is wanted
        server.task.cancel()


async def _listed(name: str, session: Any) -> tuple[list[Tool], list[str]]:
    """The server's tools, each checked on its own, and a line for each left out: the SDK refuses a whole
    listing for one bad tool, so such a listing is read as sent and its good tools given back to the SDK
    (which checks a call's result against its tool's listing, and lists again where it has none)."""
    from mcp import types
    from pydantic import ValidationError

    tools: list[Tool] = []
    left_out: list[str] = []
    cursor = None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        try:
            listed = (await session.list_tools(params=params)).model_dump(by_alias=True, exclude_none=True)
            checked: list[Any] | None = None
        except ValidationError:
            # The SDK (pinned < 3) has no public way to read a listing it refuses, nor to take a listing back.
            listed = await session._dispatcher.send_raw_request(  # noqa: SLF001
                "tools/list", params.model_dump(by_alias=True, exclude_none=True) if params else None, {})
            checked = []
        for entry in listed.get("tools") or []:
            tool, problem = _tool(name, entry)
            if tool is None:
                left_out.append(problem)
                continue
            tools.append(Tool(name, tool.name, tool.description or "", tool.input_schema))
            if checked is not None:
                checked.append(tool)
        cursor = listed.get("nextCursor") if isinstance(listed.get("nextCursor"), str) else None
        if checked is not None:
            session._absorb_tool_listing(types.ListToolsResult(tools=checked),  # noqa: SLF001
                                         complete=params is None and cursor is None)
        if not cursor:
            return tools, left_out


def _tool(server: str, entry: Any) -> tuple[Any, str]:
    """A listed tool as the SDK reads it, or None and why it cannot be used, in one line naming it."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    from mcp import types
    from pydantic import ValidationError

    name = entry.get("name") if isinstance(entry, dict) else None
    shown = f"{server}: tool {terminal_safe(name)!r}" if isinstance(name, str) else f"{server}: a tool with no name"
    try:
        tool = types.Tool.model_validate(entry)
        Draft202012Validator.check_schema(tool.input_schema)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the tool"
        return None, terminal_safe(f"{shown} left out: {where}: {first['msg']}"[:MAX_ERROR_CHARS])
    except SchemaError as error:
        where = ".".join(str(part) for part in error.absolute_path) or "the schema"
        return None, terminal_safe(f"{shown} left out: its input schema's {where}: {error.message}"[:MAX_ERROR_CHARS])
    if tool.input_schema.get("type", "object") != "object":
        return None, f"{shown} left out: its input schema is not an object's"
    return tool, ""


def _text_of(result: Any) -> str:
    """A call's content as text: text parts as they are, other parts (images, resources) named."""
    parts = []
    for part in getattr(result, "content", None) or []:
        text = getattr(part, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(part, 'type', 'content')} part left out]")
    return "\n".join(parts)


def _reason(error: BaseException) -> str:
    """An exception as one short line; an exception group by its first cause (anyio's task groups wrap them)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, FileNotFoundError):
        text = f"no such program {error.filename!r}" if error.filename else text
    return terminal_safe(text[:MAX_ERROR_CHARS])
