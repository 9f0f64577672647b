"""`[mcp]` in the config: the servers by name, the calls one reply may make and how long one may take. Read
with the config, so nothing here imports the MCP SDK."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..engine.params import InvalidParameter

DEFAULT_CALL_LIMIT = 8  # tool calls in one reply; then the model must answer
DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 30.0  # starting a server and listing its tools
_SERVER_KEYS = {"command", "args", "env", "url"}
_MCP_KEYS = {"servers", "call_limit", "call_timeout_s", "start_timeout_s"}


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One MCP server: a command started as a child process (stdio), or a streamable-HTTP `url`."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    url: str = ""

    @property
    def shown(self) -> str:
        return self.url or shlex.join([self.command, *self.args])


@dataclass(frozen=True, slots=True)
class McpSettings:
    servers: dict[str, ServerSpec] = field(default_factory=dict)
    call_limit: int = DEFAULT_CALL_LIMIT
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S


def server_from_command(text: str, taken: set[str]) -> ServerSpec:
    """`--mcp 'python -m mcp_server_time'`: named after its command's last word (`mcp_server_time`), numbered
    when that name is taken. Raises InvalidParameter."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise InvalidParameter(f"--mcp {text!r}: {error}") from None
    if not words:
        raise InvalidParameter("--mcp needs a server's command, or the name of one in [mcp.servers]")
    base = words[-1].rsplit("/", 1)[-1] or "server"
    name, number = base, 2
    while name in taken:
        name, number = f"{base}-{number}", number + 1
    return ServerSpec(name, words[0], tuple(words[1:]))


def parse_mcp(raw: Any) -> McpSettings:
    """The `[mcp]` table; raises InvalidParameter naming what is wrong."""
    if not isinstance(raw, dict):
        raise InvalidParameter("[mcp] must be a table")
    unknown = sorted(set(raw) - _MCP_KEYS)
    if unknown:
        raise InvalidParameter(f"[mcp]: unknown setting {unknown[0]!r} (known: {', '.join(sorted(_MCP_KEYS))})")
    servers = raw.get("servers", {})
    if not isinstance(servers, dict) or not all(isinstance(table, dict) for table in servers.values()):
        raise InvalidParameter('[mcp.servers] must hold tables such as [mcp.servers.time] with command = "uvx"')
    limit = raw.get("call_limit", DEFAULT_CALL_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
        raise InvalidParameter(f"[mcp] call_limit must be a whole number from 1 to 100 (got {limit!r})")
    return McpSettings({name: _server(name, table) for name, table in servers.items()}, limit,
                       _seconds(raw, "call_timeout_s", DEFAULT_CALL_TIMEOUT_S),
                       _seconds(raw, "start_timeout_s", DEFAULT_START_TIMEOUT_S))


def _seconds(raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
        raise InvalidParameter(f"[mcp] {key} must be a number of seconds between 0 and 3600 (got {value!r})")
    return float(value)


def _server(name: str, table: dict[str, Any]) -> ServerSpec:
    where = f"[mcp.servers.{name}]"
    unknown = sorted(set(table) - _SERVER_KEYS)
    if unknown:
        raise InvalidParameter(f"{where}: unknown setting {unknown[0]!r} (known: {', '.join(sorted(_SERVER_KEYS))})")
    command, url = table.get("command", ""), table.get("url", "")
    if not isinstance(command, str) or not isinstance(url, str) or bool(command) == bool(url):
        raise InvalidParameter(f'{where}: give command = "…" (a program started over stdio) or url = "http://…"')
    if url and not url.startswith(("http://", "https://")):
        raise InvalidParameter(f"{where}: url must be an http:// or https:// URL")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise InvalidParameter(f'{where}: args must be a list of text, e.g. ["-m", "mcp_server_time"]')
    env = table.get("env")
    if env is not None and (not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
        raise InvalidParameter(f'{where}: env must map names to text, e.g. {{TZ = "UTC"}}')
    return ServerSpec(name, command, tuple(args), env, url)
