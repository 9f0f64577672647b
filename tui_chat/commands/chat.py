"""`tui-chat` with no subcommand: the chat UI."""

from __future__ import annotations

import argparse
import sys

from ..config import Config, log_dir
from ..guard import watch
from .common import RUNTIME_ERROR, opener_for

# The engine's worker thread waits for the GIL between llama.cpp calls while the UI thread draws; Python hands
# it over every 5 ms by default, which delayed each token's next decode (measured: decode in the app 0.73 x
# `run`'s at 5 ms, 0.78 x at 0.5 ms, the UI's own CPU unchanged).
SWITCH_INTERVAL_S = 0.0005


def run(args: argparse.Namespace, config: Config) -> int:
    from ..ui.app import ChatApp

    opener, model = opener_for(config, args)
    if args.watched:
        watch(log_dir())
    app = ChatApp(config, opener, model)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app.run()
    if app.crash is not None:
        print(app.crash, file=sys.stderr, flush=True)
        return RUNTIME_ERROR
    return 0
