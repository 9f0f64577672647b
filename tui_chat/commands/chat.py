"""`tui-chat` with no subcommand: the chat UI."""

from __future__ import annotations

import argparse
import sys

from ..config import Config, log_dir
from ..guard import watch
from .common import RUNTIME_ERROR, opener_for


def run(args: argparse.Namespace, config: Config) -> int:
    from ..ui.app import ChatApp

    opener, model = opener_for(config, args)
    if args.watched:
        watch(log_dir())
    app = ChatApp(config, opener, model)
    app.run()
    if app.crash is not None:
        print(app.crash, file=sys.stderr, flush=True)
        return RUNTIME_ERROR
    return 0
