"""The sampling lab's cost per step against llama.cpp's own batched decode, on one model in one run.

Why: the lab decodes 1–4 columns over one read of the prompt, one `llama_decode` a step with a row per column.
A step of N sequences costs llama.cpp more than a step of one (the output layer is computed per sequence), so
the bar is relative: our 2-column step over our single reply's step must be at most 1.1 × the raw C API's
2-sequence step over its 1-sequence step, both measured here, in alternating rounds (medians of the per-round
ratios). The raw side is llama-cpp-python's low-level API: one context, the prompt read once into sequence 0
and shared with `llama_memory_seq_cp`, a greedy llama.cpp sampler per sequence, nothing else in the loop.
It prints numbers and asserts nothing.

    python benchmarks/lab.py [--rounds 5] [--steps 64] [--model PATH] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import llama_cpp
import shared
from shared import alternate, bench_model, fmt, greedy_settings, median, ratio

from tui_chat.engine.base import Done, Error, LabDone, Message, Request
from tui_chat.engine.compare import MAX_COLUMNS
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.local.llamacpp import FIRST_COLUMN_SEQ
from tui_chat.engine.params import LiveParams, SamplingParams

N_CTX = 4096
N_BATCH = 256
COUNTS = (1, 2, 4)
PROMPT = "Count from 1 to 1000, separated by commas."
BAR = 1.1


class Raw:
    """llama.cpp through its C API, set up as our context is (unified cache, full sliding window), with the
    prompt read once into sequence 0."""

    def __init__(self, path: Path, threads: int, prompt: str) -> None:
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(os.fsencode(path), llama_cpp.llama_model_default_params())
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = N_CTX, N_BATCH, N_BATCH
        params.n_threads = params.n_threads_batch = threads
        params.n_seq_max = FIRST_COLUMN_SEQ + MAX_COLUMNS
        params.kv_unified = params.swa_full = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self.samplers = [llama_cpp.llama_sampler_init_greedy() for _ in range(max(COUNTS))]
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        data = prompt.encode()
        buffer = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, len(buffer), True, True)
        self.prompt = list(buffer[:count])
        self._decode([(token, i, 0) for i, token in enumerate(self.prompt[:-1])])

    def _decode(self, rows: list[tuple[int, int, int]]) -> None:
        batch = self.batch
        batch.n_tokens = len(rows)
        for i, (token, position, seq) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, position, 1, 1
            batch.seq_id[i][0] = seq
        if llama_cpp.llama_decode(self.ctx, batch) != 0:
            sys.exit("the raw side's llama_decode failed")

    def ms_per_step(self, n: int, steps: int) -> float:
        """`n` sequences from the prompt, greedy, `steps` decodes of one token each."""
        last = len(self.prompt) - 1
        for seq in range(max(COUNTS)):
            llama_cpp.llama_memory_seq_rm(self.memory, seq, last if seq == 0 else -1, -1)
        self._decode([(self.prompt[-1], last, 0)])
        for seq in range(1, n):
            llama_cpp.llama_memory_seq_cp(self.memory, 0, seq, -1, -1)
        tokens = [llama_cpp.llama_sampler_sample(self.samplers[seq], self.ctx, -1) for seq in range(n)]
        started = time.perf_counter()
        for step in range(steps):
            self._decode([(token, last + 1 + step, seq) for seq, token in enumerate(tokens)])
            tokens = [llama_cpp.llama_sampler_sample(self.samplers[seq], self.ctx, seq) for seq in range(n)]
        return (time.perf_counter() - started) * 1000 / steps

    def close(self) -> None:
        for sampler in self.samplers:
            llama_cpp.llama_sampler_free(sampler)
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def ours_single(backend: LlamaBackend, params: SamplingParams) -> float | None:
    """Our plain reply's ms per step: its decode time over the steps after its first token."""
    final = backend.generate(Request([Message("user", PROMPT)], LiveParams(params))).result()
    if not isinstance(final, Done):
        sys.exit(f"our engine failed: {final}")
    return _step_ms(final)


def ours_lab(backend: LlamaBackend, params: SamplingParams, n: int) -> float | None:
    """Our lab's ms per step with `n` greedy columns: they step together, so one column's time is the step's."""
    stream = backend.compare(Request([Message("user", PROMPT)], LiveParams(params)),
                             [LiveParams(params) for _ in range(n)])
    final = stream.result()
    if not isinstance(final, LabDone):
        sys.exit(f"our lab failed: {final}")
    return _step_ms(final.columns[0])


def _step_ms(done: Done) -> float | None:
    steps = done.metrics.completion_tokens - 1
    return done.metrics.decode_s * 1000 / steps if steps > 0 and done.metrics.decode_s > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds, default 5")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per run, default 64")
    parser.add_argument("--model", type=shared.model_arg, metavar="PATH", help=shared.MODEL_HELP)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads on both sides")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    args = parser.parse_args()
    path, _ = bench_model(args.model)
    log = sys.stderr if args.json else sys.stdout
    print(f"model {path.name}, llama_cpp {llama_cpp.__version__}, {args.threads} threads, {args.steps} steps, "
          f"load avg {os.getloadavg()[0]:.2f}", file=log)
    params = SamplingParams(**greedy_settings(args.steps + 1))
    backend = LlamaBackend(LlamaSettings(path, n_ctx=N_CTX, threads=args.threads, threads_batch=args.threads))
    if isinstance(loaded := backend.load().result(), Error):
        sys.exit(f"our engine could not load {path.name}: {loaded}")
    raw = Raw(path, args.threads, PROMPT)
    try:
        sides = {f"raw {n}": (lambda n=n: raw.ms_per_step(n, args.steps)) for n in COUNTS}
        sides["ours single"] = lambda: ours_single(backend, params)
        sides |= {f"ours {n}": (lambda n=n: ours_lab(backend, params, n)) for n in COUNTS}
        for run in sides.values():  # warm-up, not counted
            run()
        runs = alternate(sides, args.rounds)
    finally:
        raw.close()
        backend.close()
    report(runs, args)


def per_round(runs: dict[str, list[float | None]], top: str, bottom: str) -> float | None:
    """The median of the rounds' own ratios: a round that load hit moves both sides of it."""
    return median([ratio(a, b) for a, b in zip(runs[top], runs[bottom], strict=True)])


def report(runs: dict[str, list[float | None]], args: argparse.Namespace) -> None:
    raw_ratios = {n: per_round(runs, f"raw {n}", "raw 1") for n in COUNTS}
    ours_ratios = {n: per_round(runs, f"ours {n}", "ours single") for n in COUNTS}
    column_ratios = {n: per_round(runs, f"ours {n}", "ours 1") for n in COUNTS}
    bar = ratio(ours_ratios[2], raw_ratios[2])
    if args.json:
        print(json.dumps({"threads": args.threads, "steps": args.steps, "rounds": runs,
                          "medians_ms": {name: median(values) for name, values in runs.items()},
                          "raw_ratio": raw_ratios, "ours_ratio_to_single": ours_ratios,
                          "ours_ratio_to_one_column": column_ratios, "two_columns_over_raw": bar, "bar": BAR},
                         indent=2))
        return
    print("\nms per step, each round; " + ", ".join(runs))
    for i in range(args.rounds):
        print(f"{i + 1:>5}  " + "  ".join(f"{fmt(runs[name][i], '.2f'):>11}" for name in runs))
    print(f"{'median':>5}  " + "  ".join(f"{fmt(median(runs[name]), '.2f'):>11}" for name in runs))
    print("\nstep cost against one sequence (median of per-round ratios)")
    for n in COUNTS:
        print(f"  {n} sequences: raw {fmt(raw_ratios[n], '.3f')} × · ours {fmt(ours_ratios[n], '.3f')} × our single "
              f"reply, {fmt(column_ratios[n], '.3f')} × one column")
    print(f"\nours 2 columns / raw 2 sequences: {fmt(bar, '.3f')}   bar <= {BAR} "
          f"({'met' if bar is not None and bar <= BAR else 'NOT met'})")
    print(f"two replies one after the other would cost 2.000 ×; four, 4.000 × (ours 4 columns: "
          f"{fmt(ours_ratios[4], '.3f')} ×)")


if __name__ == "__main__":
    main()
