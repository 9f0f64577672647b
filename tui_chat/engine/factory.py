"""Opening a backend by model name: the one place that knows which engine class serves a name."""

from __future__ import annotations

from pathlib import Path

from .base import Backend
from .models import resolve_model


def open_local(
    model: str | None,
    *,
    default_model: str | None,
    models_dir: Path,
    log_dir: Path,
    n_ctx: int,
    gpu_layers: int | None,
    chat_template: str,
    threads: int | None = None,
    threads_batch: int | None = None,
    extra_buffers: str = "auto",
    cache_dir: Path | None = None,
) -> Backend:
    """An in-process llama.cpp backend for `model`, not yet loaded (call `load()`).

    llama_cpp is imported here, not at module import, so the UI can draw before it loads.
    """
    from .llama import LlamaBackend, LlamaSettings

    from ..hub.local import mark_used

    path = _model_file(model, default_model, models_dir, log_dir)
    mark_used(models_dir, path)
    name = model if model and not model.lower().endswith(".gguf") else path.stem
    settings = LlamaSettings(path, n_ctx, gpu_layers, chat_template, extra_buffers, threads, threads_batch, cache_dir)
    return LlamaBackend(settings, name=name)


def count_text_tokens(model: str | None, text: str, *, default_model: str | None, models_dir: Path, log_dir: Path) -> int:
    """Tokens `text` takes in `model`'s own tokenizer, reading only its vocabulary (no weights)."""
    from .llamacpp import count_tokens

    return count_tokens(_model_file(model, default_model, models_dir, log_dir), text)


def _model_file(model: str | None, default_model: str | None, models_dir: Path, log_dir: Path) -> Path:
    from . import logs

    path = resolve_model(model, default_model, models_dir)
    logs.install(log_dir)
    return path


def open_remote(model: str | None, *, default_model: str | None, base_url: str, api_key: str | None,
                timeout_s: float) -> Backend:
    """A backend for an OpenAI-compatible server, not yet connected (`load()` lists and picks the model)."""
    from .remote import OpenAIBackend, RemoteSettings

    return OpenAIBackend(RemoteSettings(base_url, model or default_model, api_key, timeout_s))
