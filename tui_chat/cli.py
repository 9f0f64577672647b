"""Entry point: the chat UI by default, `run` for headless conversations."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from .config import (
    CPU_PATHS,
    Config,
    ConfigError,
    REMOTE_MARK,
    RemoteProfile,
    cache_dir,
    check_context,
    check_extra_buffers,
    check_gpu_layers,
    check_threads,
    history_path,
    load_config,
    log_dir,
    models_dir,
    remote_spec,
)
from .engine.base import Backend, EngineError, Error
from .engine.params import MAX_TOP_LOGPROBS, PARAMS, InvalidParameter, check_top_logprobs
from .guard import watch
from .history import HistoryError
from .pricing import PricingError, count, find_preset, words_to_tokens
from .safetext import terminal_safe

if TYPE_CHECKING:
    from .recording import Saving

USAGE_ERROR = 2
CLI_REMOTE = "server"  # the name a server given by --base-url alone goes by


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE_ERROR, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """Like argparse's own, but the line is made only when asked for (it loads llama.cpp)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings, dest, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        from .info import version_line

        print(version_line())
        parser.exit(0)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", help="a .gguf file, a downloaded OWNER/NAME:FILE.gguf, or gemma-3-270m")
    parser.add_argument("--n-ctx", type=int, help="context size in tokens (rounded up to a multiple of 256)")
    parser.add_argument("--gpu-layers", type=int, help="layers to offload to the GPU: -1 all, 0 none")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="decode threads (default: the physical cores, fewer while other programs keep them busy)")
    parser.add_argument("--threads-batch", type=int, metavar="N", help="prompt-reading threads (default: likewise)")
    parser.add_argument("--extra-buffers", choices=CPU_PATHS,
                        help="llama.cpp's CPU weight layouts: auto (tested once where AMX could crash), all, "
                             "no-amx (repacked, without AMX), none")
    _add_remote_options(parser)


def _add_remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("local", "openai"),
                        help="local: llama.cpp in this process (default); openai: an OpenAI-compatible server")
    parser.add_argument("--base-url", metavar="URL", help="the server's API root, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the server's API key")
    parser.add_argument("--remote", metavar="PROFILE", help="a [remotes.PROFILE] server from the config")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tui-chat", description="Chat with local LLMs in the terminal, and see how they generate.")
    parser.add_argument("--version", action=_Version, help="print the versions of tui-chat, llama-cpp-python and ggml")
    _add_model_options(parser)
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = commands.add_parser("run", help="answer prompts without the UI (tokens stream to stdout)")
    _add_model_options(run)
    run.add_argument("--prompt", "-p", action="append", required=True, help="a user turn; repeat for more turns")
    run.add_argument("--system", help="system prompt (default: system_prompt in the config)")
    for spec in PARAMS:
        run.add_argument(f"--{spec.name.replace('_', '-')}", type=spec.kind, metavar="N", help=spec.hint)
    run.add_argument("--stop", action="append", metavar="STR", help="stop sequence (repeatable); not shown")
    run.add_argument("--top-logprobs", type=int, default=0, metavar="N",
                     help=f"with --json: each token's probability and the N likeliest (at most {MAX_TOP_LOGPROBS})")
    run.add_argument("--json", action="store_true", help="print one JSON report at the end instead of the text")
    run.add_argument("--save", action="store_true", help="keep the conversation in the history")

    estimate = commands.add_parser("estimate", help="what a workload would cost on a paid API")
    given_input = estimate.add_mutually_exclusive_group()
    given_input.add_argument("--text", help="the input of one call (tokens counted with --model's tokenizer)")
    given_input.add_argument("--file", type=Path, help="a file holding the input of one call")
    given_input.add_argument("--input-tokens", metavar="N", help="input tokens per call")
    given_output = estimate.add_mutually_exclusive_group()
    given_output.add_argument("--output-tokens", metavar="N", help="output tokens per call")
    given_output.add_argument("--output-words", metavar="N", help="output words per call (1.33 tokens a word)")
    estimate.add_argument("--calls", metavar="N", default="1", help="calls per day (default 1)")
    estimate.add_argument("--price", metavar="PRESET", help="price preset (default: the configured one, GPT-4o)")
    estimate.add_argument("--model", "-m", help="whose tokenizer counts --text/--file (default: the default model)")
    estimate.add_argument("--json", action="store_true", help="print JSON (money as exact decimal strings)")
    _add_history_commands(commands)
    info = commands.add_parser("info", help="versions, what llama.cpp can use here, and the paths in use")
    info.add_argument("--json", action="store_true", help="print JSON")

    from .models_cli import add_models_parser

    add_models_parser(commands)
    return parser


def _add_history_commands(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser("history", help="list saved conversations, most recent first")
    listing.add_argument("--search", metavar="TEXT", help="only conversations whose title or messages contain TEXT")
    export = commands.add_parser("export", help="write a saved conversation as Markdown or JSON")
    export.add_argument("id", type=int, help="the conversation's ID (see tui-chat history)")
    export.add_argument("--format", choices=("md", "json"), default="md", help="md to read, json to import (default md)")
    export.add_argument("--output", "-o", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    imports = commands.add_parser("import", help="add a conversation from a JSON export to the history")
    imports.add_argument("file", type=Path, help="a file written by tui-chat export --format json")


def entry() -> int:
    """The `tui-chat` command: `main` with a watcher process that outlives a crash in llama.cpp."""
    return main(watched=True)


def main(argv: list[str] | None = None, *, watched: bool = False) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config()
        n_ctx = check_context(args.n_ctx if args.n_ctx is not None else config.n_ctx)
        gpu_layers = check_gpu_layers(args.gpu_layers) if args.gpu_layers is not None else config.gpu_layers
        config = _with_cpu_flags(config, args)
        if args.command == "estimate":
            return _estimate(args, config)
        if args.command == "info":
            from .info import show

            return show(config, args.json)
        if args.command in ("history", "export", "import"):
            return _history_command(args)
        if args.command == "models":
            from .models_cli import run_models

            return run_models(args, config)
        remote = _remote_profile(args, config)
        opener = _opener(config, n_ctx, gpu_layers, remote)
        model = args.model if remote is None else remote_spec(remote.name or CLI_REMOTE, args.model)
        if watched:
            watch(log_dir())
        if args.command == "run":
            return _run(args, config, opener, model)
    except (ConfigError, InvalidParameter, EngineError, PricingError, HistoryError) as error:
        return _fail(error)
    return _chat(model, config, opener)


def _with_cpu_flags(config: Config, args: argparse.Namespace) -> Config:
    """The config with --threads, --threads-batch and --extra-buffers laid over it."""
    changes = {}
    for name in ("threads", "threads_batch"):
        if getattr(args, name, None) is not None:
            changes[name] = check_threads(getattr(args, name), f"--{name.replace('_', '-')}")
    if getattr(args, "extra_buffers", None) is not None:
        changes["extra_buffers"] = check_extra_buffers(args.extra_buffers)
    return replace(config, **changes)


def _remote_profile(args: argparse.Namespace, config: Config) -> RemoteProfile | None:
    """The server this run talks to (a config profile with the flags laid over it), or None for local."""
    profile = None
    if args.remote is not None:
        profile = config.remotes.get(args.remote)
        if profile is None:
            known = ", ".join(sorted(config.remotes)) or "none; add a [remotes.NAME] table to the config"
            raise InvalidParameter(f"unknown remote {args.remote!r} (configured: {known})")
    remote_flags = [flag for flag, value in (("--base-url", args.base_url), ("--api-key-env", args.api_key_env),
                                             ("--remote", args.remote)) if value is not None]
    if args.backend == "local" or (args.backend is None and not remote_flags):
        if remote_flags:
            raise InvalidParameter(f"{remote_flags[0]} needs --backend openai")
        return None
    if args.n_ctx is not None or args.gpu_layers is not None:
        raise InvalidParameter("--n-ctx and --gpu-layers are for local models: the server sets its own")
    base_url = args.base_url or (profile.base_url if profile else None)
    if base_url is None:
        raise InvalidParameter("--backend openai needs --base-url URL or --remote PROFILE")
    profile = profile or RemoteProfile("", base_url)
    if args.api_key_env is not None:
        profile = replace(profile, api_key_env=args.api_key_env, api_key=None)
    return replace(profile, base_url=base_url)


def _opener(config: Config, n_ctx: int, gpu_layers: int | None,
            remote: RemoteProfile | None = None) -> Callable[[str | None], Backend]:
    """Opens a backend for a model name with the settings of this run (used off the UI thread):
    `@PROFILE[:MODEL]` a server from `[remotes]` (or the one given by flags), anything else a local model."""
    from .engine.factory import open_remote

    profiles = dict(config.remotes) | ({remote.name or CLI_REMOTE: remote} if remote else {})
    local = _local_opener(config, n_ctx, gpu_layers)

    def open_backend(name: str | None) -> Backend:
        name = name or config.default_model
        if not name or not name.startswith(REMOTE_MARK):
            return local(name)
        profile_name, _, model = name[len(REMOTE_MARK):].partition(":")
        profile = profiles.get(profile_name)
        if profile is None:
            known = ", ".join(remote_spec(known) for known in sorted(profiles)) or "none in the config's [remotes]"
            raise EngineError(f"unknown server {name!r} (known: {known})")
        try:
            api_key = profile.resolved_api_key()
        except ConfigError as error:
            raise EngineError(str(error)) from None
        return open_remote(model or None, default_model=profile.model, base_url=profile.base_url, api_key=api_key,
                           timeout_s=profile.timeout_s)

    return open_backend


def _local_opener(config: Config, n_ctx: int, gpu_layers: int | None) -> Callable[[str | None], Backend]:
    from .engine.factory import open_local

    return partial(
        open_local,
        default_model=config.default_model,
        models_dir=models_dir(),
        log_dir=log_dir(),
        n_ctx=n_ctx,
        gpu_layers=gpu_layers,
        chat_template=config.chat_template,
        threads=config.threads,
        threads_batch=config.threads_batch,
        extra_buffers=config.extra_buffers,
        cache_dir=cache_dir(),
    )


def _chat(model: str | None, config: Config, opener: Callable[[str | None], Backend]) -> int:
    from .ui.app import ChatApp

    ChatApp(config, opener, model).run()
    return 0


def _run(args: argparse.Namespace, config: Config, opener: Callable[[str | None], Backend], model: str | None) -> int:
    from .headless import run_conversation

    given = {spec.name: getattr(args, spec.name) for spec in PARAMS if getattr(args, spec.name) is not None}
    if args.stop:
        given["stop"] = args.stop
    params = config.sampling.with_changes(**given)
    check_top_logprobs(args.top_logprobs)
    backend = opener(model)
    try:
        loaded = backend.load().result()
        if isinstance(loaded, Error):
            raise EngineError(loaded.message)
        system = config.system_prompt if args.system is None else args.system
        saving = _saver(config) if args.save else None
        try:
            return run_conversation(backend, args.prompt, params, system=system, as_json=args.json,
                                    top_logprobs=args.top_logprobs, saving=saving)
        except (EngineError, HistoryError) as error:
            print(f"tui-chat: error: {one_line(str(error))}", file=sys.stderr)
            return 1
        finally:
            if saving is not None:
                saving.history.close()
    finally:
        backend.close()


def _saver(config: Config) -> Saving:
    from .recording import Saving
    from .history import History

    return Saving(History(history_path()), find_preset(config.prices, config.price))


def _history_command(args: argparse.Namespace) -> int:
    from . import history_cli
    from .history import History

    with History(history_path()) as history:
        if args.command == "history":
            return history_cli.list_conversations(history, args.search)
        if args.command == "export":
            return history_cli.export_conversation(history, args.id, args.format, args.output)
        return history_cli.import_conversation(history, args.file)


def _estimate(args: argparse.Namespace, config: Config) -> int:
    from .estimate import Estimate

    price = find_preset(config.prices, args.price or config.price)
    output_tokens = (
        words_to_tokens(count(args.output_words, "--output-words")) if args.output_words is not None
        else count(args.output_tokens or 0, "--output-tokens")
    )
    calls = count(args.calls, "--calls")
    if args.text is not None or args.file is not None:
        input_tokens = _count_text_tokens(args, config)
    else:
        input_tokens = count(args.input_tokens or 0, "--input-tokens")
    estimate = Estimate(price, input_tokens, output_tokens, calls)
    print(json.dumps(estimate.as_dict(), indent=2) if args.json else estimate.as_text(), end="\n" if args.json else "")
    return 0


def _count_text_tokens(args: argparse.Namespace, config: Config) -> int:
    from .engine.factory import count_text_tokens

    if args.file is not None:
        try:
            text = args.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise EngineError(f"cannot read {args.file}: {getattr(error, 'strerror', None) or error}") from None
    else:
        text = args.text
    return count_text_tokens(args.model, text, default_model=config.default_model, models_dir=models_dir(),
                             log_dir=log_dir())


def _fail(error: Exception) -> int:
    print(f"tui-chat: error: {one_line(str(error))}", file=sys.stderr)
    return USAGE_ERROR


def one_line(message: str) -> str:
    """Error messages quote what was typed (a file name, an unknown argument): they stay one line on stderr,
    with no control character reaching the terminal."""
    return terminal_safe(message).replace("\n", "\\n")


if __name__ == "__main__":
    sys.exit(main())
