"""Entry point: the chat UI by default, `run` for headless conversations."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from .config import Config, ConfigError, check_context, check_gpu_layers, load_config, log_dir, models_dir
from .engine.base import Backend, EngineError, Error
from .engine.params import PARAMS, InvalidParameter
from .pricing import PricingError, count, find_preset, words_to_tokens

USAGE_ERROR = 2
MAX_TOP_LOGPROBS = 20


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", help="a .gguf file, a downloaded OWNER/NAME:FILE.gguf, or gemma-3-270m")
    parser.add_argument("--n-ctx", type=int, help="context size in tokens (rounded up to a multiple of 256)")
    parser.add_argument("--gpu-layers", type=int, help="layers to offload to the GPU: -1 all, 0 none")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tui-chat", description="Chat with local LLMs in the terminal, and see how they generate.")
    _add_model_options(parser)
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = commands.add_parser("run", help="answer prompts without the UI (tokens stream to stdout)")
    _add_model_options(run)
    run.add_argument("--prompt", "-p", action="append", required=True, help="a user turn; repeat for more turns")
    run.add_argument("--system", help="system prompt")
    for spec in PARAMS:
        run.add_argument(f"--{spec.name.replace('_', '-')}", type=spec.kind, metavar="N", help=spec.hint)
    run.add_argument("--stop", action="append", metavar="STR", help="stop sequence (repeatable); not shown")
    run.add_argument("--top-logprobs", type=int, default=0, metavar="N",
                     help=f"with --json: each token's probability and the N likeliest (at most {MAX_TOP_LOGPROBS})")
    run.add_argument("--json", action="store_true", help="print one JSON report at the end instead of the text")

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

    from .models_cli import add_models_parser

    add_models_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config()
        n_ctx = check_context(args.n_ctx if args.n_ctx is not None else config.n_ctx)
        gpu_layers = check_gpu_layers(args.gpu_layers) if args.gpu_layers is not None else config.gpu_layers
        if args.command == "run":
            return _run(args, config, n_ctx, gpu_layers)
        if args.command == "estimate":
            return _estimate(args, config)
        if args.command == "models":
            from .models_cli import run_models

            return run_models(args, config)
    except (ConfigError, InvalidParameter, EngineError, PricingError) as error:
        return _fail(error)
    return _chat(args.model, config, n_ctx, gpu_layers)


def _opener(config: Config, n_ctx: int, gpu_layers: int | None) -> Callable[[str | None], Backend]:
    """Opens a backend for a model name with the settings of this run (used off the UI thread)."""
    from .engine.factory import open_local

    return partial(
        open_local,
        default_model=config.default_model,
        models_dir=models_dir(),
        log_dir=log_dir(),
        n_ctx=n_ctx,
        gpu_layers=gpu_layers,
        chat_template=config.chat_template,
    )


def _chat(model: str | None, config: Config, n_ctx: int, gpu_layers: int | None) -> int:
    from .ui.app import ChatApp

    ChatApp(config, _opener(config, n_ctx, gpu_layers), model).run()
    return 0


def _run(args: argparse.Namespace, config: Config, n_ctx: int, gpu_layers: int | None) -> int:
    from .headless import run_conversation

    given = {spec.name: getattr(args, spec.name) for spec in PARAMS if getattr(args, spec.name) is not None}
    if args.stop:
        given["stop"] = args.stop
    params = config.sampling.with_changes(**given)
    if not 0 <= args.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidParameter(f"top-logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got {args.top_logprobs})")
    backend = _opener(config, n_ctx, gpu_layers)(args.model)
    try:
        loaded = backend.load().result()
        if isinstance(loaded, Error):
            raise EngineError(loaded.message)
        try:
            return run_conversation(backend, args.prompt, params, system=args.system, as_json=args.json,
                                    top_logprobs=args.top_logprobs)
        except EngineError as error:
            print(f"tui-chat: error: {error}", file=sys.stderr)
            return 1
    finally:
        backend.close()


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
    print(f"tui-chat: error: {error}", file=sys.stderr)
    return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
