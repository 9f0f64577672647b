"""One file from the hub into the models dir, resumable, verified before it gets its final name.

The bytes go to `NAME.part` beside the target, with `NAME.part.json` saying which content they
belong to (its checksum and size). A cut connection, a cancel, a full disk or quitting the app
leaves the part file: the next pull hashes what is there and asks the hub for the rest with `Range`
(huggingface_hub's own downloader deletes partial files, so we do not use it). Only a file whose
checksum matches the hub's listing is renamed to its final name, so the app never loads half a file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from typing import Any, Protocol

from ..units import format_size
from . import HubError
from .http import auth_headers, session, status_error, timeout, translated

PROGRESS_EVERY_S = 0.1
SPEED_WINDOW_S = 3.0
NETWORK_RETRIES = 3
RETRY_WAIT_S = 1.0
STALL_S = 5.0  # a connection silent this long is dropped and resumed; also how long a cancel can take
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class Cancelled(HubError):
    """The user stopped the download; what arrived is kept for the next pull."""


class Digest(Protocol):
    """What a download needs of a hashlib object."""

    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Checksum:
    """The hub's own identity of a file: sha256 for LFS files, the git blob sha1 for small ones."""

    kind: str  # "sha256" or "git-sha1"
    hex: str

    def hasher(self, size: int) -> Digest:
        if self.kind == "sha256":
            return hashlib.sha256()
        digest = hashlib.sha1()
        digest.update(f"blob {size}\0".encode())
        return digest


@dataclass(frozen=True, slots=True)
class Progress:
    """Bytes of a whole download (all files of a split set), for a progress bar."""

    file: str
    done: int
    total: int
    speed: float  # bytes per second over the last few seconds

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def eta_s(self) -> float | None:
        return (self.total - self.done) / self.speed if self.speed > 0 else None

    def line(self) -> str:
        line = f"{self.fraction:4.0%} {format_size(self.done)} / {format_size(self.total)}"
        if self.eta_s is None or self.done >= self.total:
            return line
        return f"{line} · {format_size(self.speed)}/s · {self.eta_s:.0f} s left"


class Meter:
    """Counts bytes for a whole download and reports at most every PROGRESS_EVERY_S."""

    def __init__(self, total: int, report: Callable[[Progress], object], cancel: threading.Event) -> None:
        self.total = total
        self.done = 0
        self.file = ""
        self.cancel = cancel
        self._report = report
        self._samples: deque[tuple[float, int]] = deque()
        self._reported = 0.0

    def add(self, count: int, *, received: bool = True) -> None:
        """`received=False` for bytes already on disk: they count as done but not towards the speed."""
        self.done += count
        now = time.monotonic()
        if not received:
            self._samples.clear()
        self._samples.append((now, self.done))
        while now - self._samples[0][0] > SPEED_WINDOW_S:
            self._samples.popleft()
        if now - self._reported >= PROGRESS_EVERY_S or self.done >= self.total:
            self._reported = now
            self._report(Progress(self.file, self.done, self.total, self._speed()))

    def _speed(self) -> float:
        (start, start_bytes), (end, end_bytes) = self._samples[0], self._samples[-1]
        return (end_bytes - start_bytes) / (end - start) if end > start else 0.0


def part_path(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def _meta_path(target: Path) -> Path:
    return target.with_name(target.name + ".part.json")


def partial_files(target: Path) -> list[Path]:
    return [part_path(target), _meta_path(target)]


def fetch(url: str, target: Path, size: int, checksum: Checksum, meter: Meter) -> None:
    """Download `url` to `target` (resuming a matching part file), then verify and rename it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part, meta = part_path(target), _meta_path(target)
    identity = {"checksum": f"{checksum.kind}:{checksum.hex}", "size": size}
    if _read_meta(meta) != identity:
        part.unlink(missing_ok=True)
        _write(meta, json.dumps(identity), target)
    digest, offset = _hash_existing(part, checksum, size, meter)
    needed = size - offset
    free = shutil.disk_usage(target.parent).free
    if needed > free:
        raise HubError(f"not enough disk space in {target.parent}: {target.name} needs {format_size(needed)} more, "
                       f"{format_size(free)} free")
    failures = 0
    while offset < size:
        try:
            offset = _receive(url, part, offset, size, digest, target, meter)
            failures = 0
        except _Interrupted as interruption:
            failures = 0 if interruption.progressed else failures + 1
            offset = interruption.offset
            if failures >= NETWORK_RETRIES:
                raise HubError(f"{target.name}: the download stopped ({interruption.reason}) at "
                               f"{format_size(offset)} of {format_size(size)}; pull again to resume") from None
            time.sleep(RETRY_WAIT_S * failures)
        except _Restart:
            meter.add(-offset, received=False)
            digest, offset = checksum.hasher(size), 0
    if digest.hexdigest() != checksum.hex:
        part.unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
        raise HubError(f"{target.name}: the downloaded file does not match the hub's {checksum.kind} "
                       f"(expected {checksum.hex[:12]}…, got {digest.hexdigest()[:12]}…); it was deleted, pull again")
    os.replace(part, target)
    meta.unlink(missing_ok=True)


class _Interrupted(Exception):
    def __init__(self, offset: int, progressed: bool, reason: str) -> None:
        super().__init__(reason)
        self.offset, self.progressed, self.reason = offset, progressed, reason


class _Restart(Exception):
    """The server ignored our Range: start the file again from byte 0."""


def _receive(url: str, part: Path, offset: int, size: int, digest: Digest, target: Path, meter: Meter) -> int:
    """One request for the bytes from `offset`; returns the new offset."""
    import httpx2

    headers = auth_headers() | {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    start = offset
    _stop_if_cancelled(meter, target)
    with translated(target.name):
        try:
            with session().stream("GET", url, headers=headers, timeout=timeout(STALL_S)) as response:
                if response.status_code == 200 and offset:
                    part.unlink(missing_ok=True)
                    raise _Restart()
                if response.status_code not in (200, 206):
                    raise status_error(response.status_code, target.name, headers)
                if response.status_code == 206 and not response.headers.get("Content-Range", "").startswith(
                        f"bytes {offset}-"):
                    raise HubError(f"{target.name}: the hub sent a different part of the file than asked for")
                with part.open("ab", buffering=0) as out:
                    for chunk in response.iter_bytes():
                        _stop_if_cancelled(meter, target)
                        if offset + len(chunk) > size:
                            raise HubError(f"{target.name}: the hub sent more than the {size:,} bytes it listed")
                        _write_chunk(out, chunk, target)
                        digest.update(chunk)
                        offset += len(chunk)
                        meter.add(len(chunk))
                    _flush(out, target)
        except (httpx2.TransportError, httpx2.StreamError) as error:
            raise _Interrupted(offset, offset > start, type(error).__name__) from None
    if offset < size:
        raise _Interrupted(offset, offset > start, "the connection closed early")
    return offset


def _stop_if_cancelled(meter: Meter, target: Path) -> None:
    if meter.cancel.is_set():
        raise Cancelled(f"{target.name}: download cancelled; pull again to resume")


def _hash_existing(part: Path, checksum: Checksum, size: int, meter: Meter) -> tuple[Digest, int]:
    """Hash the bytes a previous run left, so the digest continues where the download does."""
    digest = checksum.hasher(size)
    try:
        existing = part.stat().st_size
    except FileNotFoundError:
        return digest, 0
    if existing > size:
        part.unlink()
        return digest, 0
    with part.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
            meter.add(len(block), received=False)
    return digest, existing


def _write_chunk(out: FileIO, chunk: bytes, target: Path) -> None:
    """Unbuffered, so a full disk shows here and not later in a close() we cannot tell apart."""
    view = memoryview(chunk)
    try:
        while view:
            view = view[out.write(view):]
    except OSError as error:
        raise _disk_error(error, target) from None


def _flush(out: FileIO, target: Path) -> None:
    try:
        os.fsync(out.fileno())
    except OSError as error:
        raise _disk_error(error, target) from None


def _write(path: Path, text: str, target: Path) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise _disk_error(error, target) from None


def _disk_error(error: OSError, target: Path) -> HubError:
    if error.errno in _DISK_FULL:
        return HubError(f"the disk is full ({target.parent}): {target.name} stopped; what arrived is kept — "
                        "free some space and pull again to resume")
    return HubError(f"cannot write {target}: {error.strerror or error}")


def _read_meta(meta: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(meta.read_text(encoding="utf-8"))
        return data
    except (OSError, ValueError):
        return None
