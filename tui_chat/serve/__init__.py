"""`tui-chat serve`: the engine as an OpenAI-compatible server (no Textual here; its view is ui/serve.py)."""
