"""Loads each model file named on the command line with the real backend and asks one short turn,
printing one JSON line per file. test_gguf_fuzz.py runs it as a child process, so that a llama.cpp
abort takes down only this process, and the last `start` line names the file that did it.

Usage: python load_models.py LOG_DIR MODEL...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tui_chat.engine.base import Loaded, Message, Request
from tui_chat.engine.local import logs
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import LiveParams, SamplingParams

TURN = SamplingParams(temperature=0.0, max_tokens=4)


def main(log_dir: str, paths: list[str]) -> None:
    logs.install(Path(log_dir))
    for path in paths:
        print(json.dumps({"start": path}), flush=True)
        backend = LlamaBackend(LlamaSettings(Path(path), n_ctx=256, gpu_layers=0))
        try:
            result = backend.load().result()
            if isinstance(result, Loaded):
                result = backend.generate(Request([Message("user", "Hello")], LiveParams(TURN))).result()
        finally:
            backend.close()
        print(json.dumps({"path": path, "event": type(result).__name__, "message": getattr(result, "message", "")}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
