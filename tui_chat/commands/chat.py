"""`tui-chat` with no subcommand: the chat UI."""

from __future__ import annotations

import argparse
import sys

from ..config import Config, log_dir
from ..guard import watch
from .common import RUNTIME_ERROR, opener_for

# The engine runs in a process of its own now (engine/process.py); in this one the UI thread shares the GIL with
# the threads that receive the engine's batches and hand them to the screen. Python hands it over every 5 ms by
# default; 2 ms was measured when the engine's worker lived here (alternating runs on 2 cores: the same decode
# as 0.5 ms, the prompt read faster, and at 5,000 tok/s no UI stall over 50 ms where 0.5 ms had 3 in 14 cases),
# and is kept: the receiving threads then wait at most that long for the UI.
SWITCH_INTERVAL_S = 0.002


def run(args: argparse.Namespace, config: Config) -> int:
    from ..ui.app import ChatApp

    opener, model = opener_for(config, args, engine_process=True)
    if args.watched:
        watch(log_dir())
    app = ChatApp(config, opener, model)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app.run()
    if app.lag is not None:  # its watchdog thread and GC hook go with the app
        app.lag.stop()
    if app.crash is not None:
        print(app.crash, file=sys.stderr, flush=True)
        return RUNTIME_ERROR
    return 0
