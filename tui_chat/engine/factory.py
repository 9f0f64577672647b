"""Opening a backend by model name: the one place that knows which engine serves a name, and the only
engine module that may use the hub (to find a downloaded model by its hub name).

Wherever a model is named (`--model`, `default_model`, Ctrl+O, a saved chat), `@PROFILE` or
`@PROFILE:MODEL` means a server of the config, `@http://HOST:PORT` (or https) a server at that address that
needs no key (`tui-chat serve` on this machine, a llama-server); anything else is a local GGUF model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .base import Backend, EngineError
from .models import resolve_model

if TYPE_CHECKING:
    from .local.settings import LlamaSettings
    from .openai import RemoteSettings

REMOTE_MARK = "@"
URL_SCHEMES = ("http://", "https://")


def remote_spec(profile: str, model: str | None = None) -> str:
    """How a model on a server is named: `@PROFILE` or `@PROFILE:MODEL`."""
    return f"{REMOTE_MARK}{profile}" + (f":{model}" if model else "")


@dataclass(frozen=True, slots=True)
class LocalOptions:
    """How local models are opened in this run (from the config and the command line)."""

    default_model: str | None
    models_dir: Path
    log_dir: Path
    n_ctx: int
    gpu_layers: int | None = None
    chat_template: str = "auto"
    threads: int | None = None
    threads_batch: int | None = None
    extra_buffers: str = "auto"
    cache_dir: Path | None = None
    kv_dir: Path | None = None  # KV states saved after each reply, restored later (None: none saved)
    kv_budget_bytes: int = 0  # their total size (0: none saved)
    draft: str = "off"  # speculative decoding's drafter (local/draft.py)
    # Each model's engine in a process of its own (process.py): the chat UI's choice; `run`, which has no UI to
    # share a lock with, keeps it in its own process
    engine_process: bool = False
    embeddings: str | None = None  # a dedicated embedding model, named as a model is (`serve --embeddings`)


class ServerProfile(Protocol):
    """A `[remotes.NAME]` table (config.RemoteProfile, frozen: so read-only here): the key is read only when a
    backend opens."""

    @property
    def base_url(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def timeout_s(self) -> float: ...

    def resolved_api_key(self) -> str | None: ...


class BackendOpener:
    """Opens a backend for a model name, not yet loaded (call `load()`); used off the UI thread.

    llama_cpp is imported only when a local model opens, so the UI can draw before it loads.
    """

    def __init__(self, local: LocalOptions, servers: Mapping[str, ServerProfile] | None = None) -> None:
        self.local = local
        self.servers = dict(servers or {})

    def reconfigured(self, **changes: Any) -> BackendOpener:
        """The same opener with other local options (a context size or GPU layers chosen in the app)."""
        return BackendOpener(replace(self.local, **changes), self.servers)

    def __call__(self, name: str | None) -> Backend:
        name = name or self.local.default_model
        if name and name.startswith(REMOTE_MARK):
            return self._open_server(name)
        return self._open_local(name)

    def _open_local(self, name: str | None) -> Backend:
        from ..hub.local import mark_used
        from .local.settings import LlamaSettings

        local = self.local
        path = model_file(name, local.default_model, local.models_dir)
        mark_used(local.models_dir, path)
        shown = name if name and not name.lower().endswith(".gguf") else path.stem
        settings = LlamaSettings(path, n_ctx=local.n_ctx, gpu_layers=local.gpu_layers,
                                 chat_template=local.chat_template, extra_buffers=local.extra_buffers,
                                 threads=local.threads, threads_batch=local.threads_batch, cache_dir=local.cache_dir,
                                 kv_dir=local.kv_dir, kv_budget_bytes=local.kv_budget_bytes, draft=local.draft)
        if local.embeddings:
            embeddings, embeddings_name = named_model(local.embeddings, local.models_dir)
            settings = replace(settings, embeddings=embeddings, embeddings_name=embeddings_name)
        make = partial(local_backend, settings, shown, local.log_dir)
        if not local.engine_process:
            return make()
        from .process import LocalEngineProcess

        return LocalEngineProcess(make, local.log_dir)

    def _profile_settings(self, name: str) -> RemoteSettings:
        """A `[remotes.PROFILE]` server's settings, the model named after the colon or the profile's."""
        from .openai import RemoteSettings

        profile_name, _, model = name[len(REMOTE_MARK):].partition(":")
        profile = self.servers.get(profile_name)
        if profile is None:
            known = ", ".join(remote_spec(known) for known in sorted(self.servers)) or "none in the config's [remotes]"
            raise EngineError(f"unknown server {name!r} (known: {known})")
        try:
            api_key = profile.resolved_api_key()
        except ValueError as error:  # the config's one-line error: the key's variable is not set
            raise EngineError(str(error)) from None
        return RemoteSettings(profile.base_url, model or profile.model, api_key, profile.timeout_s)

    def _open_server(self, name: str) -> Backend:
        from .openai import OpenAIBackend, RemoteSettings

        spec = name[len(REMOTE_MARK):]
        if spec.startswith(URL_SCHEMES):
            root = spec.rstrip("/")
            settings = RemoteSettings(root if root.endswith("/v1") else f"{root}/v1")
        else:
            settings = self._profile_settings(name)
        make = partial(OpenAIBackend, settings)
        if not self.local.engine_process:
            return make()
        from .process import EngineProcess

        return EngineProcess(make, self.local.log_dir)


def local_backend(settings: LlamaSettings, name: str, log_dir: Path) -> Backend:
    """The llama.cpp backend, built where it runs (in the engine process, or in this one)."""
    from .local import logs
    from .local.llama import LlamaBackend

    logs.install(log_dir)
    return LlamaBackend(settings, name=name)


def model_file(name: str | None, default_model: str | None, models_dir: Path) -> Path:
    """The .gguf file a local model name means: a path, the starter, or a model in our models dir named
    `OWNER/NAME:FILE` or by its file name (never a network call)."""
    return resolve_model(name, default_model, models_dir, _downloaded_or_imported)


def named_model(name: str, models_dir: Path) -> tuple[Path, str]:
    """A local model's file and the name it goes by: as given, or its file's stem where it was given as a path."""
    path = model_file(name, None, models_dir)
    return path, name if not name.lower().endswith(".gguf") else path.stem


def count_text_tokens(model: str | None, text: str, *, default_model: str | None, models_dir: Path,
                      log_dir: Path) -> int:
    """Tokens `text` takes in `model`'s own tokenizer, reading only its vocabulary (no weights)."""
    from .local import logs
    from .local.llamacpp import count_tokens

    path = model_file(model, default_model, models_dir)
    logs.install(log_dir)
    return count_tokens(path, text)


def _downloaded_or_imported(name: str, models_dir: Path) -> Path | None:
    from ..hub import HubError
    from ..hub.local import resolve_local

    try:
        return resolve_local(name, models_dir)
    except HubError as error:
        raise EngineError(str(error)) from None
