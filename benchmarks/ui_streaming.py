"""The chat screen under a synthetic token stream: does the UI keep up, and does typing stay quick?

Why: a fast model writes thousands of tokens a second, and the UI must show them as fast as they come
(target: achieved >= 0.95 x offered) while the prompt box still takes keys (target: < 50 ms), also
deep into a long chat. A synthetic backend (synthetic.py) paces tokens exactly, in an engine process of its
own as the app runs its model, so the real `ChatApp`, run headless, gets them as it gets a model's: in batches
over a socket. It prints numbers, asserts nothing.

    python benchmarks/ui_streaming.py [--rates 2000 5000] [--seconds 5] [--history 300] [--source process|thread]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import shared
import textual
from synthetic import SHORT_ASK, SyntheticBackend, markdown_reply, sentence, split_tokens
from textual import events

from tui_chat.commands.chat import SWITCH_INTERVAL_S
from tui_chat.config import Config, log_dir
from tui_chat.engine.base import Backend
from tui_chat.engine.local.cpu import cpu_model
from tui_chat.engine.process import EngineProcess
from tui_chat.lag import LagMonitor, Stall
from tui_chat.session import Branch, Turn
from tui_chat.ui.app import ChatApp
from tui_chat.ui.chat.screen import ChatScreen
from tui_chat.ui.screens.inspector import InspectorScreen
from tui_chat.ui.widgets.messages import ReplyMessage
from tui_chat.ui.widgets.prompt import PromptInput

HERE = Path(__file__).parent
SIZE = (100, 32)
KEY_EVERY_S = 0.25
BEAT_S = 0.005
METRICS_EVERY_S = 0.1
HISTORY_REPLY_TOKENS = 300
KEY_TARGET_S = 0.050
STALL_TARGET_S = 0.050
RATIO_TARGET = 0.95
# --- measuring the app ---------------------------------------------------------------------------


MODES = ("plain", "heatmap", "thinking", "inspector")


@dataclass
class Case:
    """One stream through one fresh app, with what the UI made of it. `mode`: plain; heatmap (on, tokens
    with probabilities); thinking (its first third is thinking, the block unfolded); inspector (open on
    the previous reply while this one streams behind it: keys go to the inspector, so none are timed; its
    opening, a response to a key before the stream, is timed apart: `open_s`, `open_stall_s`)."""

    history: int
    rate: int
    tokens: int
    mode: str = "plain"
    source: str = "process"  # where the tokens come from: an engine process, or a thread of the app's own
    produced_tok_s: float = 0.0
    achieved_tok_s: float = 0.0
    shown_lag_s: float = 0.0
    end_lag_s: float = 0.0
    keys_s: list[float] = field(default_factory=list)
    stalls: list[dict] = field(default_factory=list)  # every stall >= 20 ms, streaming or finishing, with its cause
    open_s: float = 0.0  # inspector: from the key to the inspector drawn
    open_stall_s: float = 0.0  # inspector: the worst stall while it opened

    @property
    def ratio(self) -> float:
        return self.achieved_tok_s / self.rate

    def key_quantile_s(self, q: float) -> float | None:
        """Nearest rank: with the 10 to 20 keys of a 5 s stream, p95 is the worst or second-worst."""
        keys = sorted(self.keys_s)
        return keys[round(q * (len(keys) - 1))] if keys else None

    @property
    def worst_stall_s(self) -> float:
        return max((stall["late_s"] for stall in self.stalls), default=0.0)

    def summary(self) -> dict:
        """The figures a script reads (`--json`)."""
        def key_ms(q: float) -> float | None:
            value = self.key_quantile_s(q)
            return None if value is None else round(value * 1000, 1)

        return {
            "history": self.history, "mode": self.mode, "offered_tok_s": self.rate,
            "achieved_tok_s": round(self.achieved_tok_s, 1), "ratio": round(self.ratio, 3),
            "key_median_ms": key_ms(0.5), "key_p95_ms": key_ms(0.95), "key_p99_ms": key_ms(0.99),
            "key_max_ms": key_ms(1.0), "worst_stall_ms": round(self.worst_stall_s * 1000, 1),
            "end_lag_ms": round(self.end_lag_s * 1000, 1), "stalls": self.stalls,
        } | ({"inspector_open_ms": round(self.open_s * 1000, 1), "inspector_open_stall_ms":
              round(self.open_stall_s * 1000, 1)} if self.mode == "inspector" else {})


class Monitor:
    """The app's own lag monitor (tui_chat/lag.py: each stall timed and attributed) and a task on the
    event loop, waking every BEAT_S, that notes when the reply holds all the text and when the reply is
    finished: its frozen body is laid out, so the costly Rich render of the whole reply is counted. The
    checks are O(1): a DOM query here walks every block of a long reply and would add lag of its own."""

    def __init__(self, screen: ChatScreen) -> None:
        self.screen = screen
        self.lag = LagMonitor()
        self.lag.start()
        self.widget: ReplyMessage | None = None
        self.chars = 0
        self.shown_at: float | None = None
        self.finished_at: float | None = None
        self._task = asyncio.create_task(self._run())

    def watch(self, widget: ReplyMessage, chars: int) -> None:
        self.widget, self.chars = widget, chars

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            now = time.perf_counter()
            if self.widget is None:
                continue
            if self.shown_at is None and len(self.widget.text) >= self.chars:
                self.shown_at = now
            newest = self.screen.query_one("#log").children[-1]
            frozen = isinstance(newest, ReplyMessage) and newest.finished and newest.size.height > 0
            if self.finished_at is None and self.screen.reply is None and frozen:
                self.finished_at = now

    def finished(self) -> bool:
        """Whether the reply is finished on screen; a monitor that failed raises its error here, not a timeout."""
        if self._task.done():
            self._task.result()
        return self.finished_at is not None

    def stalls(self, start: float, end: float) -> list[Stall]:
        """Stalls that ended in [start, end] (a stall ending later began before `end`: counted too)."""
        return [stall for stall in self.lag.stalls if start <= stall.at and stall.at - stall.late_s <= end]

    def stop(self) -> None:
        self._task.cancel()
        self.lag.stop()


def press(app: ChatApp, key: str, char: str | None) -> None:
    """Post a key as the terminal driver does. Not `pilot.press`: after each key it waits up to 1 s for
    the process to go idle, which it never does mid-stream, and then queues a callback on every
    widget on the screen, a load the real app never carries."""
    event = events.Key(key, char)
    event.set_sender(app)
    app.post_message(event)


async def until(condition: Callable[[], bool], timeout: float, poll: float = 0.001) -> None:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(poll)


async def prefill(screen: ChatScreen, messages: int, rng: random.Random) -> None:
    """A long chat as it looks when reopened: the screen mounts the recent part of it."""
    turns = []
    for n in range(messages // 2):
        question, answer = f"{sentence(rng)[:-1]}?", markdown_reply(rng, HISTORY_REPLY_TOKENS)
        footer = f"end of text · {len(split_tokens(answer))} tokens · 41.{n % 10} tok/s · TTFT 0.2{n % 10} s"
        turns.append(Turn(question, [Branch(answer, footer)]))
    screen.session.turns = turns
    await screen.view.show(screen.session)


def token_source(source: str, pieces: list[str], rate: int, mode: str, logs: Path) -> Backend:
    """The synthetic backend in an engine process of its own, as the app runs its model; or on a thread here."""
    make = partial(SyntheticBackend, pieces, rate, probabilities=mode in ("heatmap", "inspector"),
                   thinking=len(pieces) // 3 if mode == "thinking" else 0)
    if source == "thread":
        return make()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HERE), os.environ.get("PYTHONPATH"))))
    return EngineProcess(make, logs)


async def run_case(history: int, rate: int, tokens: int, seed: int, mode: str = "plain",
                   source: str = "process") -> Case:
    rng = random.Random(seed)
    pieces = split_tokens(markdown_reply(rng, tokens))[:tokens]
    thinking = tokens // 3 if mode == "thinking" else 0
    backend = token_source(source, pieces, rate, mode, log_dir())
    case = Case(history, rate, tokens, mode, source)
    app = ChatApp(Config(), lambda name: backend, "synthetic")
    async with app.run_test(size=SIZE) as pilot:
        screen: ChatScreen = app.screen
        await until(lambda: screen.workspace.backend is not None, 30)
        await prefill(screen, history, rng)
        if mode == "heatmap":
            await screen.view.set_heatmap(True)
        if mode == "inspector":
            await answered_once(screen)
        await pilot.pause()  # the history's first layout is done before anything is timed
        prompt = screen.query_one(PromptInput)
        prompt.text = "Write it all out, please."
        monitor = Monitor(screen)
        if mode == "inspector":
            await open_inspector(app, screen, monitor, case)
            prompt.post_message(PromptInput.Submitted(prompt.text))  # Enter would go to the inspector
        else:
            press(app, "enter", "\r")
        await until(lambda: screen.reply is not None and screen.view.log_view.reply_of(screen.reply.turn), 30)
        widget = screen.view.log_view.reply_of(screen.reply.turn)
        widget.unfolded = mode == "thinking"  # as if unfolded the moment it showed
        monitor.watch(widget, sum(map(len, pieces[thinking:])))

        typed = ""
        next_key = time.perf_counter()
        while screen.reply is not None:
            next_key += KEY_EVERY_S  # on a fixed schedule, so a slow key does not thin out the next ones
            await asyncio.sleep(max(0.0, next_key - time.perf_counter()))
            if mode == "inspector":
                continue
            char = chr(ord("a") + len(typed) % 26)
            typed += char
            sent = time.perf_counter()
            press(app, char, char)
            await until(lambda expected=typed: prompt.text == expected, 30)
            case.keys_s.append(time.perf_counter() - sent)
        await until(monitor.finished, 600, poll=0.05)
        monitor.stop()
        written = screen.session.turns[-1].reply.tokens  # stamped as the source wrote them (one clock for both)

    backend.close()
    first, last = written[0].at, written[-1].at
    case.produced_tok_s = (tokens - 1) / (last - first)
    case.achieved_tok_s = tokens / (monitor.shown_at - first)
    case.shown_lag_s = monitor.shown_at - last
    case.end_lag_s = monitor.finished_at - last
    case.stalls = [dataclasses.asdict(stall) | {"at": round(stall.at - first, 3)}
                   for stall in monitor.stalls(first, monitor.finished_at)]
    return case


async def open_inspector(app: ChatApp, screen: ChatScreen, monitor: Monitor, case: Case) -> None:
    """The inspector opened on the previous reply, as Enter on it does, and drawn: how long it took."""
    earlier = screen.query(ReplyMessage)[-1]
    asked = time.perf_counter()
    earlier.post_message(ReplyMessage.Inspect(earlier, 3))
    await until(lambda: isinstance(app.screen, InspectorScreen) and app.screen.is_mounted, 10)
    await app.screen.wait_for_refresh()
    case.open_s = time.perf_counter() - asked
    await asyncio.sleep(0.1)  # a stall the opening caused ends before the stream starts
    case.open_stall_s = max((stall.late_s for stall in monitor.lag.stalls if stall.at >= asked), default=0.0)


async def answered_once(screen: ChatScreen) -> None:
    """A short reply with probabilities first, for the inspector to open on."""
    screen.query_one(PromptInput).text = SHORT_ASK
    press(screen.app, "enter", "\r")
    await until(lambda: screen.reply is not None, 30)
    await until(lambda: screen.reply is None, 30)


# --- reporting -----------------------------------------------------------------------------------


ms = functools.partial(shared.ms, spec=".0f")


def print_case(case: Case) -> None:
    keys = "  ".join(f"{ms(case.key_quantile_s(q)):>5}" for q in (0.5, 0.95, 0.99, 1.0))
    print(f"{case.history:>7}  {case.mode:>9}  {case.rate:>7}  {case.tokens:>6}  {case.produced_tok_s:>8.0f}  "
          f"{case.achieved_tok_s:>8.0f}  {case.ratio:>5.2f}  {ms(case.shown_lag_s):>6}  {ms(case.end_lag_s):>6}  "
          f"{len(case.keys_s):>4}  {keys}  {ms(case.worst_stall_s):>6}", flush=True)
    if case.mode == "inspector":
        print(f"{'':>9}the inspector opened in {ms(case.open_s)} ms, its worst stall {ms(case.open_stall_s)} ms "
              "(before the stream)", flush=True)
    for stall in sorted(case.stalls, key=lambda stall: -stall["late_s"])[:3]:
        print(f"{'':>9}stall {ms(stall['late_s']):>4} ms ({ms(stall.get('cpu_s', 0.0))} ms CPU) "
              f"at {stall['at']:.2f} s: {stall['cause']}"
              f"{' in ' + stall['where'] if stall['where'] else ''}", flush=True)


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def print_markdown(cases: list[Case]) -> None:
    """The summary as a table for README.md; the keypress target is checked on the p95."""
    print(f"\n| prior messages | mode | offered tok/s | achieved tok/s | ratio (≥ {RATIO_TARGET}) | end lag ms | "
          f"keypress median / p95 / p99 / max ms (p95 < {ms(KEY_TARGET_S)}) | "
          f"worst stall ms (< {ms(STALL_TARGET_S)}) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for c in cases:
        keys = " / ".join(ms(c.key_quantile_s(q)) for q in (0.5, 0.95, 0.99, 1.0))
        p95 = c.key_quantile_s(0.95)
        keys_ok = "" if p95 is None else " " + mark(p95 < KEY_TARGET_S)
        print(f"| {c.history} | {c.mode} | {c.rate:,} | {c.achieved_tok_s:,.0f} | {c.ratio:.2f} "
              f"{mark(c.ratio >= RATIO_TARGET)} | {ms(c.end_lag_s)} | {keys}{keys_ok} "
              f"| {ms(c.worst_stall_s)} {mark(c.worst_stall_s < STALL_TARGET_S)} |")


def run_alone(history: int, rate: int, seconds: float, mode: str, switch_interval: float, source: str) -> Case:
    """Each case in a process of its own, as the app runs, with data dirs of its own: the chats it writes never
    reach the user's history."""
    command = [sys.executable, __file__, "--one-case", str(history), str(rate), "--seconds", str(seconds),
               "--mode", mode, "--switch-interval", str(switch_interval), "--source", source]
    root = Path(tempfile.mkdtemp(prefix="tui-chat-ui-streaming-"))
    env = shared.own_dirs(root)
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return Case(**json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[2000, 5000], help="offered tok/s, default 2000 5000")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of tokens per stream, default 5")
    parser.add_argument("--history", type=int, default=300, help="finished messages already in the chat, default 300")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="plain runs every rate into an empty chat and a long one; the others the top rate "
                             "into the long chat (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    parser.add_argument("--switch-interval", type=float, default=SWITCH_INTERVAL_S, metavar="S",
                        help=f"the interpreter's switch interval, default the app's own ({SWITCH_INTERVAL_S} s)")
    parser.add_argument("--source", choices=("process", "thread"), default="process",
                        help="where the tokens come from: an engine process of their own, as the app runs its "
                             "model (default), or a thread in the app's process (the old measure)")
    parser.add_argument("--one-case", type=int, nargs=2, metavar=("HISTORY", "RATE"), help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="plain", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.rates) < 1 or args.seconds <= 0 or args.history < 0:
        parser.error("--rates must be >= 1, --seconds > 0, --history >= 0")
    if args.one_case:
        history, rate = args.one_case
        sys.setswitchinterval(args.switch_interval)  # as `tui-chat` sets it: the synthetic engine shares the GIL
        case = asyncio.run(run_case(history, rate, round(rate * args.seconds), seed=rate, mode=args.mode,
                                    source=args.source))
        print(json.dumps(dataclasses.asdict(case)))
        return

    plan = [(history, rate, "plain") for history in sorted({0, args.history}) for rate in args.rates
            if "plain" in args.modes]
    plan += [(args.history, max(args.rates), mode) for mode in args.modes if mode != "plain"]
    if not args.json:
        print_header(args)
    started = time.perf_counter()
    cases = []
    for history, rate, mode in plan:
        case = run_alone(history, rate, args.seconds, mode, args.switch_interval, args.source)
        cases.append(case)
        if not args.json:
            print_case(case)
    if args.json:
        print(json.dumps({"cases": [case.summary() for case in cases], "cpu": cpu_model() or platform.machine(),
                          "cpus": os.cpu_count(), "textual": textual.__version__, "seconds": args.seconds,
                          "switch_interval_s": args.switch_interval, "source": args.source}, indent=1))
        return
    print(f"\nfinished in {time.perf_counter() - started:.0f} s, load avg {os.getloadavg()[0]:.2f}")
    print_markdown(cases)


def print_header(args: argparse.Namespace) -> None:
    print(f"machine   {cpu_model() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"textual {textual.__version__}, load avg {os.getloadavg()[0]:.2f}")
    where = "an engine process of their own, over its socket" if args.source == "process" else "a thread of the app"
    print(f"source    tokens from {where}")
    print(f"app       ChatApp headless at {SIZE[0]}x{SIZE[1]}; a key into the prompt every "
          f"{KEY_EVERY_S * 1000:.0f} ms while tokens flow; stalls from tui_chat/lag.py (>= 20 ms, with their cause)")
    sample = split_tokens(markdown_reply(random.Random(0), 4000))
    print(f"reply     Markdown sections of ~400 tokens (heading, paragraphs, list, python block), "
          f"{sum(map(len, sample)) / len(sample):.1f} chars/token; the chat holds {args.history} finished messages "
          f"(and 0 for the baseline)")
    print("columns   produced: the backend's real pace; achieved: tokens / (first token produced -> all text\n"
          "          in the reply's Markdown); shown / end: ms from the last token produced to all text in the\n"
          "          Markdown / to the reply finished (frozen body laid out); k: ms from a key posted to\n"
          "          PromptInput.text holding it (median, p95, p99, max); stall: the event loop's worst, in ms,\n"
          "          from the first token to the reply finished, and the three worst with their causes and the\n"
          "          loop's CPU time in them (far less than the stall: it waited for a core, the machine was busy)\n")
    print(f"{'history':>7}  {'mode':>9}  {'offered':>7}  {'tokens':>6}  {'produced':>8}  {'achieved':>8}  "
          f"{'ratio':>5}  {'shown':>6}  {'end':>6}  {'keys':>4}  {'k med':>5}  {'k p95':>5}  {'k p99':>5}  "
          f"{'k max':>5}  {'stall':>6}")


if __name__ == "__main__":
    main()
