"""Entry point: the chat UI by default, or a subcommand (tui_chat/commands/: one module each).

Nothing here imports a command's module before that command runs: `tui-chat --help` and `--version` answer
without loading SQLite, the hub, Jinja, numpy, llama.cpp or Textual (tests/test_import_hygiene.py)."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from .commands import SUMMARIES
from .commands.common import Parser, add_model_options, fail

if TYPE_CHECKING:
    from .config import Config


class _Version(argparse.Action):
    """Like argparse's own, but the line is made only when asked for, from the installed packages' metadata."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings, dest, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        from .commands.info import version_line

        print(version_line())
        parser.exit(0)


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]  # generic only in typeshed, not at runtime
    """The subcommands, each a bare parser holding its line from SUMMARIES until argparse reaches it; then its
    module is imported and its `add_parser` puts the real one in the bare one's place."""

    def add_summary(self, name: str) -> None:
        super().add_parser(name, help=SUMMARIES[name][1])

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("prog", f"{self._prog_prefix} {name}")
        parser: argparse.ArgumentParser = self._parser_class(**kwargs)
        self._name_parser_map[name] = parser  # in place: the order of --help stays
        return parser

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        assert isinstance(values, list)  # nargs=PARSER: the command's name, then its arguments
        module, _ = SUMMARIES[values[0]]
        importlib.import_module(f"{__package__}.commands.{module}").add_parser(self)
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tui-chat", description="Chat with local LLMs in the terminal, and see how they generate.")
    parser.add_argument("--version", action=_Version,
                        help="print the versions of tui-chat, llama-cpp-python, Textual and Python (the llama.cpp "
                             "build: tui-chat info)")
    add_model_options(parser)
    parser.set_defaults(run=_chat)
    commands = cast(_Commands, parser.add_subparsers(dest="command", parser_class=Parser, action=_Commands))
    for name in SUMMARIES:
        commands.add_summary(name)
    return parser


def _chat(args: argparse.Namespace, config: Config) -> int:
    from .commands import chat

    return chat.run(args, config)


def entry() -> int:
    """The `tui-chat` command: `main` with a watcher process that outlives a crash in llama.cpp."""
    return main(watched=True)


def main(argv: list[str] | None = None, *, watched: bool = False) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.watched = watched
        from .config import load_config  # after --help and --version, which read no config

        try:
            code: int = args.run(args, load_config())
            return code
        except _user_errors() as error:
            return fail(error)
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """Whatever the command, its output went to a pipe whose reader stopped (`| head`): it ends without a
    word, with the status a program ended by SIGPIPE has. Python would flush stdout again at exit and
    complain; what is left goes to /dev/null instead."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors a command leaves for the user to read, in one line. Python evaluates this only when an
    exception reaches `main`, so these modules are not imported for a command that does not need them."""
    from .config import ConfigError
    from .engine.base import EngineError
    from .engine.params import InvalidParameter
    from .history import HistoryError
    from .pricing import PricingError

    return ConfigError, InvalidParameter, EngineError, PricingError, HistoryError


if __name__ == "__main__":
    sys.exit(main())
