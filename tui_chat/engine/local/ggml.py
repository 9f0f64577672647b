"""What this llama.cpp build can do: its CPU features and its devices, from ggml's own registry.

llama-cpp-python wraps llama.h but not ggml's device API, so the few calls we need are declared here.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from dataclasses import dataclass

import llama_cpp

from ..base import DeviceMemory

_DEVICE_KINDS = {0: "CPU", 1: "GPU", 2: "integrated GPU", 3: "accelerator"}


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    description: str
    kind: str
    memory_total: int
    memory_free: int


_BUFFER = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB")
_PARTS = {"model": "weights", "KV": "kv", "compute": "compute", "output": "compute"}


def device_memory(log_lines: list[str]) -> tuple[DeviceMemory, ...]:
    """What a load allocated on each device, from llama.cpp's own lines (`load_tensors: CUDA0 model buffer size =
    290.00 MiB`, `llama_kv_cache: CPU KV buffer size = 72.00 MiB`…), with what each GPU has left now. Host memory
    (mapped, repacked, pinned for a GPU) counts as the CPU's."""
    sizes: dict[str, dict[str, int]] = {}
    for name, part, mib in _BUFFER.findall("".join(log_lines)):
        device = "CPU" if name.startswith("CPU") or name.endswith("_Host") else name
        counts = sizes.setdefault(device, {})
        counts[_PARTS[part]] = counts.get(_PARTS[part], 0) + round(float(mib) * 1024 * 1024)
    free = {device.name: device.memory_free for device in devices() if device.kind != "CPU"}
    return tuple(DeviceMemory(device, free=free.get(device), **counts) for device, counts in sizes.items())


def system_info() -> str:
    """llama.cpp's one-line build summary: `CPU : SSE3 = 1 | AVX2 = 1 | ... | REPACK = 1 |`."""
    llama_cpp.llama_backend_init()
    info: bytes = llama_cpp.llama_print_system_info()
    return info.decode("utf-8", "replace").strip()


def build_version() -> str:
    """ggml's version and the llama.cpp commit it was built from: `0.25.3 (0c1e570)`."""
    _, base = _libraries()
    return f"{base.ggml_version().decode()} ({base.ggml_commit().decode()})"


def build_features() -> set[str]:
    """The features this build was compiled for and this CPU has (`AVX2`, `AVX512`, `AMX_INT8`, `REPACK`...)."""
    features = set()
    for part in system_info().replace("|", "\n").splitlines():
        name, _, value = part.rpartition("=")
        if value.strip() == "1":
            features.add(name.split(":")[-1].strip())
    return features


def devices() -> list[Device]:
    """Every device ggml registered: the CPU, and each GPU a CUDA/Metal/Vulkan build can see."""
    llama_cpp.llama_backend_init()
    registry, base = _libraries()
    found = []
    for index in range(registry.ggml_backend_dev_count()):
        device = registry.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        found.append(Device(
            name=base.ggml_backend_dev_name(device).decode("utf-8", "replace"),
            description=base.ggml_backend_dev_description(device).decode("utf-8", "replace"),
            kind=_DEVICE_KINDS.get(base.ggml_backend_dev_type(device), "device"),
            memory_total=total.value,
            memory_free=free.value,
        ))
    return found


@functools.cache
def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    folder = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    registry = _load(folder, "ggml")
    base = _load(folder, "ggml-base")
    registry.ggml_backend_dev_count.restype = ctypes.c_size_t
    registry.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    registry.ggml_backend_dev_get.restype = ctypes.c_void_p
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(base, name).argtypes = [ctypes.c_void_p]
        getattr(base, name).restype = ctypes.c_char_p
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.POINTER(ctypes.c_size_t)]
    base.ggml_backend_dev_memory.restype = None
    base.ggml_version.restype = base.ggml_commit.restype = ctypes.c_char_p
    return registry, base


def _load(folder: str, name: str) -> ctypes.CDLL:
    for file_name in (f"lib{name}.so", f"lib{name}.dylib", f"{name}.dll"):
        path = os.path.join(folder, file_name)
        if os.path.exists(path):
            return ctypes.CDLL(path)
    return ctypes.CDLL(f"lib{name}.so")
