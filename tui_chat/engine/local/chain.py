"""The sampler chain made with llama.cpp's own samplers: the plan (which stages, in which order) comes from
../stages.py, which follows llama.cpp's `common/sampling.cpp`, so a setting means here what it means in
llama-server. `StageReader` applies a chain one element at a time and reads what each left (the X-ray)."""

from __future__ import annotations

import ctypes
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import llama_cpp
import numpy as np

from ..base import Stage
from ..params import SamplingParams
from ..stages import is_on, label, plan

PENALTY_LAST_N = 64
SHORTLIST = 1024  # bounds the likeliest raw logits a chain that allows it is run over (see `shortlist`)
_LOWERING = frozenset({"logit_bias", "penalties", "dry"})  # lower logits only (what they raise is in `raised`)
_NAMING = frozenset({"logit_bias", "penalties"})  # of those, the ones that touch only tokens they name
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's defaults
# The stages with a backend version in the vendored llama.cpp (src/llama-sampler.cpp): llama.cpp can draw with a
# chain of them inside its graph. The logit bias is by token id there, as `ChainBuilder` makes it from words.
IN_GRAPH = frozenset({"logit_bias", "penalties", "top_k", "top_p", "min_p", "temperature", "greedy", "dist"})

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
        # llama-cpp-python annotates `data` as an array; the field is a pointer, which this is
        self.array.data = self._start  # type: ignore[assignment]
        self.array.size, self.array.selected, self.array.sorted = size, -1, False
        return self

    def apply(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(self.array))

    @property
    def live(self) -> np.ndarray:
        """The array as the samplers left it (a view): from where `data` points now, `size` long."""
        address = ctypes.cast(self.array.data, ctypes.c_void_p).value
        assert address is not None, "a sampler never leaves the array without data"
        offset = (address - self.buffer.ctypes.data) // TOKEN_DATA.itemsize
        return self.buffer[offset : offset + self.array.size]

    def survivors(self) -> np.ndarray:
        """The candidates still in play: inside the array and not set to -inf."""
        live = self.live
        return live[live["logit"] > -np.inf]

    @property
    def selected(self) -> int:
        """The token a selector (dist, greedy, mirostat) picked: read through llama.cpp's pointer, as a view of
        the buffer (`live`) costs more than the rest of a shortlist's draw."""
        return int(self.array.data[self.array.selected].id)

    @property
    def selected_logit(self) -> float:
        return float(self.array.data[self.array.selected].logit)

    def copy(self) -> Candidates:
        live = self.live
        return Candidates(live["id"], live["logit"])


class Chain:
    """A built llama.cpp chain and the names of its elements, in order. `raised`: the tokens a stage may
    move up (a positive logit bias; recent tokens under a negative penalty): any other token keeps its
    rank among the raw logits. `biased` and `recent` (the penalties' window, as llama.cpp keeps it): the only
    tokens the logit bias and the penalties change. Use from the worker thread."""

    def __init__(self, pointer: llama_cpp.llama_sampler_p, stages: tuple[str, ...], params: SamplingParams,
                 raised: np.ndarray, biased: np.ndarray, recent: Iterable[int]) -> None:
        self.pointer = pointer
        self.stages = stages
        self.params = params
        self.raised = raised
        self.biased = biased
        self.recent = deque(recent, maxlen=PENALTY_LAST_N)
        self.shortlist = shortlist(stages, params)
        # a greedy pick after stages that only lower the logits of the tokens they name (`draw_greedy`)
        self.picks_raw_best = (stages[-1] == "greedy" and _NAMING.issuperset(stages[:-1]) and not len(raised))
        self._named = frozenset(biased.tolist())
        self.seq: int | None = None  # the sequence llama.cpp draws for with this chain in its graph (None: none)
        self._candidates: Candidates | None = None

    @property
    def fits_graph(self) -> bool:
        """Whether every stage has a backend version (`IN_GRAPH`). No chain of stages.plan puts a cut before
        greedy, whose vendored backend version would return an index into the candidates left, not a token."""
        return IN_GRAPH.issuperset(self.stages)

    def in_graph(self) -> bool:
        """Once offered to llama.cpp (llama_set_sampler): whether it runs every element in its graph, as the
        names it gives them say ("+top-k"; "-top-k" where the device lacks an op, the plain name after one)."""
        return all(llama_cpp.llama_sampler_name(self.element(index)).startswith(b"+")
                   for index in range(len(self.stages)))

    def keeps_raw_best(self, best: int) -> bool:
        """Whether `best`, the raw argmax, is the pick of a chain that `picks_raw_best`: no stage lowers it."""
        return best not in self._named and best not in self.recent

    def draw_greedy(self, logits: np.ndarray, best: int) -> int:
        """The pick of a chain that `picks_raw_best`, recorded, from `logits` and `best`, their raw argmax. Where no
        stage lowers `best`, it is the pick: one pass over the logits (~0.02 ms) and no shortlist (~0.15). Else
        only the tokens the stages name and the likeliest of the rest can be: the chain runs over those, the
        whole vocabulary's pick tie for tie (ids ascending; `argmax` takes a tie's lowest id too)."""
        if self.keeps_raw_best(best):
            self.accept(best)
            return best
        named = self._named.union(self.recent)
        ids = np.fromiter(named, dtype=np.int64, count=len(named))
        kept = logits[ids]
        logits[ids] = -np.inf  # for the argmax of the rest: llama.cpp's row, put back before anyone else reads it
        rest = int(np.argmax(logits))
        logits[ids] = kept
        return self.draw(logits, np.union1d(ids, [rest]))

    def unbind(self) -> None:
        """Become a copy that was never offered to llama.cpp, state and all: once offered, a chain applied on the
        host skips the elements llama.cpp took for its graph."""
        offered = self.pointer
        self.pointer = llama_cpp.llama_sampler_clone(offered)
        llama_cpp.llama_sampler_free(offered)

    def sample(self, ctx: llama_cpp.llama_context_p, row: int = -1) -> int:
        """Draw from the logits of output `row` of the last decode (-1: its last); llama.cpp also records the
        token for the penalties."""
        token: int = llama_cpp.llama_sampler_sample(self.pointer, ctx, row)
        self.recent.append(token)
        return token

    def draw(self, logits: np.ndarray, likeliest: np.ndarray) -> int:
        """Draw from `logits` over the `shortlist` `likeliest` of them and the tokens a stage may raise, and
        record the token, as `sample` does over the whole vocabulary: the same pick, without building
        llama.cpp's array of every token (~1 ms of each token on a 262,144-token vocabulary). The ids go in
        ascending order, as in that array, so a tie falls to the same token."""
        ids = np.union1d(likeliest, self.raised) if len(self.raised) else np.sort(likeliest)
        if self._candidates is None or len(self._candidates.buffer) < len(ids):
            self._candidates = Candidates(ids, logits[ids])
        token = self.apply(self._candidates.refill(ids, logits[ids]))
        self.accept(token)
        return token

    def apply(self, candidates: Candidates) -> int:
        """Run the whole chain over `candidates` and return its pick, without recording it (`accept`)."""
        candidates.apply(self.pointer)
        return candidates.selected

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.pointer, token)
        self.recent.append(token)

    def element(self, index: int) -> llama_cpp.llama_sampler_p:
        element: llama_cpp.llama_sampler_p = llama_cpp.llama_sampler_chain_get(self.pointer, index)
        return element

    def touched(self, stage: str) -> np.ndarray | None:
        """The tokens `stage` may change the logits of, where that is known (None: any)."""
        if stage == "logit_bias":
            return self.biased
        if stage == "penalties":
            return np.unique(np.fromiter(self.recent, dtype=np.int32, count=len(self.recent)))
        return None

    def clone(self) -> Chain:
        """A copy with the same state (recent tokens, random generators): replays what this one does next."""
        return Chain(llama_cpp.llama_sampler_clone(self.pointer), self.stages, self.params, self.raised,
                     self.biased, self.recent)

    def free(self) -> None:
        llama_cpp.llama_sampler_free(self.pointer)


def shortlist(stages: Sequence[str], params: SamplingParams) -> int | None:
    """How many of the likeliest raw logits decide the chain's pick exactly, or None if it needs them all.

    Before a greedy pick (k = 1) or a top-k cut, the stages that only lower logits touch few tokens: the logit
    bias its biased ones, the penalties the last PENALTY_LAST_N drawn, DRY (not bounded so) is given
    SHORTLIST // 2. Lowered, they let in at most as many from below the k likeliest, so the k + that many
    likeliest decide the cut; what a stage may raise is added to the candidates. Stages after the cut see only
    its k. Anything that reads the whole distribution first (top-nσ, typical-p, XTC, min-p or top-p before the
    cut, mirostat) needs every token. Fewer cost less each token: a greedy reply with the penalties reads 65."""
    lowered = 0
    for stage in stages:
        if stage in ("greedy", "top_k"):
            k = 1 if stage == "greedy" else params.top_k
            return k + lowered if 0 < k <= SHORTLIST // 2 else None
        if stage not in _LOWERING:
            return None
        lowered += {"logit_bias": len(params.logit_bias), "penalties": PENALTY_LAST_N}.get(stage, SHORTLIST // 2)
    return None


class ChainBuilder:
    """Makes chains for one model. It keeps one DRY sampler to clone: making one scans the whole
    vocabulary for the sequence breakers (tens of ms on a 262k vocabulary), which a slider moved
    mid-reply must not cost each time."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p, n_vocab: int, n_ctx: int,
                 continuation: Callable[[str], list[int]]) -> None:
        self.vocab = vocab
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.continuation = continuation
        self._dry: tuple[tuple[float, float, int, int], llama_cpp.llama_sampler_p] | None = None

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
        biases = self.bias_tokens(params)
        raised = [token for token, bias in biases if bias > 0]
        if params.frequency_penalty < 0 or params.presence_penalty < 0:
            raised += recent[-PENALTY_LAST_N:]
        return Chain(pointer, stages, params, np.unique(np.asarray(raised, dtype=np.int32)),
                     np.unique(np.asarray([token for token, _ in biases], dtype=np.int32)), recent[-PENALTY_LAST_N:])

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

    def _make(self, stage: str, p: SamplingParams, seed: int, xtc_always: bool) -> llama_cpp.llama_sampler_p:
        makers: dict[str, Callable[[], llama_cpp.llama_sampler_p]] = {
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

    def _logit_bias(self, params: SamplingParams) -> llama_cpp.llama_sampler_p:
        entries = [llama_cpp.llama_logit_bias(token, bias) for token, bias in self.bias_tokens(params)]
        array = (llama_cpp.llama_logit_bias * max(1, len(entries)))(*entries)
        sampler: llama_cpp.llama_sampler_p = llama_cpp.llama_sampler_init_logit_bias(self.n_vocab, len(entries), array)
        return sampler

    def _dry_sampler(self, p: SamplingParams) -> llama_cpp.llama_sampler_p:
        last_n = self.n_ctx if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n
        key = (p.dry_multiplier, p.dry_base, p.dry_allowed_length, last_n)
        if self._dry is None or self._dry[0] != key:
            self.close()
            breakers = (ctypes.c_char_p * len(DRY_SEQUENCE_BREAKERS))(*(b.encode() for b in DRY_SEQUENCE_BREAKERS))
            self._dry = key, llama_cpp.llama_sampler_init_dry(self.vocab, *key, breakers, len(DRY_SEQUENCE_BREAKERS))
        clone: llama_cpp.llama_sampler_p = llama_cpp.llama_sampler_clone(self._dry[1])
        return clone


_DRAW = "dist"
_REWEIGHTING = frozenset({"logit_bias", "penalties", "dry", "temperature"})  # they move logits, cut nothing


class StageReader:
    """Applies a chain to one position's candidates one element at a time and reads what each left: how many,
    their share of the raw distribution, and where a given token stands among them (`Stage`).

    The cost follows what the stages leave, not the vocabulary: the raw softmax is computed once; while the
    candidates are still the whole vocabulary in its order, a stage that only moves some logits (the logit
    bias, the penalties) is read from the tokens it touched, and a stage that moves any (DRY, temperature)
    with one vectorised pass; after the first cut, a stage is read from the few candidates left. The
    buffers are reused (one reader per model, worker thread only)."""

    def __init__(self, n_vocab: int) -> None:
        self.vocabulary = np.arange(n_vocab, dtype=np.int32)
        self.candidates = Candidates(self.vocabulary, np.zeros(n_vocab, dtype=np.float32))
        self.probs = np.empty(n_vocab, dtype=np.float32)
        self._before = np.empty(n_vocab, dtype=np.float32)
        self._shift = 0.0  # the raw logits' maximum: probs = exp(logits - shift) / total
        self._total = 1.0

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """The raw distribution (the softmax of `logits`) into the reader's buffer; valid until the next call."""
        probs = self.probs
        self._shift = float(logits.max())
        np.subtract(logits, self._shift, out=probs)
        np.exp(probs, out=probs)
        self._total = float(probs.sum(dtype=np.float64))
        probs *= 1.0 / self._total
        return probs

    def stages(self, chain: Chain, logits: np.ndarray, token: int, *, fresh: bool = False,
               distributed: bool = False) -> tuple[Stage, ...]:
        """What each element of `chain` left of the candidates of `logits`, and where `token` stood among them.

        The chain's own state is used (its recent tokens; its random generators), so a clone of the live
        chain taken before the draw replays the draw exactly. `fresh`: a chain built for the X-ray instead,
        with `xtc_always`: XTC is shown firing unless that would have removed `token`, and mirostat from
        its starting target; the notes say so. `distributed`: `distribution(logits)` is already in the buffer.
        """
        if not distributed:
            self.distribution(logits)
        candidates = self.candidates.refill(self.vocabulary, logits)
        whole = _Whole(self, logits, token)
        stages: list[Stage] = []
        for index, name in enumerate(chain.stages):
            if name == _DRAW:
                break
            text = label(name, chain.params)
            if whole.holds(candidates) and name in _REWEIGHTING:
                stage = whole.apply(chain, index, name, text)
                if stage is not None:
                    stages.append(stage)
                    continue
                before = None
            else:
                before = candidates.copy() if fresh and name == "xtc" else None
                candidates.apply(chain.element(index))
            whole.gone()
            rows = candidates.survivors()
            note = ""
            if before is not None:
                if token in rows["id"]:
                    note = f"shown firing; it fires on {chain.params.xtc_probability:.0%} of tokens"
                else:
                    candidates, rows = before, before.survivors()
                    note = "did not fire here: firing would have removed this token"
            if name == "greedy":
                rows = rows[np.argmax(rows["logit"])][None]
            if name == "mirostat_v2" and fresh:
                note = "its adaptive target is shown at its starting value"
            stages.append(self._cut(name, text, rows, token, note))
        return tuple(stages)

    def _cut(self, name: str, text: str, rows: np.ndarray, token: int, note: str) -> Stage:
        """A stage read from the candidates it left (few, once a stage has cut)."""
        ids = rows["id"]
        mass = float(self.probs[ids].sum(dtype=np.float64))
        hit = np.flatnonzero(ids == token)
        if not hit.size:
            return Stage(name, text, len(ids), mass, None, None, note)
        logits = rows["logit"].astype(np.float64)
        mine = logits[hit[0]]
        shares = np.exp(logits - logits.max())
        return Stage(name, text, len(ids), mass, 1 + int(np.count_nonzero(logits > mine)),
                     float(shares[hit[0]] / shares.sum()), note)


class _Whole:
    """The running figures while the candidates are still the whole vocabulary in its order (position =
    token id), kept up to date from what each reweighting stage changed: how many are left, their raw
    mass, the softmax's total over them (exp(logit - shift)), and `token`'s logit and rank."""

    def __init__(self, reader: StageReader, logits: np.ndarray, token: int) -> None:
        self.reader = reader
        self.size = len(logits)
        self.token = token
        self.kept = self.size
        self.mass = 1.0
        self.shift = reader._shift
        self.total = reader._total
        self.mine = float(logits[token])
        self._raw = logits
        self._rank: int | None = None  # counted when first needed: one pass
        self.live = True

    def holds(self, candidates: Candidates) -> bool:
        array = candidates.array
        return (self.live and array.size == self.size and not array.sorted
                and ctypes.cast(array.data, ctypes.c_void_p).value == candidates.buffer.ctypes.data)

    def gone(self) -> None:
        self.live = False

    @property
    def rank(self) -> int:
        if self._rank is None:
            self._rank = 1 + int(np.count_nonzero(self._raw > self.mine))
        return self._rank

    def apply(self, chain: Chain, index: int, name: str, text: str) -> Stage | None:
        """Apply element `index` and read it; None when it was applied but must be read from the candidates
        (an infinite bias)."""
        reader = self.reader
        logits = reader.candidates.buffer["logit"]
        touched = chain.touched(name)
        if name == "temperature":
            reader.candidates.apply(chain.element(index))
            return self._rescaled(name, text, logits)
        if touched is None:  # DRY: which tokens it lowered is found by comparing
            np.copyto(reader._before, logits)
            reader.candidates.apply(chain.element(index))
            touched = np.flatnonzero(logits != reader._before).astype(np.int32)
            old = reader._before[touched].astype(np.float64)
        else:
            old = logits[touched].astype(np.float64)
            reader.candidates.apply(chain.element(index))
        new = logits[touched].astype(np.float64)
        if np.isposinf(new).any():
            return None
        self.total += float(np.exp(new - self.shift).sum() - np.exp(old - self.shift).sum())
        removed = np.isneginf(new) & ~np.isneginf(old)
        self.kept -= int(removed.sum())
        self.mass -= float(reader.probs[touched[removed]].sum(dtype=np.float64))
        if self.token in touched:
            self.mine = float(logits[self.token])
            self._rank = 1 + int(np.count_nonzero(logits > self.mine))
        else:
            self._rank = (self.rank + int(np.count_nonzero((new > self.mine) & (old <= self.mine)))
                          - int(np.count_nonzero((old > self.mine) & (new <= self.mine))))
        return self._stage(name, text)

    def _rescaled(self, name: str, text: str, logits: np.ndarray) -> Stage:
        """Temperature moved every logit and kept their order: the total is summed again, in one pass."""
        self._rank = self.rank
        work = self.reader._before
        self.shift = float(logits.max())
        np.subtract(logits, self.shift, out=work)
        np.exp(work, out=work)
        self.total = float(work.sum(dtype=np.float64))
        self.mine = float(logits[self.token])
        return self._stage(name, text)

    def _stage(self, name: str, text: str) -> Stage:
        if self.mine == -np.inf:
            return Stage(name, text, self.kept, self.mass, None, None)
        return Stage(name, text, self.kept, self.mass, self.rank, float(np.exp(self.mine - self.shift) / self.total))
