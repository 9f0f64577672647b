"""Names of hub models (`REPO:FILE`), their quantisation, split sets and safe local paths."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from . import HubInputError

GGUF_SUFFIX = ".gguf"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_REF = re.compile(r"^(?P<repo>[^/:\s]+/[^/:\s]+):(?P<file>.+)$")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4(?:_MOE)?|BF16|F16|FP16|F32|FP32)(?=[-_.]|$)",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A model file in a hub repo, as users write it: `owner/name:file.gguf`."""

    repo: str
    file: str

    def __str__(self) -> str:
        return f"{self.repo}:{self.file}"


def parse_ref(text: str) -> ModelRef | None:
    """`owner/name:file.gguf` as a ModelRef, or None when `text` is not written that way."""
    match = _REF.match(text.strip())
    if match is None:
        return None
    return ModelRef(check_repo_id(match["repo"]), check_file_name(match["file"]))


def check_repo_id(repo: str) -> str:
    if not _REPO_ID.match(repo) or ".." in repo:
        raise HubInputError(f"{repo!r} is not a hub repository name: write it as owner/name")
    return repo


def check_file_name(name: str) -> str:
    """A file path inside a repo that cannot leave the folder we store it in (no `..`, no absolute path)."""
    parts = name.split("/")
    if (
        not name
        or _UNSAFE_CHARS.search(name)
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise HubInputError(f"{name!r} is not a usable file name (no '..', leading '/', '//' or control characters)")
    return name


def local_relative_path(ref: ModelRef) -> PurePosixPath:
    """Where a downloaded file lives under the models dir: hub/OWNER/NAME/FILE."""
    return PurePosixPath("hub", *ref.repo.split("/"), *check_file_name(ref.file).split("/"))


def is_gguf(name: str) -> bool:
    return name.lower().endswith(GGUF_SUFFIX)


def quant_of(name: str) -> str:
    """The quantisation type written in a GGUF file name (Q4_K_M, IQ3_XXS, F16, ...), or '' when none is."""
    stem = PurePosixPath(name).name
    found = _QUANT.findall(stem[: -len(GGUF_SUFFIX)] if is_gguf(stem) else stem)
    return found[-1].upper() if found else ""


@dataclass(frozen=True, slots=True)
class SplitPart:
    stem: str
    index: int
    count: int


def split_part(name: str) -> SplitPart | None:
    """`model-00002-of-00003.gguf` is part 2 of 3 of one model; llama.cpp loads the set from part 1."""
    match = _SPLIT.match(name)
    if match is None or not 1 <= int(match["index"]) <= int(match["count"]):
        return None
    return SplitPart(match["stem"], int(match["index"]), int(match["count"]))


def split_names(first: str, count: int) -> list[str]:
    part = split_part(first)
    if part is None:
        return [first]
    return [f"{part.stem}-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1)]


