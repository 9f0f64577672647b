"""The backend for OpenAI-compatible servers (llama.cpp's llama-server, vLLM, Ollama, llama-cpp-python).

  wire.py        what a streamed `chat.completion.chunk` says (pure parsing, untrusted input)
  servers.py     what each family of servers does beyond OpenAI's API (counting, reporting, continuing), as data
  streamed.py    one reply as it streams in: text, tokens and metrics
  connection.py  the socket under a reply, so a cancel from any thread cuts it at once
  backend.py     `OpenAIBackend`: loads (lists and picks the model), streams replies, counts tokens
"""

from .backend import OpenAIBackend, RemoteSettings, check_base_url, display_url
from .wire import MalformedEvent, RemoteError, parse_chunk

__all__ = ["MalformedEvent", "OpenAIBackend", "RemoteError", "RemoteSettings", "check_base_url", "display_url",
           "parse_chunk"]
