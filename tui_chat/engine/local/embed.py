"""Pooled embeddings (`serve`'s /v1/embeddings): a llama.cpp context of their own, on the chat model or on a
dedicated embedding model loaded beside it (`serve --embeddings MODEL`).

As llama-server makes them: the context has `embeddings` on and a pooling type, the model's own where its GGUF
names one (`{arch}.pooling_type`: mean, CLS or last) and mean where it names none (a causal LM such as the
starter); llama.cpp pools each sequence's hidden states (after the final norm) and the vector is L2-normalised
here, as llama-server and OpenAI return it. Each text is read alone, whole, in one batch: llama.cpp pools inside one
physical batch, so a text must fit in one (`EMBED_TOKENS`, llama-server's default physical batch); a longer one is
refused, never cut. In this mode llama.cpp outputs every token, its logits too (a causal LM's output layer runs on
each: the starter's 262,144-token vocabulary costs ~1 MiB of compute buffer per token of the batch).

The context is never the chat's: the worker thread decodes the chats and the serving slots in theirs while an
embedding is read here, on the caller's thread, under this module's lock (llama.cpp's model is read-only and
shared; each context is used by one thread at a time).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from ..base import Embedded, EngineError, InputRefused
from ..models import check_gguf
from .cpu import Threads
from .cpu_path import CpuPath
from .llamacpp import (
    _ALL_LAYERS,
    LlamaSession,
    _check_address_space,
    _context_failure,
    _load_failure,
    _tokenize,
)

EMBED_TOKENS = 512  # the most tokens a text may take: one physical batch, llama-server's default (--ubatch-size)
POOLING_NAMES = {llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean", llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
                 llama_cpp.LLAMA_POOLING_TYPE_LAST: "last"}
_NONE_NAMED = (llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED, llama_cpp.LLAMA_POOLING_TYPE_NONE)


def model_pooling(model: llama_cpp.llama_model_p) -> int:
    """How a model's vectors are pooled: its GGUF's `{arch}.pooling_type`, or mean where it names none (llama-server's
    `--pooling` left unspecified; its `none` is no vector a text). A reranker's (`rank`) gives a score, not a vector."""
    arch = _meta(model, "general.architecture")
    named = _meta(model, f"{arch}.pooling_type")
    pooling = int(named) if named.lstrip("-").isdigit() else llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
    if pooling in _NONE_NAMED:
        return llama_cpp.LLAMA_POOLING_TYPE_MEAN
    if pooling not in POOLING_NAMES:
        raise EngineError(f"this model pools its output as a reranker's score (pooling type {pooling}), not an "
                          "embedding")
    return pooling


def _meta(model: llama_cpp.llama_model_p, key: str) -> str:
    buffer = ctypes.create_string_buffer(64)
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode("utf-8", errors="replace") if size >= 0 else ""


class Embedder:
    """An embedding context on a loaded model (which it does not own): `embed` from one thread at a time."""

    def __init__(self, model: llama_cpp.llama_model_p, name: str, threads: Threads) -> None:
        self.name = name
        self.pooling = model_pooling(model)
        self.size = int(llama_cpp.llama_model_n_embd_out(model))
        self.limit = min(EMBED_TOKENS, max(int(llama_cpp.llama_model_n_ctx_train(model)), 1))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self.limit  # a text in one batch: pooled whole
        params.n_seq_max = 1
        params.embeddings = True
        params.pooling_type = self.pooling
        params.n_threads, params.n_threads_batch = threads.batch, threads.batch
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise EngineError(f"cannot make an embedding context for {name}: {_context_failure()}")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self._batch = llama_cpp.llama_batch_init(self.limit, 0, 1)

    def embed(self, texts: Sequence[str], threads: Threads) -> Embedded:
        """Each text's vector, L2-normalised. Every text is tokenized and checked before any is read: one too long
        (or of no tokens) is refused as a whole request, in a line naming it and the limit."""
        tokens = [_tokenize(self.vocab, text, add_bos=True) for text in texts]  # BOS/EOS as the vocabulary adds them
        for index, ids in enumerate(tokens):
            if not ids:
                raise InputRefused(f"input[{index}] is empty: it gives this model no token to read")
            if len(ids) > self.limit:
                raise InputRefused(f"input[{index}] takes {len(ids):,} tokens; {self.name} embeds at most "
                                   f"{self.limit:,} tokens a text")
        llama_cpp.llama_set_n_threads(self.ctx, threads.batch, threads.batch)
        vectors = np.empty((len(texts), self.size), dtype="<f4")
        for row, ids in enumerate(tokens):
            vectors[row] = normalised(self._pooled(ids))
        return Embedded(self.name, self.size, vectors.tobytes(), tuple(len(ids) for ids in tokens))

    def _pooled(self, ids: Sequence[int]) -> np.ndarray:
        """One text read into an empty cache in one batch (every row an output: llama.cpp pools them); its vector."""
        llama_cpp.llama_memory_clear(self.memory, True)
        batch = self._batch
        batch.n_tokens = len(ids)
        for i, token in enumerate(ids):
            batch.token[i], batch.pos[i], batch.logits[i] = token, i, 1
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
        status = llama_cpp.llama_decode(self.ctx, batch)
        if status != 0:
            raise EngineError(f"llama.cpp could not read the text to embed (llama_decode returned {status})")
        pooled = llama_cpp.llama_get_embeddings_seq(self.ctx, 0)
        if not pooled:
            raise EngineError("llama.cpp pooled no embedding for the text")
        return np.ctypeslib.as_array(pooled, shape=(self.size,)).astype(np.float64)

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None


def normalised(vector: np.ndarray) -> np.ndarray:
    """`vector` over its Euclidean norm (llama-server's `common_embd_normalize(…, 2)`); all zeros stays so."""
    norm = float(np.sqrt(np.dot(vector, vector)))
    return vector / norm if norm > 0 else vector


def load_model(path: Path, gpu_layers: int, cpu_path: CpuPath | None) -> llama_cpp.llama_model_p:
    """A dedicated embedding model's weights, on the chat model's CPU path (its extra buffers or none: on an AMX
    machine the path the self-test chose)."""
    check_gguf(path)
    _check_address_space(path)
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = _ALL_LAYERS if gpu_layers < 0 else gpu_layers
    params.use_extra_bufts = cpu_path is None or cpu_path.extra_buffers
    model: llama_cpp.llama_model_p = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
    if not model:
        raise EngineError(_load_failure(path))
    return model


class Embeddings:
    """A backend's embeddings: on the chat model, in a context made at the first request, or on a dedicated model
    (`dedicated`, its name `name`) loaded with the chat model. Safe from any thread: `open` and `close` come from the
    worker (a load, the end), `embed` from a caller's; one lock around the context and the models it reads."""

    def __init__(self, dedicated: Path | None = None, name: str = "") -> None:
        self.dedicated, self.dedicated_name = dedicated, name
        self._lock = threading.Lock()
        self._chat: tuple[llama_cpp.llama_model_p, str] | None = None  # the chat model and its name, while loaded
        self._own: llama_cpp.llama_model_p | None = None  # the dedicated model's weights
        self._embedder: Embedder | None = None

    def open(self, session: LlamaSession, name: str, gpu_layers: int) -> None:
        """After the chat model loaded: its embeddings follow it; a dedicated model loads now (an `EngineError` where
        it cannot: the load fails with it), its context made at once."""
        self.close()
        with self._lock:
            if self.dedicated is None:
                self._chat = (session.model, name)
                return
            try:
                self._own = load_model(self.dedicated, gpu_layers, session.cpu_path)
                self._embedder = Embedder(self._own, self.dedicated_name, session.threads)
            except EngineError as error:
                self._free()
                raise EngineError(f"the embedding model: {error}") from None

    def embed(self, texts: Sequence[str], threads: Threads) -> Embedded:
        with self._lock:
            if self._embedder is None:
                if self._chat is None:
                    raise EngineError("no model is loaded")
                self._embedder = Embedder(*self._chat, threads)
            return self._embedder.embed(texts, threads)

    def close(self) -> None:
        """Before the chat model goes (a load, the end): the context, and the dedicated model, are freed."""
        with self._lock:
            self._free()

    def _free(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._own is not None:
            llama_cpp.llama_model_free(self._own)
            self._own = None
        self._chat = None
