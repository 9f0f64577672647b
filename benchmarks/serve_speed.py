"""`tui-chat serve` under concurrent clients, beside llama.cpp's own `llama-server --parallel` on the same model.

Why: a server's worth is what several clients get at once. Each side is started once with the same number of
slots (--slots, default 4: `--parallel N` and llama-server's `-np N -kvu`), context (2,048 tokens a slot), threads
and batch size; then 1, half the slots and as many clients as slots stream a completion of the same prompt at
the same time (`/v1/completions`, the prompt read as it is on both: no chat template in the way), and each
stream's decode rate (its tokens after the first over the time from its first to its last) and the total rate
(all tokens over the wall time from the first request to the last end) are taken. Rounds alternate the sides,
so background load lands on both alike; the medians and the ratios tui-chat / llama-server are printed, or
with --json one JSON document. The prompt differs per client and per round, so neither side reuses a cache.

    python benchmarks/serve_speed.py [--slots 4] [--rounds 3] [--max-tokens 256] [--threads N] [--model PATH]
                                     [--gpu-layers N] [--llama-server PATH] [--json]

The first run builds llama-server once, as app_speed.py builds llama-bench (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import shared
from app_speed import llama_cpp_tool
from shared import fmt, median, own_dirs, ratio

from tui_chat.config import models_dir
from tui_chat.engine.compare import MAX_SLOTS
from tui_chat.engine.local.cpu import cpu_model, read_topology
from tui_chat.engine.local.model import PREFILL_CHUNK
from tui_chat.engine.models import starter_path

SLOTS = 4  # the default of --slots
SLOT_CTX = 2048  # tokens of context a slot, on both sides
N_CTX = SLOTS * SLOT_CTX
PROMPT = "Round {round}, client {client}. Count from 1 to 1000: 1, 2, 3, 4,"
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(port: int, process: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{name} ended at start (status {process.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{name} did not answer within {START_TIMEOUT_S} s")


def clients_for(slots: int) -> tuple[int, ...]:
    """The rounds' client counts: one, half the slots, and as many as there are slots (1, 2, 4 for 4)."""
    return tuple(sorted({1, max(slots // 2, 1), slots}))


def start_tui_chat(model: Path, threads: int, gpu_layers: int | None, home: Path, n_ctx: int = N_CTX,
                   slots: int = SLOTS) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = own_dirs(home)
    config = home / "config" / "tui-chat" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("kv_cache_budget_gb = 0\n")
    command = [sys.executable, "-m", "tui_chat", "serve", "--no-ui", "--model", str(model), "--port", str(port),
               "--parallel", str(slots), "--n-ctx", str(n_ctx), "--threads", str(threads), "--threads-batch",
               str(threads), *(["--gpu-layers", str(gpu_layers)] if gpu_layers is not None else [])]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    wait_ready(port, process, "tui-chat serve")
    return process, port


def start_llama_server(binary: Path, model: Path, threads: int, gpu_layers: int | None, n_ctx: int = N_CTX,
                       slots: int = SLOTS) -> tuple[subprocess.Popen, int]:
    port = free_port()
    command = [str(binary), "-m", str(model), "--port", str(port), "--parallel", str(slots), "-c", str(n_ctx),
               "-t", str(threads), "-tb", str(threads), "-b", str(PREFILL_CHUNK), "-ub", str(PREFILL_CHUNK),
               "-ngl", str(99 if (gpu_layers or 0) < 0 else gpu_layers or 0), "--no-webui", "-kvu"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_ready(port, process, "llama-server")
    return process, port


def stream_one(port: int, prompt: str, max_tokens: int, out: list[dict], gate: threading.Barrier) -> None:
    """One client: a streamed completion; when its first and last tokens came, and how many it got."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "repeat_penalty": 1.0,
                       "top_k": 1, "seed": 1, "stream": True, "stream_options": {"include_usage": True}})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    gate.wait()
    sent = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    first = last = None
    chunks = 0
    usage = None
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        payload = json.loads(line[6:])
        if payload.get("usage"):
            usage = payload["usage"]
        if payload.get("choices") and payload["choices"][0].get("text"):
            now = time.perf_counter()
            first = first or now
            last = now
            chunks += 1
    connection.close()
    tokens = (usage or {}).get("completion_tokens") or chunks
    out.append({"sent": sent, "first": first, "last": last, "tokens": tokens, "ttft_s": (first or sent) - sent})


def clients_round(port: int, clients: int, max_tokens: int, round_number: int) -> dict:
    results: list[dict] = []
    gate = threading.Barrier(clients)
    threads = [threading.Thread(target=stream_one, args=(port, PROMPT.format(round=round_number, client=client),
                                                         max_tokens, results, gate)) for client in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    start = min(result["sent"] for result in results)
    end = max(result["last"] or result["sent"] for result in results)
    per_stream = [(r["tokens"] - 1) / (r["last"] - r["first"]) for r in results
                  if r["first"] and r["last"] != r["first"]]
    return {"per_stream_tok_s": median(per_stream), "total_tok_s": sum(r["tokens"] for r in results) / (end - start),
            "ttft_s": median([r["ttft_s"] for r in results]), "tokens": [r["tokens"] for r in results]}


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def side_by_side_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a benchmark that runs `tui-chat serve` beside llama-server (this one, serve_newcomer.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, metavar="N", help="both sides' threads (default: the physical cores)")
    parser.add_argument("--model", type=shared.model_arg, metavar="PATH", help=shared.MODEL_HELP)
    parser.add_argument("--gpu-layers", type=int, metavar="N", help="layers offloaded on both sides, -1 all")
    parser.add_argument("--llama-server", type=Path, metavar="PATH", help="an existing llama-server binary")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    return parser


@dataclass(frozen=True)
class Setup:
    binary: Path
    model: Path
    threads: int
    home: Path  # the benchmark's own config, data and cache dirs
    log: TextIO  # where the table goes (stderr with --json)
    machine: str


def set_up(args: argparse.Namespace, name: str) -> Setup:
    """llama-server built if need be, the model, the threads; the machine's line printed."""
    version = importlib.metadata.version("llama-cpp-python")
    topology = read_topology()
    setup = Setup(args.llama_server or llama_cpp_tool("llama-server", version),
                  args.model or starter_path(models_dir()), args.threads or topology.physical,
                  Path(tempfile.mkdtemp(prefix=f"tui-chat-{name}-")), sys.stderr if args.json else sys.stdout,
                  f"{cpu_model() or platform.processor()}, {topology.physical} cores ({topology.logical} logical)")
    print(f"machine   {setup.machine}, llama-cpp-python {version}, load avg {os.getloadavg()[0]:.2f}",
          file=setup.log)
    return setup


def main() -> None:
    parser = side_by_side_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=256, metavar="N", help="tokens each stream asks for")
    parser.add_argument("--slots", type=int, default=SLOTS, choices=range(1, MAX_SLOTS + 1), metavar="N",
                        help=f"both sides' slots (1 to {MAX_SLOTS}, default {SLOTS}), {SLOT_CTX:,} tokens of context "
                             "each; the rounds run 1, N/2 and N clients")
    args = parser.parse_args()
    slots, n_ctx = args.slots, args.slots * SLOT_CTX
    clients_list = clients_for(slots)
    setup = set_up(args, "serve-speed")
    binary, model, threads, home, log, machine = (setup.binary, setup.model, setup.threads, setup.home, setup.log,
                                                  setup.machine)
    print(f"model     {model}\nsettings  {slots} slots, n_ctx {n_ctx}, {threads} threads, batch {PREFILL_CHUNK}, "
          f"greedy, {args.max_tokens} tokens a stream, /v1/completions streamed; files in {home}", file=log)
    ours, our_port = start_tui_chat(model, threads, args.gpu_layers, home, n_ctx, slots)
    theirs, their_port = start_llama_server(binary, model, threads, args.gpu_layers, n_ctx, slots)
    runs: dict[str, dict[int, list[dict]]] = {"tui-chat": {n: [] for n in clients_list},
                                              "llama-server": {n: [] for n in clients_list}}
    try:
        for number in range(args.rounds):
            for clients in clients_list:
                for side, port in (("tui-chat", our_port), ("llama-server", their_port)):
                    runs[side][clients].append(clients_round(port, clients, args.max_tokens, number))
            print(f"round {number + 1}/{args.rounds} done", file=log, flush=True)
    finally:
        stop(ours)
        stop(theirs)
    summary = {}
    print(f"\n{'clients':>8}{'tui per-stream':>16}{'llama per-stream':>18}{'ratio':>7}{'tui total':>11}"
          f"{'llama total':>13}{'ratio':>7}", file=log)
    for clients in clients_list:
        row = {side: {key: median([run[key] for run in runs[side][clients]]) for key in
                      ("per_stream_tok_s", "total_tok_s", "ttft_s")} for side in runs}
        row["ratio_per_stream"] = ratio(row["tui-chat"]["per_stream_tok_s"], row["llama-server"]["per_stream_tok_s"])
        row["ratio_total"] = ratio(row["tui-chat"]["total_tok_s"], row["llama-server"]["total_tok_s"])
        summary[clients] = row
        print(f"{clients:>8}{fmt(row['tui-chat']['per_stream_tok_s']):>16}"
              f"{fmt(row['llama-server']['per_stream_tok_s']):>18}{fmt(row['ratio_per_stream'], '.2f'):>7}"
              f"{fmt(row['tui-chat']['total_tok_s']):>11}{fmt(row['llama-server']['total_tok_s']):>13}"
              f"{fmt(row['ratio_total'], '.2f'):>7}", file=log)
    if args.json:
        json.dump({"machine": machine, "threads": threads, "max_tokens": args.max_tokens, "slots": slots,
                   "n_ctx": n_ctx, "summary": summary, "runs": runs}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
