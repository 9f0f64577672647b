"""A hand-written MCP server over stdio (JSON-RPC lines, no SDK) for what the SDK's server would refuse to send:
`python tests/mcp_raw.py bad-schema` lists a valid `echo` beside a tool whose input schema is not a JSON schema
(`required` a string, a property's type a number) and one that is not a tool at all (no name)."""

from __future__ import annotations

import json
import sys

ECHO = {"name": "echo", "description": "Return the text given.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
BROKEN = {"name": "broken", "description": "Its schema is wrong.",
          "inputSchema": {"type": "object", "properties": {"a": {"type": 5}}, "required": "a"}}
NAMELESS = {"description": "No name.", "inputSchema": {"type": "object"}, "icons": "not a list"}


def answer(request: dict) -> dict | None:
    method = request.get("method")
    if method == "initialize":
        return {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"}}
    if method == "tools/list":
        return {"tools": [ECHO, BROKEN, NAMELESS]}
    if method == "tools/call":
        text = request["params"].get("arguments", {}).get("text", "")
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    return None


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        result = answer(request)
        reply = ({"jsonrpc": "2.0", "id": request["id"], "result": result} if result is not None else
                 {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "no such method"}})
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
