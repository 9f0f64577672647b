"""Work-arounds for Textual bugs, each with its upstream issue: delete one once the Textual we require fixes it."""

from __future__ import annotations


def release_styles_caches() -> None:
    """Textual memoises `StylesCache.get_inner_outer` in an lru_cache keyed by the StylesCache itself, so the
    last 1024 calls keep removed widgets' rendered lines alive (Textualize/textual#6665): about 0.1 MB a chat
    turn here until it fills. Clearing it costs one recomputation of two styles per widget."""
    try:
        from textual._styles_cache import StylesCache
    except ImportError:  # the private module moved: the bug went with it, or this needs a new look
        return
    clear = getattr(StylesCache.get_inner_outer, "cache_clear", None)
    if clear is not None:
        clear()
