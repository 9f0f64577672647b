"""`tui-chat` with no subcommand: the chat UI."""

from __future__ import annotations

import argparse
import sys

from ..config import Config, log_dir
from ..guard import watch
from .common import RUNTIME_ERROR, opener_for

# The engine's worker thread waits for the GIL between llama.cpp calls while the UI thread draws; Python hands
# it over every 5 ms by default, which once delayed each token's next decode (app decode 0.73 x `run`'s at 5 ms,
# 0.78 x at 0.5 ms, when the UI took a third of a core). With today's UI (0.12 of a core), measured in
# alternating runs on 2 cores: app / run decode the same at 0.5 and 2 ms (medians 0.92 of 4 runs each), the
# prompt read faster at 2 ms (0.86 x pp512 against 0.80), and at 5,000 tok/s the UI's worst stalls over 50 ms
# in 3 of 14 cases at 0.5 ms, in none at 2 ms.
SWITCH_INTERVAL_S = 0.002


def run(args: argparse.Namespace, config: Config) -> int:
    from ..ui.app import ChatApp

    opener, model = opener_for(config, args, engine_process=True)
    if args.watched:
        watch(log_dir())
    app = ChatApp(config, opener, model)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app.run()
    if app.crash is not None:
        print(app.crash, file=sys.stderr, flush=True)
        return RUNTIME_ERROR
    return 0
