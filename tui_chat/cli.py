"""Entry point: the chat UI by default, or a subcommand (tui_chat/commands/: one module each)."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from .commands import cache, chat, estimate, history, info, models, run
from .commands.common import Parser, add_model_options, fail
from .config import ConfigError, load_config
from .engine.base import EngineError
from .engine.params import InvalidParameter
from .history import HistoryError
from .pricing import PricingError

SUBCOMMANDS = (run, estimate, history, models, cache, info)


class _Version(argparse.Action):
    """Like argparse's own, but the line is made only when asked for (it loads llama.cpp)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings, dest, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        print(info.version_line())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tui-chat", description="Chat with local LLMs in the terminal, and see how they generate.")
    parser.add_argument("--version", action=_Version, help="print the versions of tui-chat, llama-cpp-python and ggml")
    add_model_options(parser)
    parser.set_defaults(run=chat.run)
    commands = parser.add_subparsers(dest="command", parser_class=Parser)
    for command in SUBCOMMANDS:
        command.add_parser(commands)
    return parser


def entry() -> int:
    """The `tui-chat` command: `main` with a watcher process that outlives a crash in llama.cpp."""
    return main(watched=True)


def main(argv: list[str] | None = None, *, watched: bool = False) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.watched = watched
        try:
            return args.run(args, load_config())
        except (ConfigError, InvalidParameter, EngineError, PricingError, HistoryError) as error:
            return fail(error)
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """Whatever the command, its output went to a pipe whose reader stopped (`| head`): it ends without a
    word, with the status a program ended by SIGPIPE has. Python would flush stdout again at exit and
    complain; what is left goes to /dev/null instead."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
