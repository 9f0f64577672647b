"""A real `python -m llama_cpp.server` on a free 127.0.0.1 port, for the remote backend's tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

READY_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def llama_cpp_server(model: Path, alias: str, n_ctx: int, log: Path, chat_format: str | None = None,
                     interrupting: bool = True) -> Iterator[str]:
    """Serve `model` as `alias`; yields the base URL once `/v1/models` answers, kills the server after.

    Without `chat_format` the server uses the model's template, or llama-2's where it has none. `interrupting`
    (the server's default): a request that arrives ends the reply streaming; without, it waits its turn."""
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", alias,
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_gpu_layers", "0"]
    if chat_format:
        command += ["--chat_format", chat_format]
    if not interrupting:
        command += ["--interrupt_requests", "False"]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(process, base_url, log)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(process: subprocess.Popen, base_url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base_url}/models", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama_cpp.server not ready after {READY_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")
