"""How much memory this machine has, to say whether a model file will fit before downloading it."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

OVERHEAD = 1.2  # weights plus ~20 % for the KV cache and buffers at an ordinary context size
NVIDIA_SMI_TIMEOUT_S = 3


@functools.cache
def total_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@functools.cache
def total_vram() -> int | None:
    """The largest NVIDIA GPU's memory, when nvidia-smi can see one (None without a GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        answer = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True)
        return max(int(line) for line in answer.stdout.split()) * 1024 * 1024
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def fits(size: int, memory: int | None) -> bool | None:
    return None if memory is None else size * OVERHEAD <= memory


def fit_text(size: int) -> str:
    """'RAM ✓ · VRAM ✗' style: where a model of `size` bytes would fit."""
    places = [("RAM", total_ram()), ("VRAM", total_vram())]
    return " · ".join(f"{name} {'✓' if fits(size, memory) else '✗'}" for name, memory in places if memory is not None)
