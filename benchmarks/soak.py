"""Soak: hundreds of chat turns through the real app on the tiny model. Does memory stay flat, and
does nothing fail?

Why: a chat app stays open all day. Leaks that a single test never sees (widgets kept after a new
chat, streams or writers held by a screen, objects frozen out of the collector while replies stream)
only show after hundreds of turns. This drives the real `ChatApp` headless with Pilot on the tiny
random-weight GGUF (real llama.cpp, real history file), greedy, starts a new chat (Ctrl+N) every few
turns and keeps one long chat that overflows the context, so turns get left out and the log unmounts
old messages. It prints process RSS along the way and a verdict; it asserts nothing.

    python benchmarks/soak.py [--turns 500] [--new-chat-every 20] [--long-chat 1:100]

Verdict: flat when RSS grows less than --max-growth (10 %) from turn 50 to the last turn, and no
error: no error notification, no reply cut short, no exception, and the history file holds every
turn and passes SQLite's integrity check. The long chat comes first: by turn 50 the log holds the most
messages it ever mounts (100), and Python keeps the memory a bigger chat once needed, so growth after
turn 50 is a leak, not a larger chat.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import platform
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SIZE = (100, 32)
N_CTX = 2048
MAX_TOKENS = 32
CHECK_EVERY = 50
TURN_TIMEOUT_S = 60.0
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
TOPICS = ("the capital of France", "the weather", "Python", "a long river", "the first year", "old books",
          "water", "the people of Rome", "a small city", "work and life")


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES / 2**20


@dataclass
class Sample:
    turn: int
    rss_mb: float
    objects: int
    mounted: int
    in_chat: int
    seconds_per_turn: float


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    notes: collections.Counter = field(default_factory=collections.Counter)
    errors: list[str] = field(default_factory=list)
    left_out_turns: int = 0
    full_collections: list[float] = field(default_factory=list)  # seconds each full (generation 2) gc took
    new_chats: int = 0
    seconds: float = 0.0


def time_full_collections(run: Run) -> None:
    """Full collections stall the event loop: the app times them for a quiet moment, this counts them."""
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            run.full_collections.append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)


def long_chat_range(text: str) -> range:
    first, _, last = text.partition(":")
    return range(int(first), int(last) + 1)


def said(screen) -> list:
    return [message for message in screen.session.messages() if message.role != "system"]


def question(turn: int) -> str:
    return f"Turn {turn}: tell me about {TOPICS[turn % len(TOPICS)]}, in a few words."


async def soak(model: Path, turns: int, new_chat_every: int, long_chat: range) -> Run:
    from tui_chat.commands.common import opener_for
    from tui_chat.config import Config
    from tui_chat.engine.params import SamplingParams
    from tui_chat.ui.app import ChatApp
    from tui_chat.ui.chat.screen import ChatScreen
    from tui_chat.ui.widgets.chat_log import ChatLog
    from tui_chat.ui.widgets.messages import ReplyMessage
    from tui_chat.ui.widgets.prompt import PromptInput

    run = Run()
    time_full_collections(run)

    class ObservedApp(ChatApp):
        """The real app; every notification is also counted, and the error ones kept for the report."""

        def notify(self, message: str, *, severity: str = "information", **kwargs) -> None:
            run.notes[severity] += 1
            if severity == "error":
                run.errors.append(f"notification: {kwargs.get('title', '')} {message}".strip())
            super().notify(message, severity=severity, **kwargs)

    settings = Config(sampling=SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=MAX_TOKENS),
                      n_ctx=N_CTX)
    app = ObservedApp(settings, opener_for(settings)[0], str(model))
    started = time.perf_counter()
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        while screen.workspace.backend is None:
            await pilot.pause(0.05)
        prompt = screen.query_one(PromptInput)
        log = screen.query_one(ChatLog)
        chat_turns = 0
        last_check, last_check_turn = time.perf_counter(), 0
        for turn in range(1, turns + 1):
            if chat_turns and (chat_turns >= new_chat_every and turn not in long_chat or turn == long_chat.start):
                await pilot.press("ctrl+n")
                await pilot.pause()
                chat_turns = 0
                run.new_chats += 1
            expected = len(said(screen)) + 2
            prompt.focus()
            prompt.text = question(turn)
            await pilot.press("enter")
            deadline = time.monotonic() + TURN_TIMEOUT_S
            while not (screen.reply is None and len(said(screen)) == expected):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"turn {turn}: no reply within {TURN_TIMEOUT_S:.0f} s")
                await pilot.pause(0.01)
            chat_turns += 1
            footer = screen.query(ReplyMessage).last().reply.footer or ""
            if footer.startswith("cut short"):
                run.errors.append(f"turn {turn}: {footer}")
            if "left out" in footer:
                run.left_out_turns += 1
            if turn == 1 or turn % CHECK_EVERY == 0:
                now = time.perf_counter()
                run.samples.append(Sample(turn, rss_mb(), len(gc.get_objects()), len(log.messages()),
                                          len(said(screen)), (now - last_check) / (turn - last_check_turn)))
                last_check, last_check_turn = now, turn
                sample = run.samples[-1]
                print(f"  turn {turn:>4}  RSS {sample.rss_mb:7.1f} MB  objects {sample.objects:>9,}  "
                      f"{sample.seconds_per_turn:5.2f} s/turn", flush=True)
    run.seconds = time.perf_counter() - started
    if app._exception is not None:
        run.errors.append(f"exception: {app._exception!r}")
    return run


def check_history(path: Path, turns: int) -> list[str]:
    """The file holds every message, none left streaming, and SQLite finds it intact."""
    with sqlite3.connect(path) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        states = dict(db.execute("SELECT state, count(*) FROM messages GROUP BY state").fetchall())
    problems = [] if integrity == "ok" else [f"history integrity_check: {integrity}"]
    if states != {"complete": 2 * turns}:
        problems.append(f"history holds {states}, expected {2 * turns} complete messages")
    return problems


def print_report(run: Run, turns: int, max_growth: float) -> bool:
    print("\n| turn | RSS MB | Python objects | messages mounted | messages in chat | s/turn |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in run.samples:
        print(f"| {s.turn} | {s.rss_mb:.1f} | {s.objects:,} | {s.mounted} | {s.in_chat} | {s.seconds_per_turn:.2f} |")
    by_turn = {s.turn: s for s in run.samples}
    base, last = by_turn.get(CHECK_EVERY, run.samples[0]), run.samples[-1]
    growth = (last.rss_mb - base.rss_mb) / base.rss_mb
    print(f"\n{turns} turns in {run.seconds:.0f} s ({run.seconds / turns:.2f} s/turn), {run.new_chats} new chats, "
          f"{run.left_out_turns} replies with turns left out of the prompt; notifications {dict(run.notes)}")
    if run.full_collections:
        pauses = sorted(run.full_collections)
        print(f"full garbage collections: {len(pauses)}, median {pauses[len(pauses) // 2] * 1000:.0f} ms, "
              f"longest {pauses[-1] * 1000:.0f} ms")
    print(f"RSS turn {base.turn}: {base.rss_mb:.1f} MB, turn {last.turn}: {last.rss_mb:.1f} MB, "
          f"growth {growth:+.1%} (flat below {max_growth:.0%})")
    for error in run.errors:
        print(f"ERROR {error}")
    flat = growth < max_growth
    print(f"verdict: memory {'flat' if flat else 'GROWS'}, {len(run.errors)} error{'s' if len(run.errors) != 1 else ''}"
          f" -> {'PASS' if flat and not run.errors else 'FAIL'}")
    return flat and not run.errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=500, help="chat turns, default 500")
    parser.add_argument("--new-chat-every", type=int, default=20, help="Ctrl+N after this many turns, default 20")
    parser.add_argument("--long-chat", default="1:100", help="turns FIRST:LAST kept in one chat, default 1:100")
    parser.add_argument("--max-growth", type=float, default=0.10, help="RSS growth still called flat, default 0.10")
    args = parser.parse_args()
    if args.turns < CHECK_EVERY or args.new_chat_every < 1:
        parser.error(f"--turns must be >= {CHECK_EVERY} and --new-chat-every >= 1")

    with tempfile.TemporaryDirectory(prefix="tui-chat-soak-") as scratch:
        root = Path(scratch)
        for name in ("CONFIG", "DATA", "STATE"):  # the user's own config and history are never touched
            os.environ[f"XDG_{name}_HOME"] = str(root / name.lower())
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_model import write_tiny_model
        from tui_chat.config import history_path

        model = write_tiny_model(root / "tiny.gguf")
        print(f"machine   {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, "
              f"Python {platform.python_version()}, load avg {os.getloadavg()[0]:.2f}")
        print(f"run       {args.turns} turns on the tiny model, greedy, max {MAX_TOKENS} tokens, n_ctx {N_CTX}; "
              f"Ctrl+N every {args.new_chat_every} turns, turns {args.long_chat} in one chat; ChatApp headless "
              f"at {SIZE[0]}x{SIZE[1]}")
        run = asyncio.run(soak(model, args.turns, args.new_chat_every, long_chat_range(args.long_chat)))
        run.errors += check_history(history_path(), args.turns)
        return 0 if print_report(run, args.turns, args.max_growth) else 1


if __name__ == "__main__":
    sys.exit(main())
