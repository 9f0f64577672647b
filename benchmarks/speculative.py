"""Speculative decoding with n-gram drafts against plain decoding, and against llama-bench's tg128, in one run.

Why: drafting pays only where the reply repeats text it has seen (a copy, an edit, a quote), and costs where it
does not (each extra row of a verification batch costs the output layer once more). This times the engine with
`draft = ngram` and `off` side by side, rounds alternating, on a copy task (a ~300-token text repeated exactly),
an edit task (the same text with one word changed throughout) and free chat (a story, under the app's default
repeat penalty: with none, the starter's greedy reply repeats the question over and over, which the drafter turns
into a copy; with it, the reply is new text, where drafting must stop and cost nothing), and llama-bench's tg128
built from the same vendored llama.cpp (benchmarks/app_speed.py builds it once) on the same threads: the mark of
one token at a time. Greedy, so each side's reply is the same every round; the copy's text is checked to be the
same with drafting on and off. It prints numbers and asserts nothing; --json prints one JSON document instead.

    python benchmarks/speculative.py [--rounds 3] [--threads N] [--draft-max N] [--draft-model PATH]
                                     [--llama-bench PATH|none] [--json]

--draft-model adds a third side: the same tasks with that model drafting (it must share the model's vocabulary).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app_speed import llama_bench_binary
from shared import alternate, bench_model, fmt, greedy_settings, median, ratio

from tui_chat.engine.base import Done, Error, Message, Request
from tui_chat.engine.local.cpu import cpu_model, read_topology
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.local.model import PREFILL_CHUNK
from tui_chat.engine.params import SPECS, LiveParams, SamplingParams

N_CTX = 4096
TEXT = (
    "The lighthouse stood at the edge of the cliff for more than two hundred years. Every night its keeper climbed "
    "the narrow stairs, trimmed the wick and polished the great glass lens until it shone. Ships passing in the dark "
    "saw the beam sweep across the water and knew that the rocks were near. In winter the storms came from the north, "
    "and the waves broke so high that spray reached the lamp room windows. The keeper wrote each storm in his "
    "logbook: the date, the wind, the height of the sea and the names of the ships that passed safely. In spring he "
    "painted the iron railings, mended the roof of the oil store and planted potatoes in the small garden behind the "
    "cottage, where the wall kept off the salt wind. Once a month a boat brought flour, oil, letters and newspapers "
    "from the town, and the keeper read every page twice before the next boat came. When the light was finally "
    "automated, the logbook was taken to the town museum, where visitors still read the careful handwriting and "
    "wonder how one person kept watch through so many long nights alone."
)
TASKS = {
    "copy": (TEXT + "\n\nRepeat the text above exactly.", 400),
    "edit": (TEXT + "\n\nRepeat the text above exactly, but write beacon instead of lighthouse.", 400),
    "chat": ("Write a long story about a dragon who learns to fly.", 256),
}
STOP = ("\n\n",)  # after the copy the starter goes on with a new paragraph: the copy alone is timed


@dataclass(frozen=True, slots=True)
class Turn:
    text: str
    tokens: int
    decode_tok_s: float | None
    drafted: int
    accepted: int
    verifications: int


def settings(task: str, max_tokens: int, draft_max: int) -> SamplingParams:
    greedy = SamplingParams(**greedy_settings(max_tokens)).with_changes(draft_max=draft_max)
    if task == "chat":
        return greedy.with_changes(repeat_penalty=SPECS["repeat_penalty"].default)
    return greedy.with_changes(stop=STOP)


def turn(backend: LlamaBackend, prompt: str, params: SamplingParams) -> Turn:
    done = backend.generate(Request([Message("user", prompt)], LiveParams(params))).result()
    if not isinstance(done, Done):
        sys.exit(f"the engine failed: {getattr(done, 'message', done)}")
    m = done.metrics
    return Turn(done.text, m.completion_tokens, m.decode_tok_s, m.drafted, m.draft_accepted, m.verifications)


def tg128(binary: Path, model: Path, threads: int) -> float:
    """llama-bench's decode rate, one token at a time, with the engine's batch sizes and flash attention."""
    done = subprocess.run([str(binary), "-m", str(model), "-p", "0", "-n", "128", "-t", str(threads),
                           "-b", str(PREFILL_CHUNK), "-ub", str(PREFILL_CHUNK), "-fa", "auto", "-r", "1", "-o", "json"],
                          capture_output=True, text=True, check=True, start_new_session=True)
    rate: float = json.loads(done.stdout)[0]["avg_ts"]
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds, default 3")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="decode threads of both sides and llama-bench (default 1: the same figures on a loaded "
                             "machine)")
    parser.add_argument("--draft-max", type=int, default=16, metavar="N", help="the longest draft, default 16")
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the starter model)")
    parser.add_argument("--draft-model", type=Path, metavar="PATH", help="also time drafting with this model")
    parser.add_argument("--llama-bench", metavar="PATH|none",
                        help="an existing llama-bench binary; none skips it (default: built once, cached)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 1 or not 1 <= args.draft_max <= 64:
        parser.error("--rounds and --threads must be >= 1, --draft-max between 1 and 64")
    log = sys.stderr if args.json else sys.stdout
    path, log_dir = bench_model(args.model)
    version = importlib.metadata.version("llama-cpp-python")
    binary = None if args.llama_bench == "none" else Path(args.llama_bench) if args.llama_bench \
        else llama_bench_binary(version)
    topology = read_topology()
    print(f"machine   {cpu_model() or platform.processor()}, {topology.physical} cores ({topology.logical} logical), "
          f"llama-cpp-python {version}, load avg {os.getloadavg()[0]:.2f}", file=log)
    print(f"model     {path}\nsettings  greedy, {args.threads} thread(s), draft_max {args.draft_max}, n_ctx {N_CTX}; "
          f"copy and edit stop at a blank line, chat has the default repeat penalty\nlogs      {log_dir}", file=log)
    backends = {}
    kinds = {"off": "off", "ngram": "ngram"} | ({"model": str(args.draft_model)} if args.draft_model else {})
    for name, kind in kinds.items():
        backends[name] = LlamaBackend(LlamaSettings(path, n_ctx=N_CTX, threads=args.threads,
                                                    threads_batch=args.threads, draft=kind))
        if isinstance(loaded := backends[name].load().result(), Error):
            sys.exit(f"cannot load {path}: {loaded.message}")
    params = {task: settings(task, n, args.draft_max) for task, (_, n) in TASKS.items()}
    sides = {f"{task} {kind}": (lambda b=backend, p=prompt, s=params[task]: turn(b, p, s))
             for task, (prompt, _) in TASKS.items() for kind, backend in backends.items()}
    for run in sides.values():
        run()  # warm-up: pages the weights in, measures plain decoding for the controller
    started = time.perf_counter()
    runs = alternate(sides | ({"tg128": lambda: tg128(binary, path, args.threads)} if binary else {}), args.rounds)
    for backend in backends.values():
        backend.close()

    tg = median(runs.get("tg128", []))
    figures: dict[str, dict[str, float | int | bool | None]] = {}
    for task in TASKS:
        off = runs[f"{task} off"]
        for kind in [name for name in kinds if name != "off"]:
            on = runs[f"{task} {kind}"]
            last = on[-1]
            figures[f"{task} {kind}"] = {
                "off_tok_s": median([t.decode_tok_s for t in off]),
                "draft_tok_s": median([t.decode_tok_s for t in on]),
                "draft/off": median([ratio(a.decode_tok_s, b.decode_tok_s) for a, b in zip(on, off, strict=True)]),
                "draft/tg128": ratio(median([t.decode_tok_s for t in on]), tg),
                "same_text": all(a.text == b.text for a, b in zip(on, off, strict=True)),
                "tokens": last.tokens, "drafted": last.drafted, "accepted": last.accepted,
                "verifications": last.verifications,
                "acceptance": ratio(last.accepted, last.drafted),
            }
    if args.json:
        print(json.dumps({"cpu": cpu_model(), "cores": topology.physical, "llama_cpp_python": version,
                          "model": str(path), "threads": args.threads, "draft_max": args.draft_max, "tg128_tok_s": tg,
                          "tasks": figures, "rounds": {name: [asdict(t) if isinstance(t, Turn) else t for t in side]
                                                       for name, side in runs.items()}}, indent=2))
        return
    print(f"\n{args.rounds} rounds in {time.perf_counter() - started:.0f} s; decode tok/s, medians; "
          f"llama-bench tg128 {fmt(tg)}")
    print(f"{'task drafter':<13}{'off':>9}{'drafting':>10}{'draft/off':>11}{'draft/tg128':>13}{'same text':>11}"
          f"{'tokens':>8}{'accepted/drafted':>18}{'verifications':>15}")
    for task, f in figures.items():
        kept = f"{f['accepted']}/{f['drafted']}"
        print(f"{task:<13}{fmt(f['off_tok_s']):>9}{fmt(f['draft_tok_s']):>10}{fmt(f['draft/off'], '.2f'):>11}"
              f"{fmt(f['draft/tg128'], '.2f'):>13}{'yes' if f['same_text'] else 'NO':>11}{f['tokens']:>8}"
              f"{kept:>18}{f['verifications']:>15}")
    print(f"targets (ngram): copy draft/off >= 1.8 (done when >= 1.5) and above tg128; chat >= 0.95; "
          f"load avg {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
