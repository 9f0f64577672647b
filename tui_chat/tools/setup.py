"""Tools for a chat from what the user named: servers by name (`[mcp.servers.NAME]`) or by command, the tool
choice checked against what they list, and who consents (the Workspace's one `Consent`, which each front-end
sets once). The headless runner and the chat screen use it through the Workspace."""

from __future__ import annotations

from collections.abc import Sequence

from ..engine.base import ModelInfo
from ..engine.params import InvalidParameter
from .calls import call_form, check_choice
from .loop import Consent, ToolUse, result_budget
from .mcp import Tool, ToolServers
from .settings import McpSettings, ServerSpec, server_from_command


def server_specs(named: Sequence[str], settings: McpSettings) -> list[ServerSpec]:
    """`--mcp` values: a configured server's name, or a command line. Raises InvalidParameter."""
    specs: list[ServerSpec] = []
    for text in named:
        spec = settings.servers.get(text.strip()) or server_from_command(text, {spec.name for spec in specs})
        if spec.name in {known.name for known in specs}:
            raise InvalidParameter(f"--mcp {text!r}: that server is named twice")
        specs.append(spec)
    return specs


def tool_use(servers: ToolServers, tools: list[Tool], settings: McpSettings, info: ModelInfo | None, choice: str,
             consent: Consent) -> ToolUse:
    """A chat's tools, from tools its servers listed: the chat screen's switches give them, `run` all of its
    servers'. Raises InvalidParameter (a choice naming no tool; two tools of one name)."""
    names = [tool.name for tool in tools]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise InvalidParameter(f"two servers list a tool named {twice!r}: use one of them")
    return ToolUse(servers, tools, consent, check_choice(choice, tools), settings.call_limit,
                   settings.call_timeout_s, result_budget(info.n_ctx if info is not None else 0),
                   form=call_form(info))
