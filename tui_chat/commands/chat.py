"""`tui-chat` with no subcommand: the chat UI."""

from __future__ import annotations

import argparse

from ..config import Config, log_dir
from ..guard import watch
from .common import opener_for


def run(args: argparse.Namespace, config: Config) -> int:
    from ..ui.app import ChatApp

    opener, model = opener_for(config, args)
    if args.watched:
        watch(log_dir())
    ChatApp(config, opener, model).run()
    return 0
