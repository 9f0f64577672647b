"""Work-arounds for Textual bugs, each with its upstream issue: delete one once the Textual we require fixes it."""

from __future__ import annotations

import textual.widgets


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


class Footer(textual.widgets.Footer):
    """Textual's footer remounts every key, with their styles, on each bindings change, even when what it shows
    stays the same (not reported upstream yet). Right after the first frame a screen has four or five such
    changes (focus, its mount, its bindings): on 2 cores ~50 ms before the first key typed shows. This one
    recomposes only when the keys it would show changed."""

    _shown: tuple[object, ...] | None = None

    async def recompose(self) -> None:
        if not self.is_attached:  # its screen was dismissed while the recompose waited
            return
        shown = tuple((binding, enabled, tooltip) for _, binding, enabled, tooltip
                      in self.screen.active_bindings.values() if binding.show)
        if shown != self._shown:
            self._shown = shown
            await super().recompose()
