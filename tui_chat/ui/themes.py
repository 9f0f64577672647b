"""Themes: three ship with the package (`themes/`), users add their own TOML files to the config dir."""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path

from textual.theme import Theme

_FIELDS = {"name", "dark", "primary", "secondary", "accent", "foreground", "background",
           "surface", "panel", "success", "warning", "error", "variables"}


def read_theme(text: str) -> Theme:
    raw = tomllib.loads(text)
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown theme field {unknown[0]!r}")
    if not isinstance(raw.get("name"), str) or not isinstance(raw.get("primary"), str):
        raise ValueError("a theme needs at least a name and a primary colour")
    return Theme(**raw)


def load_themes(user_dir: Path) -> tuple[list[Theme], list[str]]:
    """Shipped themes, then the user's; returns the themes and one problem line per bad file."""
    shipped = [f for f in files("tui_chat.themes").iterdir() if f.name.endswith(".toml")]
    sources = [(f.name, f.read_text(encoding="utf-8")) for f in shipped]
    problems: list[str] = []
    try:
        for path in sorted(user_dir.glob("*.toml")):
            sources.append((str(path), path.read_text(encoding="utf-8")))
    except OSError as error:
        problems.append(f"cannot read themes in {user_dir}: {error.strerror}")
    themes: list[Theme] = []
    for origin, text in sources:
        try:
            themes.append(read_theme(text))
        except (ValueError, TypeError, tomllib.TOMLDecodeError) as error:
            problems.append(f"theme {origin} skipped: {error}")
    return themes, problems
