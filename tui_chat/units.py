"""How a size and a moment are written wherever tui-chat shows one, so every listing reads alike.

Sizes are binary, with IEC names (KiB, MiB, GiB): llama.cpp's own logs, GPU memory and the KV cache
budget (`kv_cache_budget_gb`, in GiB) all count in powers of two. A leaf: imports nothing of tui-chat's.
"""

from __future__ import annotations

import time

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_size(size: float) -> str:
    """`512 B`, `241.4 MiB`, `4.0 GiB`."""
    for unit in _UNITS[:-1]:
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} {_UNITS[-1]}"


def local_time(timestamp: float) -> str:
    """A moment in local time, to the minute: `2026-11-25 19:20`."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))
