"""Figures that change many times a second while a reply streams (the panel's rates and counts, the
title line): updated without laying the whole screen out again unless their height may change. A layout
of the screen costs tens of milliseconds, and while a reply streams every millisecond the UI holds a core
stalls all of llama.cpp's threads."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static


def show(static: Static, content: Content) -> None:
    """`static` shows `content`: nothing to do if it already does; a layout only if the number of lines
    changes or a line may wrap at the widget's width."""
    old = static.content
    if isinstance(old, Content) and old.plain == content.plain and old.spans == content.spans:
        return
    static.update(content, layout=_lines(old) != _lines(content) or _may_wrap(content, static.content_region.width))


def _lines(content: object) -> int:
    return content.plain.count("\n") if isinstance(content, Content) else -1


def _may_wrap(content: Content, width: int) -> bool:
    return any(len(line) >= width for line in content.plain.split("\n"))
