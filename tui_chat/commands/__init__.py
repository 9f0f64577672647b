"""The `tui-chat` commands, one module each with `add_parser(commands)` and a `run(args, config) -> int`
(the chat UI, the default, has only `run`); `common.py` holds what they share.

A command's module, and what it pulls in (SQLite, the hub, llama.cpp, Textual), is imported only when that
command runs or its `--help` is asked for: `tui-chat --help` lists the commands from SUMMARIES alone, so a
module's `add_parser` gives its parsers no `help=` (their line is here)."""

SUMMARIES = {  # command: (its module in this package, its line in `tui-chat --help`)
    "run": ("run", "answer prompts without the UI (tokens stream to stdout)"),
    "estimate": ("estimate", "what a workload would cost on a paid API"),
    "history": ("history", "list saved conversations, most recent first"),
    "export": ("history", "write a saved conversation as Markdown or JSON"),
    "import": ("history", "add a conversation from a JSON export to the history"),
    "models": ("models", "find, download and manage GGUF models (hub and local)"),
    "cache": ("cache", "list the saved KV caches (model, tokens, size, last used), or clear them"),
    "serve": ("serve", "serve the model over OpenAI's API to other programs, several at once"),
    "info": ("info", "versions, what llama.cpp can use here, and the paths in use"),
}
