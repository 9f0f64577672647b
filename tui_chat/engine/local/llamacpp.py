"""Thin wrappers over llama.cpp's C API: one model, one context, one sequence.

We drive llama.cpp directly rather than through `llama_cpp.Llama` so that each token is one
`llama_decode` of a preallocated batch, the sampler chain can change between tokens, and the next
token's probabilities come from this step's logits alone. Use from a single thread.

The context holds several sequences: 0 is the conversation; 1 is a scratch copy that shares its cached
prefix, where a past position's logits are recomputed on demand (the X-ray, word probabilities); from
FIRST_COLUMN_SEQ on, the sampling lab's columns, which share the prompt's cells (lab.py), or, in a backend that
serves (slots.py), the serving slots: up to MAX_SLOTS sequences of their own cells.

A speculative draft is verified in one batch with logits on every row (`verify`); `row` then says which
row the sampler, the shortlist and the inspector read, and `truncate` drops the cells of rejected tokens.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import llama_cpp
import numpy as np

# numpy imports these at first use (logits views; np.unique, which the sampler chain uses): ~10 ms that the
# first reply's time to its first token would pay, paid here, as the engine starts
import numpy.ctypeslib  # noqa: F401
import numpy.ma  # noqa: F401

from ..base import Candidate, EngineError, GrammarMask
from ..compare import MAX_COLUMNS, MAX_SLOTS
from ..models import check_gguf
from ..params import SamplingParams
from ..pool import likeliest, penalised, penalised_before_cuts, pool_cut
from ..prompts import BUILTIN_EQUIVALENTS
from . import logs
from .chain import Chain, ChainBuilder, StageReader
from .cpu import Threads
from .cpu_path import CpuPath, deny_amx
from .inspector import Inspection, Inspector, Later, overlaps

SCRATCH_SEQ = 1
FIRST_COLUMN_SEQ = 2  # the sampling lab's columns: sequences FIRST_COLUMN_SEQ … FIRST_COLUMN_SEQ + MAX_COLUMNS - 1
FIRST_SLOT_SEQ = FIRST_COLUMN_SEQ  # the serving slots (slots.py): the columns' sequences and more
# The sequences a context is made for. What more of them costs (measured on the starter, 2 cores, n_ctx 4096,
# kv_unified): only llama.cpp's output buffer, which never holds fewer rows of logits than n_seq_max (n_vocab
# floats each: 1 MiB on the starter's 262,144 tokens, so 18 MiB for 18 sequences against 6 for 6; about three
# times that once a chain draws in the graph, which keeps probabilities and candidates per row too); the KV
# buffers and the compute buffer stay as they are (257.29 against 257.26 MiB), and one sequence's decode step
# took as long (20.7-28.2 ms with either, the noise of a shared machine).
N_SEQ_MAX = max(FIRST_COLUMN_SEQ + MAX_COLUMNS, FIRST_SLOT_SEQ + MAX_SLOTS)
# A user-defined token that stands for media, e.g. <start_of_image>, <image_soft_token>, [multimodal], <|vision_start|>
_MEDIA_PLACEHOLDER = re.compile(rb"[<\[]\|?[\w|]*(?:image|audio|video|vision|multimodal)[\w|]*\|?[>\]]")
ABORT_POLL_S = 0.05  # how often a prefill looks whether it should stop
POOL_SCAN = 1024  # with top-k off, the pool cut is counted among this many likeliest tokens
# The largest logit within these bounds, the softmax's exp is taken of the raw logits: their sum cannot overflow
# float32 (a million tokens at e^60 is 1e32), and what underflows (below e^-87) is under 1e-20 of it.
EXP_SAFE = (-20.0, 60.0)
_ALL_LAYERS = 0x7FFF_FFFF
GPU_BATCH, GPU_UBATCH = 2048, 512  # llama.cpp's n_batch and n_ubatch defaults
PIECE_BYTES = 256  # room for a token's text
LOAD_OVERHEAD = 64 * 2**20  # a load allocates this beside the mapped file (vocabulary, repacks): 62 MB, starter
_STATM = Path("/proc/self/statm")
_SESSION_HEADER = struct.Struct("<III")  # llama.cpp's session file: magic, version, token count; then the tokens
_QUANT_IN_NAME = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE)

_backend_ready = False
_extra_buffers_listed = False  # llama.cpp lists its extra buffer types once per process, at the first load
_amx_denied = False


@dataclass(frozen=True, slots=True)
class PromptChunk:
    """Part of a prompt read into sequence `seq` at positions from `n_past`; `last`: it ends the prompt."""

    seq: int
    tokens: Sequence[int]
    n_past: int
    last: bool


class PrefillAborted(Exception):
    """The user cancelled while the prompt was being read."""


class StateRefused(Exception):
    """A saved KV state this session will not restore (`load_state` says what became of the cache). One line."""


@dataclass(frozen=True, slots=True)
class Perf:
    """llama.cpp's own counters: `p_eval` counts batched prompt tokens, `eval` single-token steps."""

    p_eval_ms: float
    n_p_eval: int
    eval_ms: float
    n_eval: int


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def device_batch(cpu_batch: int, n_ctx: int, gpu_layers: int) -> tuple[int, int]:
    """The most prompt tokens one decode takes, and llama.cpp's physical batch. Where layers sit on a GPU,
    llama.cpp's own defaults (llama-server, llama-bench): a prompt read in as few calls as fit, its kernels fed
    GPU_UBATCH rows at a time. On a CPU `cpu_batch` for both: reading is compute-bound there whatever the batch,
    and a stop is seen, and progress said, between chunks."""
    if gpu_layers > 0:
        batch = min(GPU_BATCH, n_ctx)
        return batch, min(GPU_UBATCH, batch)
    return cpu_batch, cpu_batch


def _size_label(n_params: int) -> str:
    """A parameter count as model names give it: 7B, 1.5B, 270M, 406K."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n_params >= scale:
            return f"{n_params / scale:.3g}{unit}"
    return str(n_params)


def quantization_of(path: Path, description: str) -> str:
    match = _QUANT_IN_NAME.search(path.name) or _QUANT_IN_NAME.search(description)
    return match.group(1).upper() if match else "unknown"


class LlamaSession:
    """A loaded model with its KV cache. `tokens` mirrors exactly what the cache holds."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        gpu_layers: int,
        n_batch: int,
        threads: Threads,
        cpu_path: CpuPath | None = None,
        on_progress: Callable[[float], bool] | None = None,
        backend_sampling: bool | None = None,
    ) -> None:
        _init_backend()
        self.tokens: list[int] = []
        self.threads = threads
        self.cpu_path = _take_cpu_path(cpu_path) if cpu_path else None
        logs.take_errors()

        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = _ALL_LAYERS if gpu_layers < 0 else gpu_layers
        model_params.use_extra_bufts = self.cpu_path is None or self.cpu_path.extra_buffers
        if on_progress is not None:
            self._progress = llama_cpp.llama_progress_callback(lambda fraction, _data: bool(on_progress(fraction)))
            model_params.progress_callback = self._progress
        check_gguf(path)
        _check_address_space(path)
        with logs.collecting() as allocated:  # llama.cpp logs each buffer it allocates: where the model sits
            self.model = llama_cpp.llama_model_load_from_file(os.fsencode(path), model_params)
        if not self.model:
            raise EngineError(_load_failure(path))

        self.n_layers = llama_cpp.llama_model_n_layer(self.model)
        self.gpu_layers = min(self.n_layers, model_params.n_gpu_layers) if supports_gpu_offload() else 0
        self.n_batch, n_ubatch = device_batch(n_batch, n_ctx, self.gpu_layers)
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = n_ctx
        context_params.n_batch = self.n_batch
        context_params.n_ubatch = n_ubatch
        context_params.n_threads = threads.decode
        context_params.n_threads_batch = threads.batch
        context_params.swa_full = True  # sliding-window models keep every position, so earlier turns stay reusable
        # One cache for every sequence (kv_unified, llama-server's -kvu): the scratch one and the lab's columns tag
        # the cells they share instead of copying them, the conversation keeps the whole context, and a serving
        # slot takes what its request needs. Without it llama.cpp would give each sequence a stream of its own
        # of n_ctx / n_seq_max cells (n_ctx_seq), the conversation's context cut to 1/18th.
        context_params.n_seq_max = N_SEQ_MAX
        context_params.kv_unified = True
        context_params.no_perf = False
        self.kv_types = (context_params.type_k, context_params.type_v)
        with logs.collecting() as context_allocated:
            self.ctx = llama_cpp.llama_init_from_model(self.model, context_params)
        self.allocated = allocated + context_allocated  # read by ggml.device_memory
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            self.model = None
            raise EngineError(f"cannot create a {n_ctx}-token context for {path.name}: {_context_failure()}")

        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.bos_text = self.special_text(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos_text = self.special_text(llama_cpp.llama_vocab_eos(self.vocab))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._pieces: dict[int, bytes] = {}
        self._end_of_generation: dict[int, bool] = {}
        self._probs = np.empty(self.n_vocab, dtype=np.float32)
        self._logits_view: tuple[tuple[int, int] | None, int | None, np.ndarray | None] = (None, None, None)
        self._decodes = 0  # counts llama_decode calls: what a shortlist of the last logits is valid for
        self._shortlist: tuple[tuple[int, int], int, np.ndarray] | None = None
        self.row = -1  # the output row `logits` reads: -1 the last; after `verify`, the row being walked
        self._stop_flag = ctypes.create_string_buffer(2)  # b"\1" once a stop is asked for mid-prefill
        self._abort = _flag_reader(self._stop_flag)
        self.chains = ChainBuilder(self.vocab, self.n_vocab, self.n_ctx, self.continuation)
        self._stage_reader: StageReader | None = None
        self.backend_sampling = self._allows_backend_sampling(backend_sampling)
        self._inspector: Inspector | None = None  # made when a reply first records the inspector's figures
        # a one-token step as the load's warm-up timed it: what the thread governor knows of the model's speed
        # before a reply has timed one (a fast model keeps a core for the app while its first prompt is read)
        self.step_ms_at_load: float | None = None
        self._warm_up()

    def _warm_up(self) -> None:
        """One decode before the first prompt, then an empty cache, as llama.cpp's own tools do at load (and
        llama-bench before it times): a GPU's first batch pays for setting up its kernels, which the first prompt
        of a reply would otherwise pay (the app read 518 tokens at 0.12-0.17 x pp512 on an H200). A whole batch
        where layers are offloaded (milliseconds there), two tokens on a CPU. On AMX, a whole batch: the batch
        sizes a reply will run, so a kernel that crashes on either does it inside the load's trial
        (cpu_path.on_trial), not in the first reply. Then one token, timed: `step_ms_at_load`."""
        bos = max(llama_cpp.llama_vocab_bos(self.vocab), 0)
        amx = self.cpu_path is not None and self.cpu_path.uses_amx
        first = self.n_batch if self.gpu_layers > 0 or amx else 2
        status = self._submit([bos] * first, 0, 0, True)
        if status == 0:
            started = time.perf_counter()
            status = self._submit([bos], first, 0, True)
            llama_cpp.llama_synchronize(self.ctx)
            self.step_ms_at_load = (time.perf_counter() - started) * 1000
        llama_cpp.llama_memory_clear(self.memory, True)
        llama_cpp.llama_synchronize(self.ctx)
        llama_cpp.llama_perf_context_reset(self.ctx)
        if status != 0:
            self.close()
            raise EngineError(_decode_failure(status))

    def _allows_backend_sampling(self, wanted: bool | None) -> bool:
        """Whether llama.cpp may draw inside its graph (`attach`): by default where the output layer is on a GPU
        (llama.cpp offloads it with the first layer). On a CPU its graph pads the whole logits row first, in
        ggml's slow pad kernel (+2.3 ms a token on the proxy's 262,144-token vocabulary, 1 thread, against 0.1 to
        0.35 ms for the host's draw). Never for a recurrent or hybrid model, whose last cell cannot be dropped to
        be read again (`reread_last`)."""
        recurrent = llama_cpp.llama_model_is_recurrent(self.model) or llama_cpp.llama_model_is_hybrid(self.model)
        return (self.gpu_layers > 0 if wanted is None else wanted) and not recurrent

    def set_threads(self, threads: Threads) -> None:
        """Takes effect from the next decode: the count can follow the machine's load mid-reply."""
        llama_cpp.llama_set_n_threads(self.ctx, threads.decode, threads.batch)
        self.threads = threads

    # --- model facts -------------------------------------------------------------------------

    def description(self) -> str:
        """llama.cpp's "gemma3 270M Q4_K - Medium"; a size it has no name for ("llama ?B F16") from the count."""
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.model, buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace").replace(" ?B ", f" {_size_label(self.n_params())} ", 1)

    def chat_template(self) -> str | None:
        """The model's Jinja template. For a few models without one llama.cpp answers with the name of one of
        its built-in formats instead: its Jinja equivalent where there is one, else none (never the name
        itself, which Jinja would render as that text)."""
        template = llama_cpp.llama_model_chat_template(self.model, None)
        if not template:
            return None
        text = template.decode("utf-8", errors="replace")
        return BUILTIN_EQUIVALENTS.get(text) if text in builtin_template_names() else text

    def size_bytes(self) -> int:
        return int(llama_cpp.llama_model_size(self.model))

    def n_params(self) -> int:
        return int(llama_cpp.llama_model_n_params(self.model))

    def n_ctx_train(self) -> int:
        return int(llama_cpp.llama_model_n_ctx_train(self.model))

    def is_end_of_generation(self, token: int) -> bool:
        """Asked of every token drawn: llama.cpp's answer kept per token (a call costs ~12 µs, a look-up 0.1)."""
        known = self._end_of_generation.get(token)
        if known is None:
            known = self._end_of_generation[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return known

    # --- text <-> tokens ----------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        return _tokenize(self.vocab, text, add_bos=add_bos)

    def continuation(self, text: str) -> list[int]:
        """`text`'s tokens as they would come after other text: no BOS, and without the space that
        some tokenizers (SentencePiece's add_space_prefix) put before the start of a text."""
        tokens = self.tokenize(text, add_bos=False)
        if self.detokenize(tokens) == text:
            return tokens
        anchor = self.tokenize("\n", add_bos=False)
        joined = self.tokenize("\n" + text, add_bos=False)
        rest = joined[len(anchor) :]
        if joined[: len(anchor)] == anchor and self.detokenize(rest) == text:
            return rest
        return tokens

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(token) for token in tokens).decode("utf-8", errors="replace")

    def piece(self, token: int) -> bytes:
        """The bytes a generated token stands for. Tokens that are not text show as nothing: llama.cpp's control,
        unknown and unused tokens, and the placeholders of images, audio or video that some files list as
        user-defined text (Gemma 3's `<start_of_image>` in the starter, beside `<table>`, which is text): a text
        chat has no media to open. A model may still write one: it stays in the reply's tokens, by its
        `special_text` (`Token.special`)."""
        cached = self._pieces.get(token)
        if cached is None:  # a buffer of its own: the inspector's thread asks for pieces too (the call frees the GIL)
            buffer = ctypes.create_string_buffer(PIECE_BYTES)
            size = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, False)
            cached = buffer.raw[: max(size, 0)]
            if cached and _MEDIA_PLACEHOLDER.fullmatch(cached) and self._user_defined(token):
                cached = b""
            self._pieces[token] = cached
        return cached

    def _user_defined(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_get_attr(self.vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED)

    def special_text(self, token: int) -> str:
        """How a template writes a special token such as BOS, so it can be recognised in rendered text."""
        if token < 0:
            return ""
        buffer = ctypes.create_string_buffer(PIECE_BYTES)
        size = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, True)
        return buffer.raw[: max(size, 0)].decode("utf-8", errors="replace")

    # --- the KV cache -------------------------------------------------------------------------

    def common_prefix(self, prompt: Sequence[int]) -> int:
        """How many cached tokens `prompt` starts with. One prompt token is always left to evaluate, since
        its logits give the first reply token."""
        limit = min(len(self.tokens), len(prompt) - 1)
        keep = 0
        while keep < limit and self.tokens[keep] == prompt[keep]:
            keep += 1
        return keep

    def keep_prefix(self, prompt: Sequence[int]) -> int:
        """Drop cached tokens after the longest common prefix with `prompt`; returns how many stay."""
        keep = self.common_prefix(prompt)
        if keep < len(self.tokens):
            if not llama_cpp.llama_memory_seq_rm(self.memory, 0, keep, -1):
                llama_cpp.llama_memory_clear(self.memory, True)
                keep = 0
            del self.tokens[keep:]
        return keep

    def prefill(self, tokens: Sequence[int], on_chunk: Callable[[int], None], should_stop: Callable[[], bool]) -> None:
        """Evaluate `tokens` after the cached ones in n_batch chunks; only the last one's logits are kept.

        A stop is seen between chunks and, within ABORT_POLL_S, inside one: llama.cpp asks whether to abort at
        every node of its graph (~600 a chunk on the starter), so it reads a flag byte in C (`_flag_reader`),
        which a watcher thread sets once `should_stop` says so. A Python callback there took the GIL at every
        node, and a busy UI thread holds it: a 505-token prompt took 7.3 s to read beside a thread running Python,
        4.4 s with the flag, as with no check at all (measured, AMD EPYC, 1 thread)."""
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(should_stop, done), name="prefill-watch", daemon=True)
        llama_cpp.llama_set_abort_callback(self.ctx, self._abort, ctypes.cast(self._stop_flag, ctypes.c_void_p))
        watcher.start()
        try:
            for start in range(0, len(tokens), self.n_batch):
                if should_stop():
                    raise PrefillAborted
                chunk = tokens[start : start + self.n_batch]
                self._decode(chunk, want_logits=start + len(chunk) == len(tokens))
                on_chunk(start + len(chunk))
        finally:
            done.set()
            watcher.join()
            llama_cpp.llama_set_abort_callback(self.ctx, llama_cpp.ggml_abort_callback(), None)
            self._stop_flag[0] = b"\0"

    def _watch(self, should_stop: Callable[[], bool], done: threading.Event) -> None:
        while not done.wait(ABORT_POLL_S):
            if should_stop():
                self._stop_flag[0] = b"\1"
                return

    def step(self, token: int) -> None:
        """Add one sampled token to the cache and compute the next logits."""
        batch = self._batch
        batch.n_tokens = 1
        batch.token[0] = token
        batch.pos[0] = len(self.tokens)
        batch.logits[0] = 1
        self._decodes += 1
        self.row = -1
        status = llama_cpp.llama_decode(self.ctx, batch)
        if status != 0:
            raise EngineError(_decode_failure(status))
        self.tokens.append(token)

    def verify(self, tokens: Sequence[int]) -> None:
        """Add `tokens` (a sampled token, then a draft) to the cache in one batch with logits on every row:
        row i is what `step` would have given after `tokens[i]`. `row` starts at 0; `truncate` drops what
        the walk rejects."""
        n_past = len(self.tokens)
        status = self._submit(tokens, n_past, 0, True, every_row=True)
        if status != 0:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, n_past, -1)
            raise EngineError(_decode_failure(status))
        self.tokens.extend(tokens)
        self.row = 0

    def truncate(self, keep: int) -> None:
        """Drop the cached tokens after the first `keep` (a rejected draft's cells); the logits of the last
        decode stay readable."""
        if keep < len(self.tokens):
            llama_cpp.llama_memory_seq_rm(self.memory, 0, keep, -1)
            del self.tokens[keep:]

    def _decode(self, chunk: Sequence[int], *, want_logits: bool) -> None:
        n_past = len(self.tokens)
        status = self._submit(chunk, n_past, 0, want_logits)
        if status == 2:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, n_past, -1)
            raise PrefillAborted
        if status != 0:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, n_past, -1)
            raise EngineError(_decode_failure(status))
        self.tokens.extend(chunk)

    # --- the KV cache on disk -----------------------------------------------------------------
    #
    # The whole context's state, not the sequence's (llama_state_seq_*): a sequence's state leaves out the
    # cells its sliding window has passed (llama_kv_cache::state_write skips SWA-masked cells), so a
    # sliding-window model's state could only be continued from its very end, never cut back to a shorter
    # prefix. With swa_full the whole context holds every position, and this context holds one sequence.

    def state_file_bytes(self) -> int:
        """The size `save_state` writes now."""
        return _SESSION_HEADER.size + 4 * len(self.tokens) + int(llama_cpp.llama_state_get_size(self.ctx))

    def save_state(self, path: Path) -> int:
        """Write the KV cache and its tokens to `path` as llama.cpp's session file, streamed to disk by
        llama.cpp (no copy in memory); returns its size. Raises OSError when it is not written whole
        (llama.cpp does not check its last write, so the size is)."""
        expected = self.state_file_bytes()
        tokens = (llama_cpp.llama_token * len(self.tokens))(*self.tokens)
        logs.take_errors()
        if not llama_cpp.llama_state_save_file(self.ctx, os.fsencode(path), tokens, len(self.tokens)):
            raise OSError(_last_error("llama.cpp could not write the state"))
        written = os.path.getsize(path)
        if written != expected:
            raise OSError(f"{written:,} of {expected:,} bytes were written (is the disk full?)")
        return written

    def load_state(self, body: memoryview, tokens: np.ndarray) -> None:
        """Replace the KV cache with a state `save_state` wrote holding `tokens`. Raises StateRefused when its
        llama.cpp header disagrees (the cache is left as it was) or llama.cpp cannot restore it (the cache is
        then empty)."""
        if len(body) < _SESSION_HEADER.size:
            raise StateRefused("it is too short")
        magic, version, count = _SESSION_HEADER.unpack_from(body)
        if (magic, version) != (llama_cpp.LLAMA_SESSION_MAGIC, llama_cpp.LLAMA_SESSION_VERSION):
            raise StateRefused(f"it is not a session file of this llama.cpp (version {version})")
        start = _SESSION_HEADER.size + 4 * count
        if count != len(tokens) or body[_SESSION_HEADER.size : start] != tokens.astype(np.int32).tobytes():
            raise StateRefused("its tokens differ from its record")
        self.tokens = []
        logs.take_errors()
        self._decodes += 1
        self.row = -1
        if not _set_state(self.ctx, body, start):
            llama_cpp.llama_memory_clear(self.memory, True)
            raise StateRefused(_last_error("llama.cpp could not restore it"))
        self.tokens = tokens.tolist()


    def _submit(self, chunk: Sequence[int], n_past: int, seq: int, want_logits: bool, *,
                every_row: bool = False) -> int:
        """One `llama_decode` of `chunk` at positions from `n_past` in sequence `seq`; its status. Logits for
        the last row if `want_logits`, for each with `every_row`. The batch's sequence ids are left at 0,
        which `step` (the hot path) relies on."""
        batch = self._batch
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = n_past + i
            batch.logits[i] = int(every_row)
            batch.seq_id[i][0] = seq
        batch.logits[len(chunk) - 1] = int(want_logits)
        self._decodes += 1
        self.row = -1
        try:
            status: int = llama_cpp.llama_decode(self.ctx, batch)
            return status
        finally:
            for i in range(len(chunk) if seq else 0):
                batch.seq_id[i][0] = 0

    def scratch_logits(self, context: Sequence[int], then: Sequence[int] = ()) -> np.ndarray:
        """Logits after `context`, then after each token of `then`: row j follows context + then[:j].

        Computed in the scratch sequence, which starts as a copy of the cached prefix it shares with
        `context` (llama.cpp tags the cells, nothing is copied), so only what the cache lacks is read;
        the rows come one token at a time, the shape the decode loop uses, so their figures agree with
        the inspector's. The scratch sequence is dropped afterwards: the conversation is untouched.
        """
        if not context:
            raise EngineError("there is no text before this position to compute it from")
        shared = self.common_prefix(context)
        rows = np.empty((len(then) + 1, self.n_vocab), dtype=np.float32)
        try:
            if shared:
                llama_cpp.llama_memory_seq_cp(self.memory, 0, SCRATCH_SEQ, 0, shared)
            body = context[shared:-1]
            for start in range(0, len(body), self.n_batch):
                self._check(self._submit(body[start : start + self.n_batch], shared + start, SCRATCH_SEQ, False))
            for row, token in enumerate([context[-1], *then]):
                self._check(self._submit([token], len(context) - 1 + row, SCRATCH_SEQ, True))
                rows[row] = self.logits()
        finally:
            llama_cpp.llama_memory_seq_rm(self.memory, SCRATCH_SEQ, -1, -1)
        return rows

    def reading_rate(self, tokens: Sequence[int] | np.ndarray) -> float:
        """How fast this context reads a prompt, in tokens a second: one batch of `tokens` read in the scratch
        sequence from the start (nothing shared), dropped afterwards."""
        chunk = list(tokens[: self.n_batch])
        started = time.perf_counter()
        try:
            self._check(self._submit(chunk, 0, SCRATCH_SEQ, False))
        finally:
            llama_cpp.llama_memory_seq_rm(self.memory, SCRATCH_SEQ, -1, -1)
        return len(chunk) / (time.perf_counter() - started)

    def share_prompt(self, seq: int) -> None:
        """Sequence `seq` starts as the conversation's cached tokens: llama.cpp tags their cells, copies nothing."""
        llama_cpp.llama_memory_seq_cp(self.memory, 0, seq, -1, -1)

    def drop_sequence(self, seq: int) -> None:
        """Free the cells only `seq` holds (the ones it shares stay with the others)."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def trim_sequence(self, seq: int, keep: int) -> int:
        """Drop sequence `seq`'s cells from position `keep` on; how many stay (none where llama.cpp cannot cut
        it there)."""
        if llama_cpp.llama_memory_seq_rm(self.memory, seq, keep, -1):
            return keep
        llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)
        return 0

    def step_rows(self, rows: Sequence[tuple[int, int, int]], reading: Sequence[PromptChunk] = ()) -> list[int]:
        """One `llama_decode` of one token per generating sequence, each (token, position, sequence), with logits
        for every row (`row = i` reads row i's), and of `reading`'s prompt chunks after them, as llama.cpp's server
        mixes a newcomer's prompt into the decode batch: the others go on a token per chunk instead of waiting
        for the whole read. Returns, per chunk, the batch index of its last row (its logits kept where the chunk
        ends its prompt). The sequence ids go back to 0 afterwards, as `step` needs."""
        batch = self._batch
        count = 0
        for token, position, seq in rows:
            count = self._put(count, token, position, seq, True)
        ends: list[int] = []
        for chunk in reading:
            for offset, token in enumerate(chunk.tokens):
                count = self._put(count, token, chunk.n_past + offset, chunk.seq, False)
            batch.logits[count - 1] = int(chunk.last)
            ends.append(count - 1)
        batch.n_tokens = count
        self._decodes += 1
        try:
            status = llama_cpp.llama_decode(self.ctx, batch)
        finally:
            for i in range(count):
                batch.seq_id[i][0] = 0
        self._check(status)
        return ends

    def _put(self, index: int, token: int, position: int, seq: int, logits: bool) -> int:
        batch = self._batch
        batch.token[index] = token
        batch.pos[index] = position
        batch.seq_id[index][0] = seq
        batch.logits[index] = int(logits)
        return index + 1

    @staticmethod
    def _check(status: int) -> None:
        if status != 0:
            raise EngineError(_decode_failure(status))

    # --- sampling -----------------------------------------------------------------------------

    def new_sampler(self, params: SamplingParams, seed: int) -> Chain:
        """The sampler chain for `params` (chain.py), primed with the recent tokens its penalties look at."""
        return self.chains.build(params, seed, self.tokens)

    def free_sampler(self, chain: Chain) -> None:
        self.detach(chain)
        chain.free()

    def attach(self, chain: Chain, seq: int = 0) -> bool:
        """Let llama.cpp draw with `chain` inside its graph at each decode of sequence `seq` from the next on
        (backend sampling): `sample` then reads its token, and the host does nothing per token; `logits` then
        reads what the chain made of the row (penalised, cut, tempered), not the model's. False, and nothing attached,
        where llama.cpp would run only part of the chain there (a stage without a backend version, an op the
        device lacks): the chain is then drawn on the host. Detached by `free_sampler`."""
        if not (self.backend_sampling and chain.fits_graph):
            return False
        llama_cpp.llama_set_sampler(self.ctx, seq, chain.pointer)
        if chain.in_graph():
            chain.seq = seq
            return True
        llama_cpp.llama_set_sampler(self.ctx, seq, None)
        chain.unbind()
        return False

    def detach(self, chain: Chain) -> None:
        """Its sequence's tokens drawn on the host again, from the next decode on, with this chain if need be."""
        if chain.seq is not None:
            llama_cpp.llama_set_sampler(self.ctx, chain.seq, None)
            chain.seq = None
            chain.unbind()

    def reread_last(self) -> None:
        """Decode the last cached token again, for the model's logits row (a decode with a chain attached gives the
        chain's): a chain built mid-reply (settings changed) draws its first token from it."""
        token = self.tokens.pop()
        llama_cpp.llama_memory_seq_rm(self.memory, 0, len(self.tokens), -1)
        self.step(token)

    def sample(self, chain: Chain, inspected: bool = False) -> int:
        """The next token from the last decoded logits; over a shortlist where the chain allows one. With the
        chain attached, the token llama.cpp drew in its graph, recorded for the penalties as a host draw is.
        `inspected`: the inspector reads this row's likeliest next, so a greedy pick whose raw best a stage
        lowered takes them too (`likeliest` finds them once for both), not the cheaper `draw_greedy`."""
        if chain.seq is not None:
            token: int = llama_cpp.llama_get_sampled_token_ith(self.ctx, self.row)
            chain.accept(token)
            return token
        if chain.shortlist is None:
            return chain.sample(self.ctx, self.row)
        if chain.picks_raw_best:
            best = int(self.likeliest(1)[0])
            if not inspected or chain.keeps_raw_best(best):
                return chain.draw_greedy(self.logits(), best)
        return chain.draw(self.logits(), self.likeliest(chain.shortlist))

    @property
    def stage_reader(self) -> StageReader:
        """The X-ray's reader and its buffers (a few MB on a large vocabulary), made when first asked for."""
        if self._stage_reader is None:
            self._stage_reader = StageReader(self.n_vocab)
        return self._stage_reader

    def logits(self) -> np.ndarray:
        """The logits of `row` of the last decode (its last position unless a draft is being walked): a view into
        llama.cpp's buffer, valid until the next decode. The view is kept while llama.cpp keeps the buffer
        (making one costs ~0.15 ms, a percent of a token), and asked for once per decode and row: a token's
        sampler and inspector read it four times, and each ask costs ~10 µs right after a decode."""
        key = (self._decodes, self.row)
        asked, address, view = self._logits_view
        if asked == key and view is not None:
            return view
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, self.row)
        found = ctypes.cast(pointer, ctypes.c_void_p).value
        if found != address or view is None:
            view = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        self._logits_view = (key, found, view)
        return view

    def likeliest(self, k: int) -> np.ndarray:
        """`pool.likeliest` of the logits `logits` reads, found once per decode and row and narrowed for a smaller
        `k`: the sampler and the inspector share it."""
        logits = self.logits()
        key = (self._decodes, self.row)
        if self._shortlist is None or self._shortlist[0] != key or self._shortlist[1] < k:
            self._shortlist = (key, k, likeliest(logits, k))
        _, found, ids = self._shortlist
        return ids if found == k else ids[np.argpartition(logits[ids], -k)[-k:]]

    def inspect(self, token: int, top_n: int, params: SamplingParams, recent: Sequence[int] = (),
                judge: Callable[[], tuple[np.ndarray, bool]] | None = None) -> Inspection:
        """`token`'s probability, the top-N candidates and the pool cut, under this step's raw distribution.

        Softmax into a preallocated buffer and one partial sort of the few hundred likeliest tokens:
        no full-vocabulary sort, no copies, and nothing at all when the inspector is off. With an
        output format, `judge` (grammar.Constraint.judge: which tokens of the vocabulary it allows, and
        whether that left one choice) marks the candidates and measures the mask.
        """
        best = self.likeliest(self.pool_scan(top_n, params, recent))
        return self.inspection(self.logits(), best, self._probs, token, top_n, params, recent, judge)

    def inspect_later(self, token: int, top_n: int, params: SamplingParams,
                      recent: Sequence[int] = ()) -> Later | Inspection:
        """`inspect`'s figures, computed from a copy of this row in a thread of their own while the next token
        decodes (inspector.py): the same numbers, off the path between two decodes where a core is free for
        them; at once where none is."""
        if not overlaps(self.threads.decode):
            return self.inspect(token, top_n, params, recent)
        if self._inspector is None:
            self._inspector = Inspector(self.n_vocab, self._inspect_copy)
        return self._inspector.submit(self.logits(), token, top_n, params, tuple(recent))

    def _inspect_copy(self, row: np.ndarray, probs: np.ndarray, token: int, top_n: int, params: SamplingParams,
                      recent: tuple[int, ...]) -> Inspection:
        """`inspect` on a copy of a row, with a buffer of its own (the inspector's thread)."""
        best = likeliest(row, self.pool_scan(top_n, params, recent))
        return self.inspection(row, best, probs, token, top_n, params, recent)

    def inspection(self, logits: np.ndarray, best: np.ndarray, probs: np.ndarray, token: int, top_n: int,
                   params: SamplingParams, recent: Sequence[int] = (),
                   judge: Callable[[], tuple[np.ndarray, bool]] | None = None) -> Inspection:
        """The inspector's figures from a logits row, its `best` (the likeliest, unordered) and a buffer for the
        softmax the size of the vocabulary. The token's probability and the candidates are the raw
        distribution's; the pool is what the chain's cuts keep, so where its penalties come before them it is
        counted after the penalties on `recent` (the chain's window before this draw), as the X-ray replays it."""
        largest = float(logits[best].max())
        shift = 0.0 if EXP_SAFE[0] < largest < EXP_SAFE[1] else largest
        if shift == 0.0:  # one pass less (~0.08 ms of a token, measured after a decode)
            np.exp(logits, out=probs)
        else:
            np.subtract(logits, largest, out=probs)
            np.exp(probs, out=probs)
        total = float(probs.sum())
        scale = 1.0 / total
        pool = pool_cut(penalised(logits, best, shift, total, recent, params) if recent and penalised_before_cuts(
            params) else np.sort(probs[best])[::-1] * scale, self.n_vocab, params)
        best = best[np.argsort(probs[best])[::-1]]
        ranked = probs[best] * scale
        allowed, forced = judge() if judge is not None else (None, False)
        marks: list[bool | None] = [None] * top_n if allowed is None else allowed[best[:top_n]].tolist()
        candidates = tuple(
            Candidate(t, self.piece(t).decode("utf-8", errors="replace"), p, mark)
            for t, p, mark in zip(best[:top_n].tolist(), ranked[:top_n].tolist(), marks, strict=False)
        )
        mask = None if allowed is None else GrammarMask(
            float(probs.sum(where=~allowed, dtype=np.float64)) * scale, int(allowed.sum()), forced)
        return Inspection(float(probs[token]) * scale, candidates, pool, mask)

    def pool_scan(self, top_n: int, params: SamplingParams, recent: Sequence[int] = ()) -> int:
        """How many of the likeliest `inspect` ranks: the top N, and what the pool cut counts among (top-k's, or
        POOL_SCAN, and as many more as the penalties may push below it: a token ranked k + 1 joins the top k
        when one above is penalised); at temperature 0 the pool is the one token drawn, so the top N alone."""
        if params.temperature <= 0:
            return min(int(self.n_vocab), top_n)
        pool = params.top_k if 0 < params.top_k < POOL_SCAN else POOL_SCAN
        return min(int(self.n_vocab), max(top_n, pool + len(set(recent))))

    # --- counters and teardown ----------------------------------------------------------------

    def reset_perf(self) -> None:
        llama_cpp.llama_perf_context_reset(self.ctx)

    def perf(self) -> Perf:
        data = llama_cpp.llama_perf_context(self.ctx)
        return Perf(data.t_p_eval_ms, data.n_p_eval, data.t_eval_ms, data.n_eval)

    def close(self) -> None:
        self.chains.close()
        if self._inspector is not None:
            self._inspector.close()
        if self.ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None


def _flag_reader(flag: ctypes.Array[ctypes.c_char]) -> Callable[[ctypes.c_void_p], None]:
    """llama.cpp's abort callback, called with a pointer to `flag`: the C library's strlen, which reads it without
    Python (a length of 1, true, once its first byte is set), where the C library can be found; else Python."""
    try:
        library = ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(None)
        address = ctypes.cast(library.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        address = None
    if address is None:
        return llama_cpp.ggml_abort_callback(lambda _data: flag.raw[0] != 0)
    return llama_cpp.ggml_abort_callback(address)


def _set_state(ctx: llama_cpp.llama_context_p, body: memoryview, start: int) -> bool:
    """Restore the state that fills `body` from `start`. Its own function, so that the array over `body` is gone
    when it returns, even before an exception: the caller's view of the file must close."""
    state = np.frombuffer(body, dtype=np.uint8, offset=start)
    pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
    restored: int = llama_cpp.llama_state_set_data(ctx, pointer, state.size)
    return restored == state.size


def _tokenize(vocab: llama_cpp.llama_vocab_p, text: str, *, add_bos: bool) -> list[int]:
    """Special-token text (e.g. `<start_of_turn>`) becomes its token, as chat templates expect."""
    data = text.encode("utf-8")
    capacity = len(data) + 2
    while True:
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, capacity, add_bos, True)
        if count >= 0:
            return list(buffer[:count])
        capacity = -count


def builtin_template_names() -> frozenset[str]:
    """The names of llama.cpp's built-in chat formats (`llama_chat_builtin_templates`)."""
    count = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * count)()
    llama_cpp.llama_chat_builtin_templates(names, count)
    return frozenset(name.decode() for name in names if name)


def count_tokens(path: Path, text: str) -> int:
    """How many tokens `text` takes in the model at `path`, loading only its vocabulary, not its weights."""
    _init_backend()
    logs.take_errors()
    model_params = llama_cpp.llama_model_default_params()
    model_params.vocab_only = True
    check_gguf(path)
    model = llama_cpp.llama_model_load_from_file(os.fsencode(path), model_params)
    if not model:
        raise EngineError(_load_failure(path))
    try:
        return len(_tokenize(llama_cpp.llama_model_get_vocab(model), text, add_bos=False))
    finally:
        llama_cpp.llama_model_free(model)


def _take_cpu_path(path: CpuPath) -> CpuPath:
    """Put `path` into effect for this process. AMX can only be denied before llama.cpp lists its extra
    buffer types (at the first load with them): later, doing without them all is the safe way."""
    global _extra_buffers_listed, _amx_denied
    if path.name == "no-amx" and not _amx_denied:
        if _extra_buffers_listed or not deny_amx():
            path = replace(path, name="none")
        else:
            _amx_denied = True
    _extra_buffers_listed = _extra_buffers_listed or path.extra_buffers
    return path


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


def _check_address_space(path: Path) -> None:
    """Under an address-space limit (`ulimit -v`) too small for the weights, llama.cpp may map them and then
    abort on a small allocation (GGML_ASSERT) instead of failing the load: refused before, with the sizes."""
    if not _STATM.exists():  # Linux only: elsewhere the load is left to fail as it does
        return
    import resource  # not on Windows, which has no /proc either

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return
    in_use = int(_STATM.read_text().split()[0]) * resource.getpagesize()
    needed = path.stat().st_size + LOAD_OVERHEAD
    if in_use + needed > limit:
        raise EngineError(f"cannot load {path.name}: not enough memory (the address-space limit, ulimit -v, "
                          f"leaves {max(0, limit - in_use) // 2**20} MB; loading needs about {needed // 2**20} MB)")


def _load_failure(path: Path) -> str:
    errors = logs.take_errors()
    reason = next((e for e in reversed(errors) if "failed to load model" not in e), errors[-1] if errors else "")
    reason = reason.removeprefix("llama_model_load: error loading model: ").strip()
    if "Cannot allocate memory" in reason:
        reason = f"not enough memory ({reason})"
    return f"cannot load {path.name}: {reason or 'llama.cpp rejected the file'}"


def _context_failure() -> str:
    """Why llama.cpp could not make a context: nearly always memory, said plainly with the size it wanted."""
    errors = logs.take_errors()
    sizes = [m[1] for error in errors if (m := re.search(r"attempted to allocate\s+([\d.]+ [KMG]?B)", error))]
    if sizes:
        return (f"not enough memory (llama.cpp could not allocate {sizes[0]}); "
                "a smaller context (--n-ctx, n_ctx) needs less")
    return "; ".join(errors) or "not enough memory?"


def _last_error(fallback: str) -> str:
    errors = logs.take_errors()
    return errors[-1] if errors else fallback


def _decode_failure(status: int) -> str:
    if status == 1:
        return "the context is full: no room left in the KV cache"
    return f"llama.cpp could not evaluate the tokens (llama_decode returned {status})"
