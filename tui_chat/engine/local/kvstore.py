"""The KV cache kept on disk, so a reopened chat or a long shared system prompt is not read again.

One file per saved state, `PREFIX-TOKENS.kv`: PREFIX a digest of the model's path, n_ctx and KV cache
types (the states one context could use), TOKENS a digest of the token list the state holds. The body
is llama.cpp's own session file, written by llama.cpp straight to disk (a state is never copied in
memory). A trailer follows: the token list, a JSON record (what the state is valid for: the model
file's identity, the llama.cpp build...; the body's sha256; the chat and transcript it came from) and a
footer with the trailer's own sha256. A file gets its `.kv` name only once it is written in full and
fsynced: a crash or `kill -9` mid-write leaves a `.partial`, which never loads. Before llama.cpp reads a
state, its record, token digest and sha256 are checked; what fails is logged in one line and deleted,
and the turn reads its prompt instead.

No llama.cpp calls here: the session writes the body (`save(write=...)`) and reads it (`open`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...units import format_size

FORMAT = 1
SUFFIX = ".kv"
PARTIAL = ".partial"
DEFAULT_BUDGET_BYTES = 4 * 2**30
MIN_FREE_BYTES = 512 * 2**20  # a cache never takes the last of the disk
STALE_PARTIAL_S = 3600  # a `.partial` this old was left by a process that died mid-write
_MAGIC = b"TUIKV\x00\x00\x01"
_FOOTER = struct.Struct("<QQ32s8s")  # token count, record length, sha256 of the tokens and record, magic
_TOKEN = np.dtype("<i4")


class KvProblem(Exception):
    """Why a saved state cannot be used or written; one line that reads after the file's name."""


@dataclass(frozen=True, slots=True)
class KvKey:
    """Everything a KV state is valid for: restoring it anywhere else would give wrong answers."""

    model_path: str
    model_size: int
    model_mtime_ns: int
    model_header_sha256: str  # the GGUF header, settings and tensor list (not the weights)
    n_ctx: int
    type_k: int
    type_v: int
    build: str  # llama.cpp's version and commit

    @property
    def prefix(self) -> str:
        """Names the files one context could use; the rest of the key is checked inside each file."""
        text = "\0".join(str(part) for part in (self.model_path, self.n_ctx, self.type_k, self.type_v))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def mismatch(self, saved: KvKey) -> str | None:
        """Why a state saved under `saved`, a key of the same prefix, cannot be used under this one; None if it can."""
        if (saved.model_size, saved.model_mtime_ns, saved.model_header_sha256) != (
                self.model_size, self.model_mtime_ns, self.model_header_sha256):
            return f"{Path(self.model_path).name} changed since it was saved"
        if saved.build != self.build:
            return f"it was saved by another llama.cpp build ({saved.build}; this one is {self.build})"
        return None


def model_key(path: Path, header_sha256: str, n_ctx: int, type_k: int, type_v: int, build: str) -> KvKey:
    """The key of a context on the model at `path`, whose header hashes to `header_sha256` (the load read it:
    `GgufHeader.sha256`). Raises OSError for a file that cannot be read."""
    path = path.resolve()
    stat = path.stat()
    return KvKey(str(path), stat.st_size, stat.st_mtime_ns, header_sha256, n_ctx, type_k, type_v, build)


@dataclass(frozen=True, slots=True)
class Notes:
    """What a state is saved with besides its tokens."""

    conversation: str = ""  # the chat it was saved from ("" when not known); deleting the chat deletes it
    # The rendered chat the engine had read as these tokens: a later process tokenizes the same chat the
    # same way (re-tokenizing can merge a reply's end differently), so it continues exactly as this one would.
    transcript: str = ""
    transcript_tokens: tuple[int, ...] = ()
    prompt_chars: int = 0  # the transcript's start that was the last prompt (a regenerated reply starts there)
    prompt_tokens: int = 0
    prefill_tok_s: float | None = None  # how fast the saving process read prompts: what a restore spares

    def readings(self) -> list[tuple[str, tuple[int, ...]]]:
        """Texts read as tokens: the whole transcript, and the last prompt."""
        return [(self.transcript, self.transcript_tokens),
                (self.transcript[: self.prompt_chars], self.transcript_tokens[: self.prompt_tokens])]


@dataclass(frozen=True, slots=True, eq=False)
class Entry:
    """One saved state as listed: what it holds and for what, without reading its body."""

    path: Path
    key: KvKey
    tokens: np.ndarray  # the exact tokens the state holds, in order
    notes: Notes
    size_bytes: int
    last_used: float  # the file's mtime: set when saved and each time it is restored
    body_bytes: int
    body_sha256: str

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def model_name(self) -> str:
        return Path(self.key.model_path).name


@dataclass(slots=True, eq=False)
class Listing:
    """The folder as one look saw it, for one model and context (`key`). A turn's reading, restore and save work
    from one (the engine takes it as the turn starts); the store keeps it in step with what it does itself
    (states used, saved, deleted), and what other processes do shows at the next look."""

    key: KvKey
    entries: dict[str, Entry]  # every state, by file name: the budget counts them all
    partials: list[Path]  # unfinished writes: a save deletes those a dead process left

    @property
    def usable(self) -> list[Entry]:
        """The states of this key's model and context (those saved for another file or build were discarded)."""
        return [entry for name, entry in self.entries.items() if name.startswith(self.key.prefix + "-")]


def shared_prefix(saved: np.ndarray, prompt: np.ndarray, limit: int) -> int:
    """How many leading tokens two lists share, at most `limit`."""
    n = min(len(saved), len(prompt), limit)
    differ = np.flatnonzero(saved[:n] != prompt[:n])
    return int(differ[0]) if differ.size else n


def _tokens_digest(tokens: np.ndarray) -> str:
    return hashlib.sha256(tokens.astype(_TOKEN, copy=False).tobytes()).hexdigest()[:32]


class KvStore:
    """The saved states in one folder, within a size budget; the least recently used go first.

    Safe from any thread and beside other processes on the same folder: files are written once, renamed
    into place and only ever deleted; a file gone missing meanwhile is simply not there.
    """

    def __init__(self, folder: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.folder = folder
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._parsed: dict[str, tuple[tuple[int, int], Entry]] = {}

    # --- listing and deleting: what the app and the command line call ---------------------------

    def list_entries(self) -> list[Entry]:
        """Every saved state, the most recently used first (damaged files are logged and deleted)."""
        return sorted(self._scan()[0], key=lambda entry: entry.last_used, reverse=True)

    def total_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self._scan()[0])

    def clear(self) -> int:
        """Delete every saved state (and any unfinished write); returns how many states were deleted."""
        return self._delete(lambda entry: True, partials_older_than=0)

    def forget(self, conversation: str) -> int:
        """Delete the states saved from one chat (when the chat is deleted)."""
        return self._delete(lambda entry: entry.notes.conversation == conversation)

    def forget_model(self, model_path: Path) -> int:
        """Delete every state of one model file (when the model is removed)."""
        target = str(model_path.resolve())
        return self._delete(lambda entry: entry.key.model_path == target)

    # --- restoring and saving: what the engine calls --------------------------------------------
    # Each takes the turn's listing of the folder, or looks at it itself when given none.

    def listing(self, key: KvKey) -> Listing:
        """The folder now, for `key`: its states saved for an older model file or another build are discarded
        (they can never load again)."""
        entries, partials = self._scan()
        listing = Listing(key, {entry.path.name: entry for entry in entries}, partials)
        for entry in entries:
            reason = key.mismatch(entry.key) if entry.path.name.startswith(key.prefix + "-") else None
            if reason is not None:
                self.discard(entry, reason, listing)
        return listing

    def best_match(self, key: KvKey, prompt: Sequence[int], limit: int,
                   listing: Listing | None = None) -> tuple[Entry, int] | None:
        """The usable state sharing the longest prefix with `prompt` (at most `limit` tokens), and that length;
        on a tie the smaller file. None when no state shares a token."""
        wanted = np.asarray(prompt, dtype=_TOKEN)
        usable = (listing or self.listing(key)).usable
        scored = [(shared_prefix(entry.tokens, wanted, limit), -entry.size_bytes, entry) for entry in usable]
        best = max(scored, key=lambda item: item[:2], default=None)
        return (best[2], best[0]) if best is not None and best[0] > 0 else None

    def reading(self, key: KvKey, text: str, listing: Listing | None = None) -> tuple[str, tuple[int, ...]]:
        """The longest start of `text` a usable state's transcript says was read, with its tokens; ("", ())."""
        known = [(known_text, tokens) for entry in (listing or self.listing(key)).usable
                 for known_text, tokens in entry.notes.readings() if known_text and text.startswith(known_text)]
        return max(known, key=lambda reading: len(reading[0]), default=("", ()))

    @contextlib.contextmanager
    def open(self, entry: Entry) -> Iterator[memoryview]:
        """The body of `entry` (llama.cpp's session file), mapped from disk and checked against its token digest
        and sha256. Raises KvProblem when it does not check out. Views of it must not outlive the block."""
        try:
            with entry.path.open("rb") as handle:
                data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as error:
            raise KvProblem(f"it cannot be read ({getattr(error, 'strerror', None) or error})") from None
        with data:
            if len(data) != entry.size_bytes:
                raise KvProblem("it changed since it was listed")
            tokens = np.frombuffer(data[entry.body_bytes : entry.body_bytes + 4 * entry.n_tokens], _TOKEN)
            if entry.path.name != f"{entry.key.prefix}-{_tokens_digest(tokens)}{SUFFIX}":
                raise KvProblem("its tokens do not match its name")
            body = memoryview(data)[: entry.body_bytes]
            try:
                if hashlib.sha256(body).hexdigest() != entry.body_sha256:
                    raise KvProblem("its contents do not match their checksum")
                yield body
            finally:
                body.release()

    def save(self, key: KvKey, tokens: Sequence[int], write: Callable[[Path], int], expected_bytes: int,
             notes: Notes = Notes(), listing: Listing | None = None) -> Entry | None:
        """Save a state holding `tokens`: `write(path)` writes its body (about `expected_bytes`). A state some
        saved one already holds the whole of is only marked used. Older states of the same chat that this one
        holds the whole of are deleted; then the budget is kept. Any failure is one log line and no file."""
        wanted = np.asarray(tokens, dtype=_TOKEN)
        listing = listing or self.listing(key)
        same = listing.usable
        holder = next((entry for entry in same if shared_prefix(entry.tokens, wanted, len(wanted)) == len(wanted)),
                      None)
        if holder is not None:
            return self.touch(holder, listing)
        name = f"{key.prefix}-{_tokens_digest(wanted)}{SUFFIX}"
        partial = self.folder / f"{name}.{os.getpid()}{PARTIAL}"
        try:
            self._make_room(expected_bytes + 4 * len(wanted), listing)
            write(partial)
            entry = listing.entries[name] = self._seal(partial, name, key, wanted, notes)
        except (OSError, KvProblem) as error:
            with contextlib.suppress(OSError):
                partial.unlink()
            _log(f"the state of {len(wanted):,} tokens was not saved: {_reason(error)}")
            return None
        for older in same:
            held = shared_prefix(older.tokens, wanted, len(wanted)) == older.n_tokens
            if held and older.notes.conversation == notes.conversation:
                self._remove(older.path, listing)
        return entry

    def touch(self, entry: Entry, listing: Listing | None = None) -> Entry:
        """Mark `entry` as just used: eviction takes the least recently used first."""
        with contextlib.suppress(OSError):
            os.utime(entry.path)
        used = replace(entry, last_used=time.time())
        if listing is not None and entry.path.name in listing.entries:
            listing.entries[entry.path.name] = used
        return used

    def discard(self, entry: Entry, reason: str, listing: Listing | None = None) -> None:
        """A state that cannot be used: one log line, and the file goes (the turn reads its prompt instead)."""
        self._discard(entry.path, reason, listing)

    # --- inside ---------------------------------------------------------------------------------

    def _scan(self) -> tuple[list[Entry], list[Path]]:
        """Every `.kv` file, each read once per version (their trailers; bodies are read only to restore), and
        the unfinished writes beside them."""
        try:
            found = list(os.scandir(self.folder))
        except OSError:
            return [], []
        listing = [item for item in found if item.name.endswith(SUFFIX)]
        partials = [Path(item.path) for item in found if item.name.endswith(PARTIAL)]
        entries = []
        with self._lock:
            seen = {}
            for item in listing:
                try:
                    stat = item.stat()
                    entry = self._read(Path(item.path), stat)
                except FileNotFoundError:
                    continue
                except (OSError, KvProblem) as problem:
                    self._discard(Path(item.path), _reason(problem))
                    continue
                seen[item.name] = (stat.st_ino, stat.st_size), entry
                entries.append(entry)
            self._parsed = seen
        return entries, partials

    def _read(self, path: Path, stat: os.stat_result) -> Entry:
        known = self._parsed.get(path.name)
        if known is not None and known[0] == (stat.st_ino, stat.st_size):
            return replace(known[1], last_used=stat.st_mtime)
        return read_entry(path, stat.st_size, stat.st_mtime)

    def _seal(self, partial: Path, name: str, key: KvKey, tokens: np.ndarray, notes: Notes) -> Entry:
        """Append the trailer, fsync, and only then give the file its name. The entry is made from what was
        written (the next look knows the file by its inode and size) instead of being read back."""
        with partial.open("rb") as handle:
            body_sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
            body_bytes = handle.tell()
        transcript_tokens = np.asarray(notes.transcript_tokens, _TOKEN)
        shared = shared_prefix(tokens, transcript_tokens, len(transcript_tokens))  # stored as a count and a tail
        record = json.dumps({
            "format": FORMAT, "key": asdict(key), "body_bytes": body_bytes, "body_sha256": body_sha256,
            "saved_at": time.time(), "conversation": notes.conversation, "transcript": notes.transcript,
            "transcript_shared": shared, "transcript_tail": transcript_tokens[shared:].tolist(),
            "prompt_chars": notes.prompt_chars, "prompt_tokens": notes.prompt_tokens,
            "prefill_tok_s": notes.prefill_tok_s,
        }).encode()
        trailer = tokens.tobytes() + record
        with partial.open("ab") as handle:
            handle.write(trailer)
            handle.write(_FOOTER.pack(len(tokens), len(record), hashlib.sha256(trailer).digest(), _MAGIC))
            handle.flush()
            os.fsync(handle.fileno())
        final = self.folder / name
        os.replace(partial, final)
        _fsync_folder(self.folder)
        stat = final.stat()
        entry = Entry(final, key, tokens, notes, stat.st_size, stat.st_mtime, body_bytes, body_sha256)
        with self._lock:
            self._parsed[name] = (stat.st_ino, stat.st_size), entry
        return entry

    def _make_room(self, needed: int, listing: Listing) -> None:
        """Evict the least recently used states until `needed` more bytes fit in the budget and leave the disk
        MIN_FREE_BYTES free. Raises KvProblem when they cannot."""
        if needed > self.budget_bytes:
            raise KvProblem(f"it needs {format_size(needed)}, more than the whole budget "
                            f"({format_size(self.budget_bytes)}, kv_cache_budget_gb in the config)")
        self.folder.mkdir(parents=True, exist_ok=True)
        entries = sorted(listing.entries.values(), key=lambda entry: entry.last_used)
        total = sum(entry.size_bytes for entry in entries)
        free = shutil.disk_usage(self.folder).free
        for entry in entries:
            if total + needed <= self.budget_bytes and free - needed >= MIN_FREE_BYTES:
                break
            _log(f"{entry.path.name} ({entry.n_tokens:,} tokens, least recently used) evicted")
            if self._remove(entry.path, listing):
                total -= entry.size_bytes
                free += entry.size_bytes
        self._remove_partials(listing.partials, STALE_PARTIAL_S)
        if free - needed < MIN_FREE_BYTES:
            raise KvProblem(f"the disk is nearly full ({format_size(free)} free)")

    def _delete(self, chosen: Callable[[Entry], bool], partials_older_than: float = STALE_PARTIAL_S) -> int:
        entries, partials = self._scan()
        deleted = sum(self._remove(entry.path) for entry in entries if chosen(entry))
        self._remove_partials(partials, partials_older_than)
        return deleted

    @staticmethod
    def _remove_partials(partials: list[Path], older_than: float) -> None:
        """Unfinished writes left by a process that died (a write in progress is younger)."""
        now = time.time()
        for partial in partials:
            with contextlib.suppress(OSError):
                if now - partial.stat().st_mtime >= older_than:
                    partial.unlink()

    def _discard(self, path: Path, reason: str, listing: Listing | None = None) -> None:
        _log(f"{path.name} skipped and deleted: {reason}")
        self._remove(path, listing)

    @staticmethod
    def _remove(path: Path, listing: Listing | None = None) -> bool:
        """Delete a state's file (and its entry from `listing`); False when it was already gone or stays."""
        if listing is not None:
            listing.entries.pop(path.name, None)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as error:
            _log(f"{path.name} could not be deleted: {_reason(error)}")
            return False
        return True


def read_entry(path: Path, size: int, mtime: float) -> Entry:
    """A state's trailer: its tokens and record. Raises KvProblem for a file that is not a whole state of ours."""
    with path.open("rb") as handle:
        if size < _FOOTER.size:
            raise KvProblem("it is too short to be a saved state")
        handle.seek(size - _FOOTER.size)
        n_tokens, record_bytes, trailer_sha256, magic = _FOOTER.unpack(handle.read(_FOOTER.size))
        if magic != _MAGIC:
            raise KvProblem("it is not a tui-chat KV state, or its end is missing (truncated?)")
        body_bytes = size - _FOOTER.size - record_bytes - 4 * n_tokens
        if body_bytes < 0:
            raise KvProblem("its trailer is damaged")
        handle.seek(body_bytes)
        trailer = handle.read(4 * n_tokens + record_bytes)
    if hashlib.sha256(trailer).digest() != trailer_sha256:
        raise KvProblem("its trailer does not match its checksum")
    tokens = np.frombuffer(trailer[: 4 * n_tokens], _TOKEN)
    key, record = _record(trailer[4 * n_tokens :])
    if record["body_bytes"] != body_bytes:
        raise KvProblem("its body is not the size it was saved with")
    if path.name != f"{key.prefix}-{_tokens_digest(tokens)}{SUFFIX}":
        raise KvProblem("its name does not match what it holds")
    shared = record["transcript_shared"]
    notes = Notes(record["conversation"], record["transcript"],
                  tuple(tokens[:shared].tolist()) + tuple(record["transcript_tail"]), record["prompt_chars"],
                  record["prompt_tokens"], record["prefill_tok_s"])
    return Entry(path, key, tokens, notes, size, mtime, body_bytes, record["body_sha256"])


_RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    "body_bytes": int, "body_sha256": str, "conversation": str, "transcript": str, "transcript_shared": int,
    "transcript_tail": list, "prompt_chars": int, "prompt_tokens": int, "prefill_tok_s": (int, float, type(None)),
}


def _record(data: bytes) -> tuple[KvKey, dict[str, Any]]:
    """The JSON record (its checksum already matched): written by this format, or KvProblem."""
    try:
        record = json.loads(data)
        if record.get("format") != FORMAT:
            raise KvProblem(f"it is in another format ({record.get('format')!r}; this tui-chat writes {FORMAT})")
        key = KvKey(**record["key"])
        typed = all(isinstance(record[name], kind) for name, kind in _RECORD_TYPES.items())
    except (ValueError, TypeError, KeyError, AttributeError):
        raise KvProblem("its record is not one this tui-chat wrote") from None
    if not typed:
        raise KvProblem("its record is not one this tui-chat wrote")
    return key, record


def _log(line: str) -> None:
    """One line in tui-chat's log. The log module loads llama.cpp, so it is imported only when there is a line to
    write: listing and deleting states does not load llama.cpp (the app draws first, then loads it)."""
    from . import logs

    logs.note(f"kv cache: {line}")


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX; Windows has no directory handles to sync)."""
    if hasattr(os, "O_DIRECTORY"):
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror + (f" ({error.filename})" if error.filename else "")
    return str(error)
