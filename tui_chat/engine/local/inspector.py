"""The inspector's figures for a drawn token, computed while the next one decodes.

A token's raw probability needs the softmax's normaliser over the whole vocabulary: on Gemma 3's 262,144 tokens
an exp and a sum over 1 MiB of logits, and a shortlist of the likeliest, ~0.35 ms a token (measured on the GPU-
regime proxy, AMD EPYC). Between two decodes that is a third of a GPU's token. Here it runs on a copy of the row
(~0.04 ms) in a thread of its own, while llama.cpp decodes the next token with the interpreter lock released
(numpy releases it too for work this size), so the two overlap. The reply takes the figures when it puts the
token's event, one decode later (`Reply` holds that event until then); if the thread has not started on them
by then (a busy machine), they are computed there and then, as before. Only where a core is free beside
llama.cpp's decode threads (`overlaps`): on a machine with none, the thread would take a core from llama.cpp's
threads, which spin at every barrier and punish that.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..base import Candidate, GrammarMask, PoolCut
from ..link import UI_PROCESS_ENV
from ..params import SamplingParams

Args = tuple[int, int, SamplingParams, tuple[int, ...]]  # the token, the top N, the settings, the penalties' window


@dataclass(frozen=True, slots=True)
class Inspection:
    """One drawn token under the raw distribution (see `LlamaSession.inspect`)."""

    prob: float | None  # None, with no pool: the inspector was off
    top: tuple[Candidate, ...]
    pool: PoolCut | None
    mask: GrammarMask | None = None


# the session's `inspect` over a copied row, with a softmax buffer: (row, probs, *Args) -> Inspection
InspectCopy = Callable[[np.ndarray, np.ndarray, int, int, SamplingParams, tuple[int, ...]], Inspection]


def overlaps(decode_threads: int) -> bool:
    """Whether a CPU is free for the inspector while llama.cpp decodes on `decode_threads` threads, and the chat's
    UI draws on one of its own (an engine process serving the app): on 2 cores the app's screen lost a fifth of
    its rate when the inspector took the UI's core (the GPU-regime proxy, AMD EPYC), while `run` gained."""
    return _cpus_beside_the_ui() > decode_threads


@functools.cache
def _cpus_beside_the_ui() -> int:
    """The CPUs this process may use, less the UI's own where it serves the app's: read once, not per token."""
    if not hasattr(os, "sched_getaffinity"):
        return 0
    return len(os.sched_getaffinity(0)) - (1 if UI_PROCESS_ENV in os.environ else 0)


class Later:
    """The inspector's figures for one token, on their way: computed by the inspector's thread, or where they are
    wanted if the thread has not started on them by then (a busy machine), from the same copy."""

    def __init__(self, inspector: Inspector, args: Args) -> None:
        self.inspector, self.args = inspector, args
        self.claimed = False  # by the thread or by `result`, under the inspector's lock
        self.done: Inspection | None = None
        self.finished = threading.Event()

    def result(self) -> Inspection:
        """The figures, once: the copy they come from is the next token's after the next `submit`."""
        if self.done is None:
            with self.inspector.lock:
                mine, self.claimed = not self.claimed, True
            if mine:
                self.done = self.inspector.inspect(*self.args)
            else:
                self.finished.wait()
        assert self.done is not None, "set before `finished`"
        return self.done


class Inspector:
    """One thread and two vocabulary-sized buffers (the copied row, the softmax's) for a session. A job at a time,
    handed over in a slot (an executor's futures and queue cost ~0.05 ms a token more, measured on the proxy)."""

    def __init__(self, n_vocab: int, inspect_copy: InspectCopy) -> None:
        self.inspect_copy = inspect_copy
        self.row = np.empty(n_vocab, dtype=np.float32)
        self.probs = np.empty(n_vocab, dtype=np.float32)
        self.pending: Later | None = None
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="inspector", daemon=True)
        self.thread.start()

    def submit(self, logits: np.ndarray, token: int, top_n: int, params: SamplingParams,
               recent: tuple[int, ...]) -> Later:
        """The figures for `token` from `logits` (copied now: the next decode overwrites them). One at a time: the
        buffers are reused, so an earlier one is taken first (it has had a decode's time)."""
        if self.pending is not None:
            self.pending.result()
        np.copyto(self.row, logits)
        self.pending = Later(self, (token, top_n, params, recent))
        self.wake.set()
        return self.pending

    def inspect(self, token: int, top_n: int, params: SamplingParams, recent: tuple[int, ...]) -> Inspection:
        return self.inspect_copy(self.row, self.probs, token, top_n, params, recent)

    def _run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            later = self.pending
            if self.closed:
                return
            if later is None:
                continue
            with self.lock:
                mine, later.claimed = not later.claimed, True
            if mine:
                later.done = self.inspect(*later.args)
                later.finished.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        self.thread.join()
