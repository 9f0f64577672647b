"""How a local model is opened: what the app decides before the engine (in its own process) loads it. No
llama.cpp here, so the app's process can make these without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .cpu_path import AUTO
from .kvstore import DEFAULT_BUDGET_BYTES


@dataclass(frozen=True, slots=True)
class LlamaSettings:
    path: Path
    n_ctx: int = 4096
    gpu_layers: int | None = None
    chat_template: str = "auto"
    extra_buffers: str = AUTO  # the CPU path (cpu_path.py): auto, all, no-amx or none
    threads: int | None = None  # decode threads; None follows the machine and its load
    threads_batch: int | None = None  # prompt-reading threads; likewise
    cache_dir: Path | None = None  # where the CPU path's self-test answer is kept
    kv_dir: Path | None = None  # where KV states are saved after each reply (None: not saved)
    kv_budget_bytes: int = DEFAULT_BUDGET_BYTES  # their total size; the least recently used go first
    draft: str = "off"  # speculative decoding's drafter: "ngram" (prompt lookup), a draft model's .gguf, or "off"
    # llama.cpp draws in its graph where a reply's chain allows (LlamaSession.attach): None where the model's output
    # layer is on a GPU (on a CPU llama.cpp's draw costs more than the host's), True or False everywhere or nowhere
    backend_sampling: bool | None = None
    # a dedicated embedding model loaded beside the model for embeddings (`serve --embeddings`), and its name; None:
    # the model's own embeddings
    embeddings: Path | None = None
    embeddings_name: str = ""

    @property
    def resolved_gpu_layers(self) -> int:
        """All layers where this build can offload, else none."""
        if self.gpu_layers is not None:
            return self.gpu_layers
        from .llamacpp import supports_gpu_offload  # in the engine, which has llama.cpp loaded

        return -1 if supports_gpu_offload() else 0
