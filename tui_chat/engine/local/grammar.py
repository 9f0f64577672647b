"""A reply's output format (../formats.py) in llama.cpp's grammar sampler, applied the fast way.

As llama.cpp's own common sampler does: the chain draws as if there were no grammar; the grammar
checks that one token (a one-candidate array: microseconds); only when it is not allowed does the
grammar mask the candidates before the chain draws again. Masking the whole vocabulary takes tens of
ms on a 262k one, so the mask goes over the POOL_SCAN likeliest tokens first (and any a stage may
raise), and over the whole vocabulary only when none of those is allowed: the tokens left out hold
a negligible share of the distribution, below what top-k, top-p or min-p would keep. Most tokens
pass the check, so a format costs little (benchmarks/sampling.py).

The grammar must never be told to accept a token it does not allow: llama.cpp aborts the process.
Every accept here follows a check.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import llama_cpp
import numpy as np

from ..formats import FormatError, OutputFormat
from ..pool import likeliest
from . import logs
from .chain import Candidates, Chain
from .gbnf import to_gbnf
from .llamacpp import POOL_SCAN, LlamaSession

_PARSE_ERROR = re.compile(r"error parsing grammar: (.*)")


class Constraint:
    """One reply's grammar: the check-first draw, the accepts, and what it masks. Worker thread only."""

    def __init__(self, session: LlamaSession, output: OutputFormat) -> None:
        self.session = session
        self.grammar = compile_grammar(session.vocab, to_gbnf(output))
        self._vocabulary = np.arange(session.n_vocab, dtype=np.int32)
        self._candidates = Candidates(self._vocabulary, np.zeros(session.n_vocab, dtype=np.float32))
        self._one = Candidates(np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.float32))
        vocab = session.vocab
        self._ends = tuple(t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if t >= 0)
        self.spent_s = 0.0  # the grammar's own time this reply: checks, masks, accepts, draws again
        self._drawn = -1
        self._allowed_everywhere: np.ndarray | None = None  # when the last draw had to mask the vocabulary

    def allows(self, token: int) -> bool:
        self._one.refill(token, 0.0).apply(self.grammar)
        return bool(self._one.buffer["logit"][0] > -np.inf)

    def draw(self, chain: Chain, logits: np.ndarray) -> int:
        """The chain's pick from `logits` within the grammar, recorded in the chain; `accept` records it
        in the grammar, once the inspector has read the mask (`judge`)."""
        token = chain.apply(self._candidates.refill(self._vocabulary, logits))
        started = time.perf_counter()
        self._allowed_everywhere = None
        if not self.allows(token):
            masked = self._masked(chain, logits)
            token = chain.apply(masked)
            if masked.selected_logit == -np.inf or not self.allows(token):
                raise FormatError("nothing the format allows is left to draw: a logit bias may ban it")
        chain.accept(token)
        self._drawn = token
        self.spent_s += time.perf_counter() - started
        return token

    def _masked(self, chain: Chain, logits: np.ndarray) -> Candidates:
        """The likeliest candidates with the grammar's mask on them; the whole vocabulary if it allows
        none of those (see the module doc)."""
        scan = min(POOL_SCAN, len(logits))
        likely = np.union1d(likeliest(logits, scan), chain.raised)
        candidates = Candidates(likely, logits[likely])
        candidates.apply(self.grammar)
        if not len(candidates.survivors()):
            candidates = self._candidates.refill(self._vocabulary, logits)
            candidates.apply(self.grammar)
            self._allowed_everywhere = candidates.survivors()["id"].copy()
        return candidates

    def accept(self, token: int) -> None:
        """Record `token`, one `draw` returned (it checked it) in the grammar."""
        started = time.perf_counter()
        llama_cpp.llama_sampler_accept(self.grammar, token)
        self.spent_s += time.perf_counter() - started

    def accept_given(self, tokens: Sequence[int]) -> None:
        """A branch's given tokens, checked one by one before any is written."""
        for token in tokens:
            if not self.allows(token):
                piece = self.session.piece(token).decode("utf-8", errors="replace")
                raise FormatError(f"the output format does not allow {piece!r} there")
            self.accept(token)

    def judge(self, likely: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the inspector, before `accept`: the tokens judged and which of them the grammar allows
        at the position just drawn: the `likely` ones and the drawn one, or the whole vocabulary
        when the draw had to mask it all (then none of the likely ones was allowed)."""
        if self._allowed_everywhere is not None:
            allowed = np.zeros(len(self._vocabulary), dtype=bool)
            allowed[self._allowed_everywhere] = True
            return self._vocabulary, allowed
        started = time.perf_counter()
        ids = np.union1d(likely, [self._drawn]).astype(np.int32)
        candidates = Candidates(ids, np.zeros(len(ids), dtype=np.float32))
        candidates.apply(self.grammar)
        allowed = np.isin(ids, candidates.survivors()["id"])
        self.spent_s += time.perf_counter() - started
        return ids, allowed

    def can_end(self) -> bool:
        """Whether what was written so far is complete: the grammar would let the reply end here."""
        return any(self.allows(token) for token in self._ends)

    def free(self) -> None:
        llama_cpp.llama_sampler_free(self.grammar)


def check_format(vocab: llama_cpp.llama_vocab_p, output: OutputFormat) -> None:
    """Raises the FormatError a reply in `output` would end with (a grammar that does not parse, a schema
    the converter gives up on), before any reply starts."""
    if output.constrained:
        llama_cpp.llama_sampler_free(compile_grammar(vocab, to_gbnf(output)))


def compile_grammar(vocab: llama_cpp.llama_vocab_p, gbnf: str) -> llama_cpp.llama_sampler_p:
    """llama.cpp's grammar sampler for `gbnf`, or a FormatError that says why it does not parse."""
    logs.take_errors()
    with _c_stderr() as printed:
        sampler: llama_cpp.llama_sampler_p = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    if not sampler:
        found = _PARSE_ERROR.search(printed[0])
        reasons = [found.group(1)] if found else [e for e in logs.take_errors() if e != "failed to parse grammar"]
        raise FormatError(f"the grammar does not parse: {reasons[0] if reasons else 'llama.cpp refused it'}")
    return sampler


@contextmanager
def _c_stderr() -> Iterator[list[str]]:
    """What C code writes to file descriptor 2 meanwhile: llama.cpp prints why a grammar does not parse
    there, not to its log. Anything written meanwhile that is not llama.cpp's is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    printed: list[str] = []
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield printed
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            printed.append(text)
            others = re.sub(r"parse: error parsing grammar: .*", "", text, flags=re.DOTALL)
            if others.strip():
                os.write(2, others.encode("utf-8"))
