"""The real app in a terminal, fed by a real token source: a stub OpenAI server streaming at 5,000 tok/s.

Why: `ui_streaming.py` runs the app headless beside a synthetic source; this is what a user of a fast server
sees. The stub (stub_server.py, a process of its own) streams over HTTP into the app's engine process, which
sends batches to the UI; the app runs in tmux (a pseudo-terminal) as `tui-chat --backend openai`. While the
reply streams, a letter is typed into the message box every 250 ms and timed until the terminal shows it
(tmux capture-pane, polled: a few ms of resolution); the app's event loop writes its stalls (TUI_CHAT_LAG_LOG).
At the end the panel's decode rate is read beside the rate the stub sent at. Then three passes more:
- toggles: a stream during which F2 (the panel), Ctrl+T (the heatmap), F2 and Ctrl+T again are pressed, a key
  in place of every TOGGLE_EVERY-th letter typed: the loop's stalls then;
- Esc mid-reply: how long until the footer says stopped, and whether the stub saw the connection cut;
- idle: the chat app once a reply of its own ended (a fresh app without the lag log, whose tick every 5 ms costs
  ~5 % of a core), and `tui-chat serve`'s live view (on the proxy model, after
  SERVE_REQUESTS small requests) with nothing in flight, --idle seconds each: the share of a core each process
  takes (nothing on screen changes, so nothing should be drawn).
Prints numbers, asserts nothing.

    python benchmarks/stub_stream.py [--rate 5000] [--seconds 4] [--rounds 3] [--stops 3] [--paragraph] [--idle 30]
                                     [--json]

Targets (issue 46, 2 cores): panel rate within 2 % of the server's, a key shown within 50 ms at p95, no loop stall
over 100 ms, toggles included; Esc stops within 100 ms; idle, the chat app under 1 % of a core, `serve`'s live view
under 2 %.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from app_speed import FOOTER, Tmux, panel, panel_rate, process_cpu_s, tree_cpu_s, tui_chat
from shared import fmt, median, own_dirs

from tui_chat.engine.local.cpu import cpu_model

HERE = Path(__file__).parent
KEY_EVERY_S = 0.25
TOGGLES = ("F2", "C-t", "F2", "C-t")  # the panel, the heatmap, each shown and hidden again mid-stream
TOGGLE_EVERY = 3  # a toggle in place of every third letter typed (0.75 s apart)
SETTLE_S = 2.0  # after a reply ends or the last request, before idle is measured
SERVE_REQUESTS = 30
PROMPT = "Write it all out, please."
STOPPED = "stopped ·"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def environment(root: Path, lag: bool = True) -> dict[str, str]:
    env = own_dirs(root)
    config = root / "config" / "tui-chat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("kv_cache_budget_gb = 0\n\n[sampling]\nmax_tokens = 100000\n")
    return env | ({"TUI_CHAT_LAG_LOG": str(root / "lag.jsonl")} if lag else {})  # the lag log ticks every 5 ms


def prompt_line(screen: str) -> str:
    """The message box's text line (between its heavy borders)."""
    for line in screen.splitlines():
        if line.lstrip().startswith("┃"):
            return line.split("┃")[1]
    return ""


def one_round(rate: float, tokens: int, paragraph: bool, stop_after_s: float | None, toggles: bool = False,
              idle_s: float = 0.0) -> dict:
    """A stream into a fresh app; with `idle_s`, then the app idle that long, without the lag log (its tick every
    5 ms is ~5 % of a core)."""
    root = Path(tempfile.mkdtemp(prefix="tui-chat-stub-stream-"))
    env, stats, port = environment(root, lag=not idle_s), root / "stub.json", free_port()
    server = subprocess.Popen([sys.executable, str(HERE / "stub_server.py"), str(port), str(stats), "--rate", str(rate),
                               "--tokens", str(tokens), *(["--paragraph"] if paragraph else [])],
                              start_new_session=True)
    try:
        app = Tmux(env, tui_chat("--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1"))
        try:
            result = drive(app, rate, stats, root, stop_after_s, server.pid, toggles)
            if idle_s:
                result["idle"] = idle_cores(app.pid, idle_s)
            return result
        finally:
            app.close()
    finally:
        server.kill()
        server.wait()


def cpu_by_process(app: Tmux, server: int) -> dict[str, float]:
    """CPU seconds so far of the app's UI process (all its threads), its engine process, the terminal (tmux) and the
    stub."""
    ui, terminal = process_cpu_s(app.pid), int(app("display-message", "-p", "#{pid}"))
    return {"ui": ui, "engine": tree_cpu_s(app.pid) - ui, "tmux": process_cpu_s(terminal), "stub": tree_cpu_s(server)}


def idle_cores(pid: int, seconds: float) -> dict[str, float]:
    """The share of a core `pid` (all its threads) and its child processes take over `seconds`, after SETTLE_S."""
    time.sleep(SETTLE_S)
    own, tree = process_cpu_s(pid), tree_cpu_s(pid)
    time.sleep(seconds)
    ui = process_cpu_s(pid) - own
    return {"ui": ui / seconds, "engine": (tree_cpu_s(pid) - tree - ui) / seconds}


def serve_idle(seconds: float) -> dict[str, float]:
    """`tui-chat serve` with its live view, on the proxy model, after SERVE_REQUESTS small completions: idle."""
    from proxy import proxy_model

    root = Path(tempfile.mkdtemp(prefix="tui-chat-serve-idle-"))
    port = free_port()
    app = Tmux(own_dirs(root), tui_chat("serve", "--model", str(proxy_model()), "--port", str(port)))
    try:
        deadline = time.monotonic() + 120
        while not _healthy(port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve did not start; the screen:\n{app.screen()}")
            time.sleep(0.2)
        for index in range(SERVE_REQUESTS):
            body = json.dumps({"prompt": f"Request {index}: count to ten.", "max_tokens": 16, "temperature": 0})
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body.encode(),
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()
        serve = int(app("display-message", "-p", "-t", "app", "#{pane_pid}"))  # not watched: the pane's own process
        return idle_cores(serve, seconds)
    finally:
        app.close()


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(json.loads(answer.read()).get("status") == "ok")
    except OSError:
        return False


def drive(app: Tmux, rate: float, stats: Path, root: Path, stop_after_s: float | None, server_pid: int,
          toggles: bool) -> dict:
    app.wait_for(lambda s: "server 127.0.0.1" in panel(s), 60)
    app("send-keys", "-t", "app", "-l", PROMPT)
    app.wait_for(lambda s: PROMPT[:20] in prompt_line(s), 10, 0.02)
    app("send-keys", "-t", "app", "C-u")  # the box emptied again: each typed letter is then its whole text
    app.wait_for(lambda s: PROMPT[:20] not in prompt_line(s), 10, 0.02)
    app("send-keys", "-t", "app", "-l", PROMPT)
    app.wait_for(lambda s: PROMPT[:20] in prompt_line(s), 10, 0.02)
    before = cpu_by_process(app, server_pid)
    app("send-keys", "-t", "app", "Enter")
    app.wait_for(lambda s: PROMPT[:20] not in prompt_line(s) and "out " in panel(s) and "out 0" not in panel(s),
                 30, 0.01)
    started = time.monotonic()
    if stop_after_s is not None:
        time.sleep(stop_after_s)
        asked = time.monotonic()
        app("send-keys", "-t", "app", "Escape")
        app.wait_for(lambda s: STOPPED in s, 30, 0.005)
        stopped_s = time.monotonic() - asked
        time.sleep(0.5)
        return {"stop_s": stopped_s, "server": json.loads(stats.read_text()) if stats.exists() else None}
    keys: list[float] = []
    typed = ""
    pressed = 0  # keys sent, toggles included
    toggled: list[str] = []
    while not FOOTER.search(screen := app.screen()):
        pressed += 1
        time.sleep(max(0.0, started + pressed * KEY_EVERY_S - time.monotonic()))
        if toggles and pressed % TOGGLE_EVERY == 0 and len(toggled) < len(TOGGLES):
            toggled.append(TOGGLES[len(toggled)])
            app("send-keys", "-t", "app", toggled[-1])
            continue
        typed = (typed + chr(ord("a") + len(keys) % 26))[-20:]
        sent = time.monotonic()
        app("send-keys", "-t", "app", "-l", typed[-1])
        try:
            app.wait_for(lambda s, shown=typed: shown in prompt_line(s) or FOOTER.search(s), 5, 0.002)
        except RuntimeError:
            continue
        keys.append(time.monotonic() - sent)
    server = json.loads(stats.read_text())
    wall = server["last"] - server["first"]
    cores = {name: (spent - before[name]) / wall for name, spent in cpu_by_process(app, server_pid).items()}
    shown = panel_rate(panel(screen), "Decode")
    lag = root / "lag.jsonl"
    stalls = [json.loads(line) for line in lag.read_text().splitlines()] if lag.exists() else []
    during = [s for s in stalls if server["first"] <= s["at"] <= server["last"] + 1.0]
    keys.sort()
    return {
        "server_tok_s": server["sent_tok_s"], "panel_tok_s": shown,
        "ratio": shown / server["sent_tok_s"] if shown and server["sent_tok_s"] else None,
        "tokens": server["tokens"], "keys": len(keys),
        "key_p50_ms": keys[len(keys) // 2] * 1000 if keys else None,
        "key_p95_ms": keys[min(len(keys) - 1, int(len(keys) * 0.95))] * 1000 if keys else None,
        "key_max_ms": keys[-1] * 1000 if keys else None,
        "worst_stall_ms": max((s["late_s"] for s in during), default=0.0) * 1000,
        "stalls_over_50ms": sum(s["late_s"] > 0.05 for s in during),
        "stalls_over_100ms": sum(s["late_s"] > 0.1 for s in during), "toggled": toggled,
        "worst_stalls": sorted(during, key=lambda s: -s["late_s"])[:3],
        "cores": cores,  # while it streamed: the UI, the engine process, tmux drawing it, the stub sending
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000.0, help="tokens a second the stub sends, default 5000")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of tokens a reply, default 4")
    parser.add_argument("--rounds", type=int, default=3, help="streams timed (each in a fresh app), default 3")
    parser.add_argument("--stops", type=int, default=3,
                        help="streams stopped with Esc (each in a fresh app), default 3")
    parser.add_argument("--paragraph", action="store_true", help="the reply one paragraph of plain words")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of each idle pass, default 30 (0: none)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args()
    if args.rounds < 1 or args.stops < 1:
        parser.error("--rounds and --stops must be >= 1")
    tokens = round(args.rate * args.seconds)
    log = sys.stderr if args.json else sys.stdout
    print(f"machine   {cpu_model() or platform.machine()}, {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.2f}",
          file=log)
    print(f"stream    {tokens:,} tokens at {args.rate:,.0f} tok/s from stub_server.py "
          f"({'one paragraph' if args.paragraph else 'Markdown sections'}) into `tui-chat --backend openai` in tmux",
          file=log)
    rounds = []
    for index in range(args.rounds):
        result = one_round(args.rate, tokens, args.paragraph, None)
        rounds.append(result)
        say_round(f"round {index + 1}", result, log)
    toggles = one_round(args.rate, tokens, args.paragraph, None, toggles=True)
    say_round("toggles " + "/".join(toggles["toggled"]), toggles, log)
    stops = [one_round(args.rate, tokens, args.paragraph, 1.0) for _ in range(args.stops)]
    stops_ms = [stop["stop_s"] * 1000 for stop in stops]
    cut = all(stop["server"] and stop["server"]["stopped"] for stop in stops)
    print(f"Esc 1 s into a stream ({len(stops)} runs): the footer said stopped after {fmt(median(stops_ms))} ms, "
          f"median ({fmt(min(stops_ms))}-{fmt(max(stops_ms))}; tmux polled); the stub "
          f"{'saw the connection cut each time' if cut else 'sent it all at least once'}", file=log)
    summary = {key: median([r[key] for r in rounds if r[key] is not None]) for key in
               ("server_tok_s", "panel_tok_s", "ratio", "key_p95_ms", "worst_stall_ms")}
    print("median  " + ", ".join(f"{key} {fmt(value, '.3f' if key == 'ratio' else '.1f')}"
                                 for key, value in summary.items()), file=log)
    idle = {"chat": one_round(args.rate, tokens, args.paragraph, None, idle_s=args.idle)["idle"] if args.idle else None,
            "serve": serve_idle(args.idle) if args.idle else None}
    for name, cores in idle.items():
        if cores is not None:
            print(f"idle {name}: " + ", ".join(f"{part} {value * 100:.2f} % of a core" for part, value in cores.items())
                  + f" over {args.idle:.0f} s", file=log)
    if args.json:
        print(json.dumps({"cpu": cpu_model(), "cpus": os.cpu_count(), "rate": args.rate, "tokens": tokens,
                          "paragraph": args.paragraph, "rounds": rounds, "toggles": toggles, "stops": stops,
                          "idle": idle, "median": summary}, indent=1))


def say_round(name: str, result: dict, log) -> None:
    worst = result["worst_stalls"][0] if result["worst_stalls"] else None
    cause = f" ({worst['cause']} in {worst['where'] or worst['hottest']})" if worst else ""
    print(f"{name}: server {fmt(result['server_tok_s'])} tok/s, panel {fmt(result['panel_tok_s'])} "
          f"(ratio {fmt(result['ratio'], '.3f')}), keys {result['keys']} p50/p95/max "
          f"{fmt(result['key_p50_ms'])}/{fmt(result['key_p95_ms'])}/{fmt(result['key_max_ms'])} ms, worst stall "
          f"{fmt(result['worst_stall_ms'])} ms{cause}, {result['stalls_over_50ms']} over 50 ms, "
          f"{result['stalls_over_100ms']} over 100 ms; cores "
          + ", ".join(f"{part} {value:.2f}" for part, value in result["cores"].items()), file=log)


if __name__ == "__main__":
    main()
