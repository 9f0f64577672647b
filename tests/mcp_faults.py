"""An MCP server written with the SDK for the fault tests: each tool fails in one way. Run as
`python tests/mcp_faults.py` (stdio); `--http PORT` serves it over streamable HTTP at
http://127.0.0.1:PORT/mcp; `--no-start` exits before it speaks MCP."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("faults")


@server.tool(description="Return the text given.")
def echo(text: str) -> str:
    return text


@server.tool(description="The server process dies while answering.")
def crash() -> str:
    print("faults: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool(description="Never answers.")
def hang() -> str:
    time.sleep(3600)
    return "late"


@server.tool(description="Answers with 10 MB of text.")
def huge() -> str:
    return "x" * (10 << 20)


@server.tool(description="Answers with terminal escapes.")
def escapes() -> str:
    return "red \x1b[31mRED\x1b[0m title \x1b]0;owned\x07 done"


@server.tool(description="Says it failed.")
def fails() -> str:
    raise ValueError("the tool could not do it")


if __name__ == "__main__":
    if "--no-start" in sys.argv:
        print("faults: refusing to start", file=sys.stderr)
        sys.exit(1)
    if "--http" in sys.argv:
        server.run("streamable-http", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run()
