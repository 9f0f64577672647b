"""The models on this machine: what is in the models dir, when each was last used, import and remove.

Layout of the models dir (the platformdirs data dir, e.g. ~/.local/share/tui-chat/models):
  hub/OWNER/NAME/FILE.gguf   pulled from the hub, named `OWNER/NAME:FILE.gguf`
  FILE.gguf                  imported from a path (and the starter model), named `FILE.gguf`
  models.json                last-used times, keyed by path relative to the models dir
Nothing here opens a network connection.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..gguf import UnusableModel, check_model_file, quantization
from . import HubError, HubInputError
from .names import GGUF_SUFFIX, ModelRef, local_relative_path, parse_ref, quant_of, split_names, split_part

REGISTRY = "models.json"
HUB_DIR = "hub"


@dataclass(frozen=True, slots=True)
class LocalModel:
    name: str
    path: Path
    files: tuple[Path, ...]
    size: int
    last_used: float | None

    @property
    def quant(self) -> str:
        """From the file's name, else from its metadata (an imported file may be named anything)."""
        return quant_of(self.path.name) or _metadata_quant(self.path, self.size)


@functools.lru_cache(maxsize=64)
def _metadata_quant(path: Path, _size: int) -> str:
    """Cached by size too: the same name downloaded again is read again."""
    return quantization(path)


def hub_path(models_dir: Path, ref: ModelRef) -> Path:
    return models_dir.joinpath(*local_relative_path(ref).parts)


def list_local(models_dir: Path) -> list[LocalModel]:
    """Every complete model in the models dir, most recently used first, then by name."""
    registry = _read_registry(models_dir)
    models = []
    for path in sorted(models_dir.rglob(f"*{GGUF_SUFFIX}")):
        files = _model_files(path)
        if files is None or not all(file.is_file() for file in files):
            continue
        relative = path.relative_to(models_dir).as_posix()
        last_used = registry.get(relative, {}).get("last_used")
        models.append(LocalModel(_name(relative), path, files, sum(file.stat().st_size for file in files),
                                 last_used if isinstance(last_used, (int, float)) else None))
    return sorted(models, key=lambda model: (-(model.last_used or 0), model.name))


def find_local(models_dir: Path, name: str) -> LocalModel | None:
    wanted = str(parse_ref(name) or name)
    return next((model for model in list_local(models_dir) if model.name == wanted), None)


def resolve_local(name: str, models_dir: Path) -> Path | None:
    """The file for a hub name (`OWNER/NAME:FILE`) or an imported model's file name; None if neither.

    A hub name that is not downloaded is an error that says how to get it (never a download here).
    """
    ref = parse_ref(name)
    if ref is not None:
        if not is_downloaded(models_dir, ref):
            raise HubInputError(f"{ref} is not downloaded: get it with tui-chat models pull {ref}")
        return hub_path(models_dir, ref)
    if "/" in name or os.sep in name:
        return None
    path = models_dir / name
    return path if path.is_file() else None


def is_downloaded(models_dir: Path, ref: ModelRef) -> bool:
    """Every file of the model is here (all parts of a split set, named by its first part)."""
    path = hub_path(models_dir, ref)
    return all(file.is_file() for file in _model_files(path) or (path,))


def import_model(models_dir: Path, source: Path) -> LocalModel:
    """Copy (or hard-link, on the same disk) a .gguf into the models dir, checked before it is named."""
    source = source.expanduser()
    try:
        check_model_file(source)
    except UnusableModel as error:
        raise HubInputError(str(error)) from None
    if split_part(source.name) is not None:
        raise HubInputError(f"{source.name} is one part of a split model: import is for single .gguf files")
    target = models_dir / source.name
    if target.exists():
        raise HubInputError(f"a model named {source.name} is already in {models_dir}: rename the file to import it")
    partial = target.with_name(target.name + ".importing")
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        try:
            os.link(source, partial)
        except OSError:
            shutil.copyfile(source, partial)
        os.replace(partial, target)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise HubError(f"cannot import {source} into {models_dir}: {error.strerror or error}") from None
    imported = find_local(models_dir, target.name)
    if imported is None:  # another process removed it at once
        raise HubError(f"{target} is gone right after it was imported")
    return imported


def remove_model(models_dir: Path, name: str) -> LocalModel:
    """Delete a model's files (every part, any partial download) and its registry entry."""
    model = find_local(models_dir, name)
    if model is None:
        raise HubInputError(f"no local model named {name!r}: see tui-chat models list")
    from .download import partial_files

    try:
        for file in model.files:
            for leftover in (file, *partial_files(file)):
                leftover.unlink(missing_ok=True)
        _prune_empty_dirs(model.path.parent, models_dir)
    except OSError as error:
        raise HubError(f"cannot delete {model.path}: {error.strerror or error}") from None
    registry = _read_registry(models_dir)
    registry.pop(model.path.relative_to(models_dir).as_posix(), None)
    _write_registry(models_dir, registry)
    return model


def mark_used(models_dir: Path, path: Path) -> None:
    """Remember when a model was loaded; a failure to write this is not worth bothering anyone."""
    try:
        relative = path.resolve().relative_to(models_dir.resolve()).as_posix()
    except (ValueError, OSError):
        return
    registry = _read_registry(models_dir)
    registry.setdefault(relative, {})["last_used"] = time.time()
    _write_registry(models_dir, registry)


def record_pull(models_dir: Path, ref: ModelRef, commit: str) -> None:
    registry = _read_registry(models_dir)
    registry.setdefault(local_relative_path(ref).as_posix(), {})["commit"] = commit
    _write_registry(models_dir, registry)


def _model_files(path: Path) -> tuple[Path, ...] | None:
    """All files of the model whose first (or only) file is `path`; None for parts 2..N of a split set."""
    part = split_part(path.name)
    if part is None:
        return (path,)
    if part.index != 1:
        return None
    return tuple(path.with_name(name) for name in split_names(path.name, part.count))


def _name(relative: str) -> str:
    parts = PurePosixPath(relative).parts
    if len(parts) >= 4 and parts[0] == HUB_DIR:
        return str(ModelRef(f"{parts[1]}/{parts[2]}", "/".join(parts[3:])))
    return relative


def _prune_empty_dirs(folder: Path, models_dir: Path) -> None:
    while folder != models_dir and models_dir in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def _read_registry(models_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        registry = json.loads((models_dir / REGISTRY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(registry, dict):
        return {}
    return {key: entry for key, entry in registry.items() if isinstance(entry, dict)}


def _write_registry(models_dir: Path, registry: dict[str, dict[str, Any]]) -> None:
    """Last-used times and pulled commits: on a disk that takes no writes they are lost, nothing more."""
    path = models_dir / REGISTRY
    partial = path.with_name(path.name + ".partial")
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(registry, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):  # a read-only file system refuses even to remove what is not there
            partial.unlink(missing_ok=True)
