"""Tools: MCP servers (mcp.py), the calls a model writes and how they are constrained (calls.py), and the loop
that runs them with the user's consent and feeds their results back (loop.py). No Textual here."""
