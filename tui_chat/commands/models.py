"""`tui-chat models search|files|pull|list|rm`: the models screen's twins for scripts.

Results go to stdout, progress and errors to stderr. Exit status 2 for what the user can fix in the
command (a bad name, a missing repo, no access), 1 for faults on the way (network, disk, checksum).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from ..config import Config, models_dir
from ..hub import HubError, HubInputError
from ..hub.download import Progress
from ..safetext import terminal_safe
from ..units import format_size, local_time
from .common import INTERRUPTED, RUNTIME_ERROR, USAGE_ERROR, fail, print_table

if TYPE_CHECKING:
    from ..workspace import Workspace

BAR_WIDTH = 24
LINE_EVERY_S = 1.0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = commands.add_parser("models",
                                 description="Find, download and manage GGUF models: the hub and this machine.")
    models.set_defaults(run=run)
    actions = models.add_subparsers(dest="models_command", required=True, metavar="ACTION",
                                    parser_class=type(models))
    search = _action(actions, "search", "search the hub for GGUF repos")
    search.add_argument("query", help="words in the repo's name, e.g. gemma or qwen2.5 1.5b")
    search.add_argument("--sort", choices=("downloads", "likes"), default="downloads", help="order (default downloads)")
    search.add_argument("--limit", type=int, default=20, metavar="N", help="at most N repos (default 20)")
    search.add_argument("--json", action="store_true", help="print JSON")
    files = _action(actions, "files", "a hub repo's GGUF models: size, quantisation, whether they fit")
    files.add_argument("repo", metavar="REPO", help="OWNER/NAME on the hub")
    files.add_argument("--json", action="store_true", help="print JSON")
    pull = _action(actions, "pull", "download a model (resumes an interrupted download)")
    pull.add_argument("ref", metavar="REPO[:FILE]",
                      help="a repo (its only model, or its Q4_K_M one) or REPO:FILE.gguf")
    listing = _action(actions, "list", "the models on this machine (* = the default)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    remove = _action(actions, "rm", "delete a local model")
    remove.add_argument("name", metavar="NAME", help="as tui-chat models list shows it")


def _action(actions: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
            summary: str) -> argparse.ArgumentParser:
    return actions.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")


def run(args: argparse.Namespace, config: Config) -> int:
    command = {"search": _search, "files": _files, "pull": _pull, "list": _list, "rm": _remove}[args.models_command]
    try:
        return command(args, config)
    except HubInputError as error:
        return fail(error, USAGE_ERROR)
    except HubError as error:
        return fail(error, RUNTIME_ERROR)
    except KeyboardInterrupt:
        return fail("interrupted; pull again to resume the download", INTERRUPTED)


def _search(args: argparse.Namespace, config: Config) -> int:
    from ..hub.catalog import search

    if not 1 <= args.limit <= 1000:
        raise HubInputError(f"--limit must be between 1 and 1000 (got {args.limit})")
    found = search(args.query, args.sort, args.limit)
    if args.json:
        _print_json([{"repo": item.repo, "downloads": item.downloads, "likes": item.likes} for item in found])
    elif not found:
        print(f"no GGUF repos match {terminal_safe(args.query)!r}", file=sys.stderr)
    else:
        print_table([("REPO", "DOWNLOADS", "LIKES")]
                     + [(item.repo, f"{item.downloads:,}", f"{item.likes:,}") for item in found])
    return 0


def _files(args: argparse.Namespace, config: Config) -> int:
    from ..hub.catalog import list_gguf
    from ..hub.machine import fit_text

    listing = list_gguf(args.repo)
    if args.json:
        _print_json([{"file": model.name, "quant": model.quant, "size": model.size, "parts": len(model.parts),
                      "complete": model.complete} for model in listing.models])
        return 0
    rows = [("FILE", "QUANT", "SIZE", "FITS")]
    for model in listing.models:
        name = model.name if len(model.parts) == 1 else f"{model.name} ({len(model.parts)} parts)"
        rows.append((name, model.quant or "?", format_size(model.size), fit_text(model.size)))
    print_table(rows)
    return 0


def _pull(args: argparse.Namespace, config: Config) -> int:
    from ..hub.catalog import pull

    bar = _ProgressBar()
    try:
        chosen, path = pull(args.ref, models_dir(), bar.show)
    finally:
        bar.close()
    print(f"{terminal_safe(str(chosen))}\t{path}")
    print(f"use it: tui-chat --model {terminal_safe(str(chosen))}", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace, config: Config) -> int:
    from ..hub.local import list_local

    models = list_local(models_dir())
    default = _workspace(config).default_path()
    if args.json:
        _print_json([{"name": model.name, "path": str(model.path), "size": model.size, "quant": model.quant,
                      "last_used": model.last_used, "default": model.path == default} for model in models])
        return 0
    if not models:
        print(f"no models in {models_dir()}: tui-chat models pull REPO:FILE downloads one", file=sys.stderr)
        return 0
    rows = [("NAME", "QUANT", "SIZE", "LAST USED")]
    for model in models:
        mark = " *" if model.path == default else ""
        rows.append((model.name + mark, model.quant or "?", format_size(model.size), _when(model.last_used)))
    print_table(rows)
    return 0


def _remove(args: argparse.Namespace, config: Config) -> int:
    try:
        removed = _workspace(config).remove_model(args.name)
    except OSError as error:  # the model is gone; the config, which named it the default, could not be written
        return fail(f"cannot reset the default model: {error.strerror}", RUNTIME_ERROR)
    caches = removed.caches
    print(f"removed {terminal_safe(removed.model.name)} ({format_size(removed.model.size)})"
          + (f" and its {caches} saved KV cache{'' if caches == 1 else 's'}" if caches else ""))
    if removed.was_default:
        print("it was the default model: the starter model opens instead from the next start "
              "(default_model in the config chooses another)", file=sys.stderr)
    return 0


def _workspace(config: Config) -> Workspace:
    """The models on this machine, as the app's models screen reaches them (nothing is opened)."""
    from ..workspace import Workspace

    return Workspace(config)


def _when(timestamp: float | None) -> str:
    return "never" if timestamp is None else local_time(timestamp)


class _ProgressBar:
    """A one-line bar on a terminal; on a pipe or log, a line a second."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.shown = False
        self.last_line = 0.0

    def show(self, progress: Progress) -> None:
        filled = round(progress.fraction * BAR_WIDTH)
        text = f"{terminal_safe(progress.file)} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {progress.line()}"
        now = time.monotonic()
        if self.tty:
            sys.stderr.write(f"\r\x1b[K{text}")
        elif now - self.last_line >= LINE_EVERY_S or progress.done >= progress.total:
            self.last_line = now
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\n")


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))
