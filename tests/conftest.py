"""Shared fixtures: isolated app directories, the tiny random model and the real starter model."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Never the real hub: huggingface_hub reads these once, at import, and tui-chat at each call; the
# hub tests point HF_ENDPOINT at their own fake hub. No token of the user's is read or sent.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="tui-chat-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)  # one per run, gone with it
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TMUX"):
    os.environ.pop(_name, None)

from fake_hub import FakeHub  # noqa: E402
from fake_openai import fake_server  # noqa: E402
from tiny_model import write_tiny_model  # noqa: E402
from tui_chat.engine.base import Done, Error, Loaded, Message, Request, Token  # noqa: E402
from tui_chat.engine.local import logs  # noqa: E402
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings  # noqa: E402
from tui_chat.engine.models import starter_path  # noqa: E402
from tui_chat.engine.params import LiveParams, SamplingParams  # noqa: E402
from tui_chat.tools.mcp import ToolServers  # noqa: E402
from tui_chat.tools.settings import ServerSpec  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=32)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that loads the starter is marked `starter`, whichever fixture brings it in (README's quick run,
    `-m "not starter"`, once loaded it through two tests marked by hand and one fixture that was not)."""
    for item in items:
        if "starter_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.starter)


@pytest.fixture(scope="session")
def shared_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir for the session, so the 253 MB starter model is unpacked once."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(autouse=True)
def isolated_dirs(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Config, data (the history too), logs and caches under tmp: tests never read or write the user's own
    files. Only the models folder (a link) and the cache are shared, so the starter model is unpacked once."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    # one cache for the session: on an AMX machine the CPU path's self-test then runs once, not per test
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_data_dir / "cache"))
    data = tmp_path_factory.mktemp("data")
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    shared_models = shared_data_dir / "tui-chat" / "models"
    shared_models.mkdir(parents=True, exist_ok=True)
    (data / "tui-chat").mkdir()
    (data / "tui-chat" / "models").symlink_to(shared_models, target_is_directory=True)
    return tmp_path


@pytest.fixture(scope="session", autouse=True)
def llama_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return logs.install(tmp_path_factory.mktemp("logs"))


def kv_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("tui-chat: kv cache:")]


class KvLog:
    """The KV cache's lines in a log of the test's own (an earlier test may have sent the log elsewhere)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen = 0

    def new_lines(self) -> list[str]:
        lines = kv_lines(self.path)
        self.seen, fresh = len(lines), lines[self.seen :]
        return fresh


@pytest.fixture
def kv_log(tmp_path: Path, llama_logs: Path):
    yield KvLog(logs.install(tmp_path / "test-logs"))
    logs.install(llama_logs.parent)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def thinker_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from thinking_model import write_thinker

    return write_thinker(tmp_path_factory.mktemp("thinker") / "qwen3-thinker.gguf")


@pytest.fixture(scope="session")
def starter_model(shared_data_dir: Path) -> Path:
    return starter_path(shared_data_dir / "tui-chat" / "models")


def open_backend(path: Path, **settings) -> LlamaBackend:
    backend = LlamaBackend(LlamaSettings(path, **settings))
    loaded = backend.load().result()
    assert isinstance(loaded, Loaded), loaded
    return backend


@pytest.fixture
def tiny(tiny_model: Path):
    backend = open_backend(tiny_model, n_ctx=1024)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def starter(starter_model: Path):
    backend = open_backend(starter_model, n_ctx=2048)
    yield backend
    backend.close()


def ask(backend, messages: list[Message] | str, params: SamplingParams = GREEDY, **request) -> Done:
    if isinstance(messages, str):
        messages = [Message("user", messages)]
    result = backend.generate(Request(messages, LiveParams(params), **request)).result()
    assert isinstance(result, Done), result
    return result


def collect(stream) -> tuple[list[Token], Done | Error]:
    tokens, final = [], None
    for event in stream:
        if isinstance(event, Token):
            tokens.append(event)
        elif isinstance(event, (Done, Error)):
            final = event
    return tokens, final


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch):
    """A hub on 127.0.0.1 that tui-chat (and `run_cli` processes) talk to instead of huggingface.co."""
    with FakeHub(token="hf_test_token") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A models dir of this test's own (the shared data dir keeps only the starter model)."""
    from tui_chat.config import models_dir

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return models_dir()


def run_cli(*args: str, timeout: float = 120, **options) -> subprocess.CompletedProcess:
    """`tui-chat ARGS` as a real process, as a script would call it."""
    return subprocess.run(
        [sys.executable, "-m", "tui_chat", *args], capture_output=True, text=True, timeout=timeout, check=False,
        **options,
    )


@pytest.fixture(scope="session")
def tiny_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real llama_cpp.server serving the tiny model as "tiny"; yields its base URL."""
    from llama_server import llama_cpp_server

    with llama_cpp_server(tiny_model, "tiny", 1024, tmp_path_factory.mktemp("server") / "tiny.log") as url:
        yield url


@pytest.fixture(scope="session")
def starter_server(starter_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real llama_cpp.server serving the starter model as "gemma-3-270m" in Gemma's turn format (the file
    names no template, and llama-2's makes it end at once); yields its base URL."""
    from llama_server import llama_cpp_server

    log = tmp_path_factory.mktemp("server") / "starter.log"
    with llama_cpp_server(starter_model, "gemma-3-270m", 2048, log, chat_format="gemma") as url:
        yield url


TIME = ServerSpec("time", sys.executable, ("-m", "mcp_server_time"))  # the real MCP server from PyPI


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolServers]:
    """Tool servers started as a module's tests need them, stopped after its last."""
    servers = ToolServers(tmp_path_factory.mktemp("logs"))
    yield servers
    servers.close()


@pytest.fixture
def fake():
    """The fake OpenAI-compatible server (fake_openai.py) on loopback."""
    with fake_server() as server:
        yield server
