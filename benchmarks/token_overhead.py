"""Where a decoded token's time goes: inside `llama_decode`, and the engine's own work between two of them.

Why: llama-bench's tg128 is llama_decode alone; `tui-chat run` adds the engine's work per token (the sampler
chain over the shortlist, the inspector's top N and softmax, the reply's text, the event). At ~67 tok/s a token
is ~15 ms, so 0.95 x tg128 leaves ~0.8 ms for that work. Timing it directly (median over the tokens, wall and
the worker thread's CPU time) is far less noise-sensitive than comparing tok/s on a shared machine. The same
settings as benchmarks/app_speed.py: its short prompt, greedy, 128 tokens, the inspector's top 10 recorded.
It prints numbers and asserts nothing.

    python benchmarks/token_overhead.py [--rounds 3] [--threads 2] [--top-logprobs 10] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import llama_cpp
import shared
from app_speed import INSPECTOR_TOP, MAX_TOKENS, SHORT_PROMPT
from shared import bench_model

from tui_chat.engine.base import Done, Error, Message, Request
from tui_chat.engine.local.cpu import cpu_model
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import LiveParams, SamplingParams

Stamp = tuple[float, float, float, float]  # wall and thread CPU time as llama_decode began, then as it returned


def timed_decodes(stamps: list[Stamp]) -> None:
    """Wrap llama.cpp's llama_decode (the engine calls it through the module) to stamp every call."""
    decode = llama_cpp.llama_decode

    def timed(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
        wall, cpu = time.perf_counter(), time.thread_time()
        status: int = decode(ctx, batch)
        stamps.append((wall, cpu, time.perf_counter(), time.thread_time()))
        return status

    llama_cpp.llama_decode = timed


def split(stamps: list[Stamp]) -> dict[str, float]:
    """Per token, in ms: inside llama_decode, and between one decode's return and the next's start (wall, and the
    worker's CPU time), from the reply's decodes (the prompt's are left out)."""
    steps = stamps[-MAX_TOKENS + 1 :]
    inside = [end - start for start, _, end, _ in steps]
    between = [b[0] - a[2] for a, b in zip(steps, steps[1:], strict=False)]
    cpu = [b[1] - a[3] for a, b in zip(steps, steps[1:], strict=False)]
    return {"decode_ms": statistics.median(inside) * 1e3, "between_ms": statistics.median(between) * 1e3,
            "between_mean_ms": statistics.mean(between) * 1e3, "between_cpu_ms": statistics.median(cpu) * 1e3,
            "between_cpu_mean_ms": statistics.mean(cpu) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="replies timed after a warm-up one, default 3")
    parser.add_argument("--threads", type=int, default=2, help="decode threads, default 2")
    parser.add_argument("--top-logprobs", type=int, default=INSPECTOR_TOP, metavar="N",
                        help=f"alternatives recorded per token, default {INSPECTOR_TOP} (the app's inspector)")
    parser.add_argument("--model", type=shared.model_arg, metavar="PATH", help=shared.MODEL_HELP)
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 1 or args.top_logprobs < 0:
        parser.error("--rounds and --threads must be >= 1, --top-logprobs >= 0")

    path, _ = bench_model(args.model)
    print(f"{cpu_model() or platform.processor()}, {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.2f}; "
          f"{path.name}, {args.threads} threads, greedy, {MAX_TOKENS} tokens, top {args.top_logprobs} recorded")
    stamps: list[Stamp] = []
    timed_decodes(stamps)
    backend = LlamaBackend(LlamaSettings(path, threads=args.threads, threads_batch=args.threads))
    loaded = backend.load().result()
    if isinstance(loaded, Error):
        sys.exit(f"cannot load {path}: {loaded.message}")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)  # as app_speed runs `run`: the rest default
    print(f"{'round':>5}  {'decode ms':>9}  {'between ms':>10}  {'mean':>6}  {'CPU ms':>6}  {'mean':>6}  {'tok/s':>6}")
    rows = []
    for index in range(args.rounds + 1):
        stamps.clear()
        request = Request([Message("user", SHORT_PROMPT)], LiveParams(params), top_logprobs=args.top_logprobs)
        done = backend.generate(request).result()
        if not isinstance(done, Done) or done.metrics.completion_tokens < MAX_TOKENS:
            sys.exit(f"the reply did not run to {MAX_TOKENS} tokens: {done}")
        if index == 0:
            continue  # the warm-up
        row = split(stamps)
        rows.append(row)
        print(f"{index:>5}  {row['decode_ms']:>9.3f}  {row['between_ms']:>10.3f}  {row['between_mean_ms']:>6.3f}  "
              f"{row['between_cpu_ms']:>6.3f}  {row['between_cpu_mean_ms']:>6.3f}  {done.metrics.decode_tok_s:>6.1f}")
    backend.close()
    medians = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    print(f"median per token: {medians['decode_ms']:.3f} ms in llama_decode, {medians['between_ms']:.3f} ms between "
          f"({medians['between_cpu_ms']:.3f} ms of the worker's CPU): the engine's share "
          f"{medians['between_ms'] / (medians['decode_ms'] + medians['between_ms']):.1%}")


if __name__ == "__main__":
    main()
