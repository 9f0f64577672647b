"""What every subcommand shares: exit codes, the one-line error, the terminal-safe writer, the model
options and the backend opener they lead to."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from ..engine.local import CPU_PATHS
from ..safetext import terminal_safe

if TYPE_CHECKING:
    from ..config import Config, RemoteProfile
    from ..engine.factory import BackendOpener

RUNTIME_ERROR = 1  # a fault on the way: network, disk, a model that fails mid-reply
USAGE_ERROR = 2  # what the user can fix in the command: a bad name, value or file
INTERRUPTED = 130
CLI_REMOTE = "server"  # the name a server given by --base-url alone goes by


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE_ERROR, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: str) -> str:
    """Error messages quote what was typed (a file name, an unknown argument): they stay one line on stderr,
    with no control character reaching the terminal."""
    return terminal_safe(message).replace("\n", "\\n")


def fail(error: Exception | str, status: int = USAGE_ERROR) -> int:
    print(f"tui-chat: error: {one_line(str(error))}", file=sys.stderr)
    return status


def writer(out: TextIO) -> Callable[[str], None]:
    """Writes untrusted text: escapes made visible on a terminal, passed through untouched to a file or pipe."""
    clean = terminal_safe if out.isatty() else (lambda text: text)

    def write(text: str) -> None:
        out.write(clean(text))
        out.flush()

    return write


def print_table(rows: Sequence[tuple[str, ...]], right: tuple[int, ...] = ()) -> None:
    """Columns as wide as their widest cell, two spaces apart, the columns in `right` (figures) aligned
    right. Cells come from files, the hub and the history: always written terminal-safe."""
    rows = [tuple(terminal_safe(cell) for cell in row) for row in rows]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.rjust(width) if column in right else cell.ljust(width)
                        for column, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip())


def add_model_options(parser: argparse.ArgumentParser) -> None:
    add_local_model_options(parser)
    parser.add_argument("--draft", metavar="ngram|MODEL.gguf|off",
                        help="speculative decoding: ngram guesses the next tokens from earlier text (prompt lookup), "
                             "a small model sharing the model's vocabulary guesses them itself; the model checks them "
                             "in one batch: the same text, faster where the guesses hold (default: draft in the "
                             "config, off)")
    parser.add_argument("--backend", choices=("local", "openai"),
                        help="local: llama.cpp in this process (default); openai: an OpenAI-compatible server")
    parser.add_argument("--base-url", metavar="URL", help="the server's API root, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the server's API key")
    parser.add_argument("--remote", metavar="PROFILE", help="a [remotes.PROFILE] server from the config")


def add_local_model_options(parser: argparse.ArgumentParser) -> None:
    """The model and how llama.cpp runs it here (`serve` takes these alone: it serves a local model)."""
    parser.add_argument("--model", "-m", help="a .gguf file, a downloaded OWNER/NAME:FILE.gguf, or gemma-3-270m")
    parser.add_argument("--n-ctx", type=int, help="context size in tokens (rounded up to a multiple of 256)")
    parser.add_argument("--gpu-layers", type=int, help="layers to offload to the GPU: -1 all, 0 none")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="decode threads (default: the physical cores, fewer while other programs keep them busy)")
    parser.add_argument("--threads-batch", type=int, metavar="N", help="prompt-reading threads (default: likewise)")
    parser.add_argument("--extra-buffers", choices=CPU_PATHS,
                        help="llama.cpp's CPU weight layouts: auto (tested once where AMX could crash), all, "
                             "no-amx (repacked, without AMX), none")


def opener_for(config: Config, args: argparse.Namespace | None = None, *,
               engine_process: bool = False) -> tuple[BackendOpener, str | None]:
    """The backend opener for this run and the model name to open first, with the flags laid over the config.
    `engine_process`: each model's engine in a process of its own (the chat UI)."""
    from ..config import cache_dir, kv_cache_dir, log_dir, models_dir
    from ..engine.factory import (  # the engine: only for a command that opens one
        REMOTE_MARK,
        BackendOpener,
        LocalOptions,
        remote_spec,
    )

    config = with_model_flags(config, args)
    remote = _remote_profile(config, args) if args is not None else None
    servers = dict(config.remotes) | ({remote.name or CLI_REMOTE: remote} if remote else {})
    local = LocalOptions(
        default_model=config.default_model, models_dir=models_dir(), log_dir=log_dir(), n_ctx=config.n_ctx,
        gpu_layers=config.gpu_layers, chat_template=config.chat_template, threads=config.threads,
        threads_batch=config.threads_batch, extra_buffers=config.extra_buffers, cache_dir=cache_dir(),
        kv_dir=kv_cache_dir(), kv_budget_bytes=config.kv_cache_budget_bytes, draft=config.draft,
        engine_process=engine_process,
    )
    model = getattr(args, "model", None)
    if remote is not None:
        model = remote_spec(remote.name or CLI_REMOTE, model)
    if args is not None and model is not None and model.startswith(REMOTE_MARK):
        _refuse_local_flags(args)
    return BackendOpener(local, servers), model


def with_model_flags(config: Config, args: argparse.Namespace | None) -> Config:
    """The config with --n-ctx, --gpu-layers, --threads, --threads-batch, --extra-buffers and --draft laid over it."""
    from ..config import check_context, check_extra_buffers, check_gpu_layers, check_threads
    from ..engine.local import check_draft

    changes: dict[str, Any] = {}

    def given(name: str) -> Any:
        return getattr(args, name, None)  # None too without args
    if given("n_ctx") is not None:
        changes["n_ctx"] = check_context(given("n_ctx"))
    if given("gpu_layers") is not None:
        changes["gpu_layers"] = check_gpu_layers(given("gpu_layers"))
    for name in ("threads", "threads_batch"):
        if given(name) is not None:
            changes[name] = check_threads(given(name), f"--{name.replace('_', '-')}")
    if given("extra_buffers") is not None:
        changes["extra_buffers"] = check_extra_buffers(given("extra_buffers"))
    if given("draft") is not None:
        changes["draft"] = check_draft(given("draft"))
    return replace(config, **changes)


LOCAL_FLAGS = ("n_ctx", "gpu_layers", "threads", "threads_batch", "extra_buffers", "draft")  # how llama.cpp runs here


def _refuse_local_flags(args: argparse.Namespace) -> None:
    """A server sets its own context, offload, threads and CPU path: a flag for them would do nothing."""
    from ..engine.params import InvalidParameter

    given = [f"--{name.replace('_', '-')}" for name in LOCAL_FLAGS if getattr(args, name, None) is not None]
    if given:
        flags = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
        raise InvalidParameter(f"{flags} {'is' if len(given) == 1 else 'are'} for local models: "
                               "the server sets its own")


def _remote_profile(config: Config, args: argparse.Namespace) -> RemoteProfile | None:
    """The server this run talks to (a config profile with the flags laid over it), or None for local."""
    from ..config import RemoteProfile
    from ..engine.params import InvalidParameter

    profile = None
    if getattr(args, "remote", None) is not None:
        profile = config.remotes.get(args.remote)
        if profile is None:
            known = ", ".join(sorted(config.remotes)) or "none; add a [remotes.NAME] table to the config"
            raise InvalidParameter(f"unknown remote {args.remote!r} (configured: {known})")
    flags = [flag for flag, value in (("--base-url", getattr(args, "base_url", None)),
                                      ("--api-key-env", getattr(args, "api_key_env", None)),
                                      ("--remote", getattr(args, "remote", None))) if value is not None]
    backend = getattr(args, "backend", None)
    if backend == "local" or (backend is None and not flags):
        if flags:
            raise InvalidParameter(f"{flags[0]} needs --backend openai")
        return None
    base_url = args.base_url or (profile.base_url if profile else None)
    if base_url is None:
        raise InvalidParameter("--backend openai needs --base-url URL or --remote PROFILE")
    profile = profile or RemoteProfile("", base_url)
    if args.api_key_env is not None:
        profile = replace(profile, api_key_env=args.api_key_env, api_key=None)
    return replace(profile, base_url=base_url)
