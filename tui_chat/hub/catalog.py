"""Searching the hub for GGUF repos, listing a repo's GGUF models and pulling one (all its parts)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import HubError, HubInputError
from .download import Checksum, Meter, Progress, fetch
from .http import endpoint, get_json, get_pages
from .local import hub_path, is_downloaded, record_pull
from .names import (
    ModelRef,
    check_file_name,
    check_repo_id,
    is_gguf,
    parse_ref,
    quant_of,
    split_names,
    split_part,
)

SORTS = ("downloads", "likes")
SEARCH_LIMIT = 40
PREFERRED_QUANT = "Q4_K_M"
_HEX = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class RepoSummary:
    repo: str
    downloads: int
    likes: int


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str
    size: int
    checksum: Checksum


@dataclass(frozen=True, slots=True)
class GgufModel:
    """One loadable model: a single .gguf, or every part of a split set (named by its first part)."""

    name: str
    parts: tuple[RemoteFile, ...]
    complete: bool = True

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)

    @property
    def quant(self) -> str:
        return quant_of(self.name)


@dataclass(frozen=True, slots=True)
class RepoListing:
    repo: str
    commit: str
    models: tuple[GgufModel, ...]

    def choose(self, file: str | None) -> GgufModel:
        """The model `file` names (any part of a split set will do), or the obvious one when none is named."""
        if file is not None:
            for model in self.models:
                if file == model.name or file in (part.path for part in model.parts):
                    return model
            raise HubInputError(f"{self.repo} has no GGUF file {file!r}: see tui-chat models files {self.repo}")
        if len(self.models) == 1:
            return self.models[0]
        preferred = [model for model in self.models if model.quant == PREFERRED_QUANT]
        if len(preferred) == 1:
            return preferred[0]
        raise HubInputError(f"{self.repo} has {len(self.models)} GGUF models: name one, e.g. "
                            f"tui-chat models pull {self.repo}:{self.models[0].name} "
                            f"(see tui-chat models files {self.repo})")


def search(query: str, sort: str = "downloads", limit: int = SEARCH_LIMIT) -> list[RepoSummary]:
    if sort not in SORTS:
        raise HubInputError(f"sort must be one of {', '.join(SORTS)} (got {sort!r})")
    params = {"search": query, "filter": "gguf", "sort": sort, "limit": limit}
    found = get_json("/api/models", params, "search")
    if not isinstance(found, list):
        raise _garbage("search")
    return [_summary(item) for item in found[:limit]]


def list_gguf(repo: str) -> RepoListing:
    repo = check_repo_id(repo)
    what = f"repository {repo}"
    info = get_json(f"/api/models/{repo}", {}, what)
    commit = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(commit, str) or not _HEX.match(commit):
        raise _garbage(what)
    files = []
    for page in get_pages(f"/api/models/{repo}/tree/{commit}", {"recursive": True, "expand": False}, what):
        if not isinstance(page, list):
            raise _garbage(what)
        files += [_remote_file(item, what) for item in page if isinstance(item, dict) and item.get("type") == "file"]
    models = _group(file for file in files if is_gguf(file.path))
    if not models:
        raise HubInputError(f"{repo} has no GGUF files (tui-chat runs GGUF models): look for a GGUF version with "
                            f"tui-chat models search")
    return RepoListing(repo, commit, tuple(models))


def pull(name: str, models_dir: Path, report: Callable[[Progress], object],
         cancel: threading.Event | None = None) -> tuple[ModelRef, Path]:
    """Download `REPO:FILE` or `REPO`'s obvious model (every part of a split set) unless it is here.

    A `REPO:FILE` already here is answered without asking the hub, so scripts can pull offline.

    Returns the name to use it by and its path.
    """
    from huggingface_hub import hf_hub_url

    ref = parse_ref(name)
    if ref is not None and is_downloaded(models_dir, ref):
        return ref, hub_path(models_dir, ref)
    repo, file = (ref.repo, ref.file) if ref else (check_repo_id(name.strip()), None)
    listing = list_gguf(repo)
    model = listing.choose(file)
    if not model.complete:
        raise HubError(f"{repo}:{model.name} is a split model with parts missing on the hub")
    meter = Meter(model.size, report, cancel or threading.Event())
    chosen = ModelRef(repo, model.name)
    for part in model.parts:
        target = hub_path(models_dir, ModelRef(repo, part.path))
        meter.file = part.path
        if target.is_file() and target.stat().st_size == part.size:
            meter.add(part.size, received=False)
            continue
        url = hf_hub_url(repo, part.path, revision=listing.commit, endpoint=endpoint())
        fetch(url, target, part.size, part.checksum, meter)
    record_pull(models_dir, chosen, listing.commit)
    return chosen, hub_path(models_dir, chosen)


def _group(files: Iterable[RemoteFile]) -> list[GgufModel]:
    """Single files as they are; split parts gathered into one model per set, named by part 1."""
    by_path = {file.path: file for file in files}
    models, seen = [], set()
    for path, file in sorted(by_path.items()):
        part = split_part(path)
        if part is None:
            models.append(GgufModel(path, (file,)))
            continue
        names = split_names(path, part.count)
        if names[0] in seen:
            continue
        seen.add(names[0])
        present = tuple(by_path[name] for name in names if name in by_path)
        models.append(GgufModel(names[0], present, complete=len(present) == part.count))
    return models


def _summary(item: Any) -> RepoSummary:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise _garbage("search")
    return RepoSummary(item["id"], _count(item.get("downloads")), _count(item.get("likes")))


def _remote_file(item: dict[str, Any], what: str) -> RemoteFile:
    path, size, lfs = item.get("path"), item.get("size"), item.get("lfs")
    if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _garbage(what)
    try:
        check_file_name(path)
    except HubInputError:
        raise HubError(f"{what}: the hub listed a file name tui-chat will not write: {path!r}") from None
    if isinstance(lfs, dict):
        digest, kind = lfs.get("oid") or lfs.get("sha256"), "sha256"
        size = lfs.get("size", size)
    else:
        digest, kind = item.get("oid"), "git-sha1"
    if not isinstance(digest, str) or not _HEX.match(digest) or not isinstance(size, int):
        raise _garbage(what)
    return RemoteFile(path, size, Checksum(kind, digest))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _garbage(what: str) -> HubError:
    return HubError(f"{what}: the hub at {endpoint()} sent an answer tui-chat cannot read")
