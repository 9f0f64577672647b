"""`tui-chat cache` and `tui-chat cache clear`: the KV caches saved on disk, listed or deleted.

Each saved state spares a reopened chat (or a new one with the same long system prompt) reading its
prompt again; they stay within `kv_cache_budget_gb`, the least recently used going first.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..config import Config, kv_cache_dir
from ..units import format_size, local_time
from .common import print_table

if TYPE_CHECKING:
    from ..engine.local import KvEntry as Entry


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cache = commands.add_parser("cache", description="List the KV caches saved on disk, most recently used first, "
                                                     "or delete them all with `clear` (the next turn of each chat "
                                                     "reads its prompt again).")
    cache.add_argument("action", nargs="?", choices=("list", "clear"), default="list",
                       help="list (the default) or clear")
    cache.add_argument("--json", action="store_true", help="list as JSON")
    cache.set_defaults(run=run)


def run(args: argparse.Namespace, config: Config) -> int:
    from ..workspace import kv_store

    store = kv_store(config)
    if args.action == "clear":
        freed = store.total_bytes()
        deleted = store.clear()
        print(f"deleted {deleted} saved KV cache{'' if deleted == 1 else 's'} ({format_size(freed)})")
        return 0
    entries = store.list_entries()
    if args.json:
        print(json.dumps([_as_dict(entry) for entry in entries], indent=2))
    elif entries:
        _print_entries(entries)
        print(f"{len(entries)} saved, {format_size(sum(e.size_bytes for e in entries))} of the "
              f"{format_size(config.kv_cache_budget_bytes)} budget (kv_cache_budget_gb) in {kv_cache_dir()}")
    else:
        off = " (saving is off: kv_cache_budget_gb = 0)" if config.kv_cache_budget_bytes <= 0 else ""
        print(f"no KV caches saved in {kv_cache_dir()}{off}", file=sys.stderr)
    return 0


def _as_dict(entry: Entry) -> dict[str, Any]:
    return {"model": entry.model_name, "model_path": entry.key.model_path, "tokens": entry.n_tokens,
            "bytes": entry.size_bytes, "last_used": entry.last_used, "conversation": entry.notes.conversation or None}


def _print_entries(entries: list[Entry]) -> None:
    rows = [("MODEL", "TOKENS", "SIZE", "LAST USED", "CHAT")]
    rows += [(entry.model_name, f"{entry.n_tokens:,}", format_size(entry.size_bytes), local_time(entry.last_used),
              entry.notes.conversation or "–") for entry in entries]
    print_table(rows, right=(1, 2))
