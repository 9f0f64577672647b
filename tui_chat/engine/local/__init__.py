"""The in-process llama.cpp backend: the only place that imports llama_cpp (its bindings and native library).

  llama.py       `LlamaBackend`: owns its worker thread (worker.py), the loaded model (model.py), the transcript
                 (transcript.py), and its collaborators, the sampling lab (lab.py) and the serving slots (slots.py)
  reply.py       `Reply`: one reply being written (prompt, prefill, decode loop, drafts); rows.py its row variant
  llamacpp.py    thin wrappers over llama.cpp's C API: batch, decode, KV cache, sampler chain
  chain.py       the sampler chain built with llama.cpp's samplers (the plan is ../stages.py)
  grammar.py     an output format enforced by LLGuidance
  xray.py        why a token was drawn, stage by stage; the exact probability of any text
  kvstore.py     KV states on disk (files, keys, checks, the budget); kvcache.py when a turn restores or saves one
  cpu.py         threads that fit the machine and its load; cpu_path.py, probe.py the AMX self-test
  ggml.py        what the build can do: CPU features, devices; logs.py llama.cpp's log to a file

This package is the wing's one door for the rest of the app (config, commands, workspace): the names below, each
imported from its module only when asked for, so the config names the CPU paths at every start without llama.cpp
and `info` loads llama.cpp only when it runs. The backend itself is built by engine/factory.py.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cpu import choose_threads, cpu_model, read_topology
    from .cpu_path import AUTO as AUTO_CPU_PATH, CHOICES as CPU_PATHS, known as known_cpu_paths
    from .draft import check_kind as check_draft
    from .ggml import build_features, build_version, devices, system_info
    from .kvstore import Entry as KvEntry, KvStore
    from .llamacpp import supports_gpu_offload

_DOOR = {"AUTO_CPU_PATH": ("cpu_path", "AUTO"), "CPU_PATHS": ("cpu_path", "CHOICES"),
         "known_cpu_paths": ("cpu_path", "known"), "check_draft": ("draft", "check_kind"),
         "KvStore": ("kvstore", "KvStore"), "KvEntry": ("kvstore", "Entry"),
         "choose_threads": ("cpu", "choose_threads"), "read_topology": ("cpu", "read_topology"),
         "cpu_model": ("cpu", "cpu_model"), "build_features": ("ggml", "build_features"),
         "build_version": ("ggml", "build_version"), "devices": ("ggml", "devices"),
         "system_info": ("ggml", "system_info"), "supports_gpu_offload": ("llamacpp", "supports_gpu_offload")}
__all__ = ["AUTO_CPU_PATH", "CPU_PATHS", "KvEntry", "KvStore", "build_features", "build_version", "check_draft",
           "choose_threads", "cpu_model", "devices", "known_cpu_paths", "read_topology", "supports_gpu_offload",
           "system_info"]


def __getattr__(name: str) -> Any:
    if name not in _DOOR:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _DOOR[name]
    return getattr(import_module(f".{module}", __name__), attribute)
