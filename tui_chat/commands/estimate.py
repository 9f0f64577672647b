"""`tui-chat estimate`: what a workload would cost on a paid API."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import Config, log_dir, models_dir
from ..engine.base import EngineError
from ..engine.params import InvalidParameter
from ..pricing import Estimate, count, find_preset, words_to_tokens


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    estimate = commands.add_parser(
        "estimate", description="What a workload would cost on a paid API, per call, day and month.")
    given_input = estimate.add_mutually_exclusive_group()
    given_input.add_argument("--text", help="the input of one call (tokens counted with --model's tokenizer)")
    given_input.add_argument("--file", type=Path, help="a file holding the input of one call")
    given_input.add_argument("--input-tokens", metavar="N", help="input tokens per call")
    given_output = estimate.add_mutually_exclusive_group()
    given_output.add_argument("--output-tokens", metavar="N", help="output tokens per call")
    given_output.add_argument("--output-words", metavar="N", help="output words per call (1.33 tokens a word)")
    estimate.add_argument("--calls", metavar="N", default="1", help="calls per day (default 1)")
    estimate.add_argument("--price", metavar="PRESET", help="price preset (default: price in the config)")
    estimate.add_argument("--model", "-m", help="whose tokenizer counts --text/--file (default: the default model)")
    estimate.add_argument("--json", action="store_true", help="print JSON (money as exact decimal strings)")
    estimate.set_defaults(run=run)


def run(args: argparse.Namespace, config: Config) -> int:
    price = find_preset(config.prices, args.price or config.price)
    output_tokens = (
        words_to_tokens(count(args.output_words, "--output-words")) if args.output_words is not None
        else count(args.output_tokens or 0, "--output-tokens")
    )
    calls = count(args.calls, "--calls")
    if all(getattr(args, name) is None for name in ("text", "file", "input_tokens", "output_tokens", "output_words")):
        raise InvalidParameter("give the work of one call: its input (--text, --file or --input-tokens N) "
                               "and/or its output (--output-tokens N or --output-words N)")
    if args.text is not None or args.file is not None:
        input_tokens = _count_text_tokens(args, config)
    else:
        input_tokens = count(args.input_tokens or 0, "--input-tokens")
    estimate = Estimate(price, input_tokens, output_tokens, calls)
    print(json.dumps(estimate.as_dict(), indent=2) if args.json else estimate.as_text(), end="\n" if args.json else "")
    return 0


def _count_text_tokens(args: argparse.Namespace, config: Config) -> int:
    from ..engine.factory import count_text_tokens

    if args.file is not None:
        try:
            text = args.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise EngineError(f"cannot read {args.file}: {getattr(error, 'strerror', None) or error}") from None
    else:
        text = args.text
    return count_text_tokens(args.model, text, default_model=config.default_model, models_dir=models_dir(),
                             log_dir=log_dir())
