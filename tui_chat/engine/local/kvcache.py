"""When a turn starts from a KV state saved on disk instead of reading its prompt, and when one is saved:
the policy around `KvStore` for one loaded model. Used on the backend's worker thread only."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...gguf import GgufHeader
from . import logs
from .kvstore import KvKey, KvProblem, KvStore, Listing, Notes, model_key
from .llamacpp import LlamaSession, StateRefused

MIN_SAVE_TOKENS = 32  # fewer are read again in a few tens of milliseconds
MIN_GAIN_TOKENS = 16  # a restore must spare reading at least this many tokens
LOAD_BYTES_PER_S = 1e9  # finding, checking and restoring a state: 55 MB took ~50 ms on 2 cores (page cache)
MIN_RATE_TOKENS = 64  # prompt reads shorter than this say more about overheads than about the reading rate


@dataclass(frozen=True, slots=True)
class Restored:
    seconds: float
    prefill_tok_s: float | None  # the reading rate the time saved is estimated with


def worth_restoring(gain_tokens: int, state_bytes: int, prefill_tok_s: float | None) -> bool:
    """Whether loading a state of `state_bytes` beats reading the `gain_tokens` it spares (when the reading rate
    is not known yet, it is taken to: a state is read at disk speed, a prompt at model speed)."""
    if gain_tokens < MIN_GAIN_TOKENS:
        return False
    return prefill_tok_s is None or state_bytes / LOAD_BYTES_PER_S < gain_tokens / prefill_tok_s


class DiskCache:
    """The saved states one loaded model can use, and what this process learnt about its reading speed.

    That speed prices what a restore spared (`restore_avoided_s`). It is measured on prompt reads of at least
    MIN_RATE_TOKENS, or comes with the state from the process that saved it; a chat of short messages makes no
    such read, so then the first restore measures it once, reading one batch of what it restored."""

    def __init__(self, store: KvStore, key: KvKey) -> None:
        self.store = store
        self.key = key
        self.prefill_tok_s: float | None = None
        self.last_save_s = 0.0  # how long the last save held the worker (benchmarks read it)
        self._listing: Listing | None = None

    def start_turn(self) -> None:
        """Look at the folder once for the turn: its reading, restore and save work from what was there then (and
        from what they change themselves); what other processes save or delete meanwhile shows next turn."""
        self._listing = self.store.listing(self.key)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_RATE_TOKENS and seconds > 0:
            self.prefill_tok_s = tokens / seconds

    def restore(self, session: LlamaSession, prompt: Sequence[int]) -> Restored | None:
        """Load the saved state sharing the longest prefix with `prompt` when that spares enough reading over
        what the session's cache already shares; the caller then cuts it back to the shared prefix."""
        started = time.perf_counter()
        found = self.store.best_match(self.key, prompt, len(prompt) - 1, self._listing)
        if found is None:
            return None
        entry, shared = found
        rate = self.prefill_tok_s or entry.notes.prefill_tok_s
        if not worth_restoring(shared - session.common_prefix(prompt), entry.size_bytes, rate):
            return None
        try:
            with self.store.open(entry) as body:
                session.load_state(body, entry.tokens)
        except (KvProblem, StateRefused) as problem:
            self.store.discard(entry, str(problem), self._listing)
            return None
        self.store.touch(entry, self._listing)
        seconds = time.perf_counter() - started
        if rate is None and shared >= MIN_RATE_TOKENS:
            rate = session.reading_rate(entry.tokens[:shared])
        self.prefill_tok_s = rate  # until this process measures its own: saved again with the next state
        return Restored(seconds, rate)

    def save(self, session: LlamaSession, conversation: str, transcript: tuple[str, list[int]],
             prompt: tuple[str, list[int]]) -> None:
        """Save what the session's cache holds now, filed under `conversation` with the transcript the engine
        has read (text and tokens; `prompt`, the last prompt, starts it); failures are log lines."""
        if len(session.tokens) < MIN_SAVE_TOKENS:
            return
        started = time.perf_counter()
        notes = Notes(conversation, transcript[0], tuple(transcript[1]), len(prompt[0]), len(prompt[1]),
                      self.prefill_tok_s)
        self.store.save(self.key, session.tokens, session.save_state, session.state_file_bytes(), notes, self._listing)
        self.last_save_s = time.perf_counter() - started

    def reading(self, text: str) -> tuple[str, list[int]]:
        """The longest start of `text` a saved state's transcript says was read, with its tokens; ("", [])."""
        known_text, tokens = self.store.reading(self.key, text, self._listing)
        return known_text, list(tokens)


def open_disk_cache(folder: Path | None, budget_bytes: int, session: LlamaSession, model: Path, header: GgufHeader,
                    build: str) -> DiskCache | None:
    """The disk cache for a freshly loaded model, or None when it is off or the model file cannot be identified."""
    if folder is None or budget_bytes <= 0:
        return None
    try:
        key = model_key(model, header.sha256, session.n_ctx, *session.kv_types, build)
    except OSError as error:
        logs.note(f"kv cache: off for {model.name}: {error}")
        return None
    return DiskCache(KvStore(folder, budget_bytes), key)
