"""The sampler chain made with llama.cpp's own samplers: the plan (which stages, in which order) comes from
stages.py, which follows llama.cpp's `common/sampling.cpp`, so a setting means here what it means in
llama-server."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import llama_cpp
import numpy as np

from .params import SamplingParams
from .stages import is_on, plan

PENALTY_LAST_N = 64
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's defaults

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class Candidates:
    """Tokens with their logits as llama.cpp's `llama_token_data_array`, over a numpy buffer: samplers
    can be applied to it one at a time and what each left read back. `refill` reuses the buffer, so
    a per-token caller allocates nothing.

    A sampler may cut from either end: top-k and the like shrink `size`; XTC moves `data` past the
    likeliest tokens it removes. `live` follows both."""

    def __init__(self, ids: np.ndarray, logits: np.ndarray) -> None:
        self.buffer = np.empty(len(ids), dtype=TOKEN_DATA)
        self._start = self.buffer.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        self.array = llama_cpp.llama_token_data_array(self._start, len(ids), -1, False)
        self.refill(ids, logits)

    def refill(self, ids: np.ndarray | int, logits: np.ndarray | float) -> Candidates:
        """New contents, at most as many as the buffer was made for."""
        size = np.size(ids)
        self.buffer["id"][:size] = ids
        self.buffer["logit"][:size] = logits
        self.buffer["p"][:size] = 0.0
        self.array.data, self.array.size, self.array.selected, self.array.sorted = self._start, size, -1, False
        return self

    def apply(self, sampler: ctypes.c_void_p) -> None:
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(self.array))

    @property
    def live(self) -> np.ndarray:
        """The array as the samplers left it (a view): from where `data` points now, `size` long."""
        offset = (ctypes.cast(self.array.data, ctypes.c_void_p).value - self.buffer.ctypes.data) // TOKEN_DATA.itemsize
        return self.buffer[offset : offset + self.array.size]

    def survivors(self) -> np.ndarray:
        """The candidates still in play: inside the array and not set to -inf."""
        live = self.live
        return live[live["logit"] > -np.inf]

    @property
    def selected(self) -> int:
        """The token a selector (dist, greedy, mirostat) picked."""
        return int(self.live["id"][self.array.selected])

    @property
    def selected_logit(self) -> float:
        return float(self.live["logit"][self.array.selected])

    def copy(self) -> Candidates:
        live = self.live
        return Candidates(live["id"], live["logit"])


class Chain:
    """A built llama.cpp chain and the names of its elements, in order. `raised`: the tokens a stage may
    move up (a positive logit bias; recent tokens under a negative penalty): any other token keeps its
    rank among the raw logits. Use from the worker thread."""

    def __init__(self, pointer: ctypes.c_void_p, stages: tuple[str, ...], params: SamplingParams,
                 raised: np.ndarray) -> None:
        self.pointer = pointer
        self.stages = stages
        self.params = params
        self.raised = raised

    def sample(self, ctx: ctypes.c_void_p) -> int:
        """Draw from the last decoded logits; llama.cpp also records the token for the penalties."""
        return llama_cpp.llama_sampler_sample(self.pointer, ctx, -1)

    def apply(self, candidates: Candidates) -> int:
        """Run the whole chain over `candidates` and return its pick, without recording it (`accept`)."""
        candidates.apply(self.pointer)
        return candidates.selected

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.pointer, token)

    def element(self, index: int) -> ctypes.c_void_p:
        return llama_cpp.llama_sampler_chain_get(self.pointer, index)

    def clone(self) -> Chain:
        """A copy with the same state (recent tokens, random generators): replays what this one does next."""
        return Chain(llama_cpp.llama_sampler_clone(self.pointer), self.stages, self.params, self.raised)

    def free(self) -> None:
        llama_cpp.llama_sampler_free(self.pointer)


class ChainBuilder:
    """Makes chains for one model. It keeps one DRY sampler to clone: making one scans the whole
    vocabulary for the sequence breakers (tens of ms on a 262k vocabulary), which a slider moved
    mid-reply must not cost each time."""

    def __init__(self, vocab: ctypes.c_void_p, n_vocab: int, n_ctx: int,
                 continuation: Callable[[str], list[int]]) -> None:
        self.vocab = vocab
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.continuation = continuation
        self._dry: tuple[tuple, ctypes.c_void_p] | None = None

    def build(self, params: SamplingParams, seed: int, history: Sequence[int], *, xtc_always: bool = False) -> Chain:
        """The chain for `params`, primed with the recent `history` its penalties and DRY look at.

        `xtc_always`: XTC fires on every token, so the X-ray can show what it removes when it does.
        """
        stages = plan(params)
        pointer = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        for stage in stages:
            llama_cpp.llama_sampler_chain_add(pointer, self._make(stage, params, seed, xtc_always))
        recent = history[-self._window(params):]
        for token in recent:
            llama_cpp.llama_sampler_accept(pointer, token)
        raised = [token for token, bias in self.bias_tokens(params) if bias > 0]
        if params.frequency_penalty < 0 or params.presence_penalty < 0:
            raised += recent[-PENALTY_LAST_N:]
        return Chain(pointer, stages, params, np.unique(np.asarray(raised, dtype=np.int32)))

    def bias_tokens(self, params: SamplingParams) -> list[tuple[int, float]]:
        """Each biased text's first token as it would be tokenized mid-sentence."""
        return [(tokens[0], bias) for text, bias in params.logit_bias if (tokens := self.continuation(text))]

    def close(self) -> None:
        if self._dry is not None:
            llama_cpp.llama_sampler_free(self._dry[1])
            self._dry = None

    def _window(self, params: SamplingParams) -> int:
        if not is_on("dry", params):
            return PENALTY_LAST_N
        return self.n_ctx if params.dry_penalty_last_n < 0 else max(PENALTY_LAST_N, params.dry_penalty_last_n)

    def _make(self, stage: str, p: SamplingParams, seed: int, xtc_always: bool) -> ctypes.c_void_p:
        makers: dict[str, Callable[[], ctypes.c_void_p]] = {
            "logit_bias": lambda: self._logit_bias(p),
            "penalties": lambda: llama_cpp.llama_sampler_init_penalties(
                self.n_vocab, PENALTY_LAST_N, p.repeat_penalty, p.frequency_penalty, p.presence_penalty),
            "dry": lambda: self._dry_sampler(p),
            "top_n_sigma": lambda: llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma),
            "top_k": lambda: llama_cpp.llama_sampler_init_top_k(p.top_k),
            "typical_p": lambda: llama_cpp.llama_sampler_init_typical(p.typical_p, 1),
            "top_p": lambda: llama_cpp.llama_sampler_init_top_p(p.top_p, 1),
            "min_p": lambda: llama_cpp.llama_sampler_init_min_p(p.min_p, 1),
            "xtc": lambda: llama_cpp.llama_sampler_init_xtc(
                1.0 if xtc_always else p.xtc_probability, p.xtc_threshold, 1, seed),
            "temperature": lambda: llama_cpp.llama_sampler_init_temp(p.temperature),
            "mirostat_v2": lambda: llama_cpp.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta),
            "greedy": llama_cpp.llama_sampler_init_greedy,
            "dist": lambda: llama_cpp.llama_sampler_init_dist(seed),
        }
        return makers[stage]()

    def _logit_bias(self, params: SamplingParams) -> ctypes.c_void_p:
        entries = [llama_cpp.llama_logit_bias(token, bias) for token, bias in self.bias_tokens(params)]
        array = (llama_cpp.llama_logit_bias * max(1, len(entries)))(*entries)
        return llama_cpp.llama_sampler_init_logit_bias(self.n_vocab, len(entries), array)

    def _dry_sampler(self, p: SamplingParams) -> ctypes.c_void_p:
        last_n = self.n_ctx if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n
        key = (p.dry_multiplier, p.dry_base, p.dry_allowed_length, last_n)
        if self._dry is None or self._dry[0] != key:
            self.close()
            breakers = (ctypes.c_char_p * len(DRY_SEQUENCE_BREAKERS))(*(b.encode() for b in DRY_SEQUENCE_BREAKERS))
            self._dry = key, llama_cpp.llama_sampler_init_dry(self.vocab, *key, breakers, len(DRY_SEQUENCE_BREAKERS))
        return llama_cpp.llama_sampler_clone(self._dry[1])
