"""What the sampler X-ray and output formats cost, measured as ratios inside one run.

Why: the X-ray must cost nothing per token while closed (decode >= 0.98 x the engine before it) and
open in < 100 ms; an output format must not halve the speed (a JSON schema >= 0.85 x free text).
Ratios of rounds taken side by side survive a machine whose load drifts; absolute tok/s do not.

- decode: this tree's engine against the engine at --baseline (a git ref, extracted into a temporary
  package and loaded beside it), greedy and with the default sampling chain, X-ray closed; and with
  each token's stages recorded (`run --xray`) against closed, on both sides;
- the X-ray and word probabilities: time to open them at each position of a reply;
- formats: greedy decode under JSON and under a JSON schema against free text, same prompt and engine
  (the starter model in its own turn format, where "Respond in JSON" reads as a request).

    python benchmarks/sampling.py [--rounds 7] [--max-tokens 256] [--model PATH] [--baseline main]
                                  [--chat-template NAME] [--only decode|formats]

It prints numbers and asserts nothing. Rates are the engine's own (Done.metrics.decode_tok_s).
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import llama_cpp
import shared
from shared import alternate, bench_model, greedy_settings

from tui_chat.engine.base import Message, PromptProgress, Request, Token
from tui_chat.engine.formats import TEXT, choose, json_schema
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.probe import position_context

REPO = Path(__file__).resolve().parent.parent
N_CTX = 4096
STORY = "Write a long story about a dragon who learns to fly."
JSON_PROMPT = ("Respond in JSON: a long story about a dragon who learns to fly, as a title and chapters, "
               "each with a name and a summary.")
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "chapters": {"type": "array", "minItems": 6, "maxItems": 10, "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "summary": {"type": "string"}},
            "required": ["name", "summary"], "additionalProperties": False}},
    },
    "required": ["title", "chapters"],
    "additionalProperties": False,
}


def load_baseline(ref: str):
    """The engine as it is at `ref`, as package `tui_chat_baseline` (its imports are relative)."""
    root = Path(tempfile.mkdtemp(prefix="tui-chat-baseline-"))
    archive = subprocess.run(["git", "archive", ref, "tui_chat"], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    (root / "tui_chat").rename(root / "tui_chat_baseline")
    sys.path.insert(0, str(root))
    local = "engine.local" if (root / "tui_chat_baseline" / "engine" / "local").is_dir() else "engine"  # an older ref
    importlib.import_module(f"tui_chat_baseline.{local}.logs").install(root / "logs")
    return importlib.import_module(f"tui_chat_baseline.{local}.llama")


def decode_rate(backend, package, prompt: str, params: dict, **request) -> tuple[float, int]:
    """Engine-side decode tok/s and token count of one reply; `package` supplies the request classes."""
    base = importlib.import_module(f"{package}.engine.base")
    live = importlib.import_module(f"{package}.engine.params")
    done = backend.generate(base.Request([base.Message("user", prompt)],
                                         live.LiveParams(live.SamplingParams(**params)), **request)).result()
    if type(done).__name__ != "Done":
        sys.exit(f"generation failed: {done}")
    return done.metrics.decode_tok_s or 0.0, done.metrics.completion_tokens


def report(title: str, runs: dict[str, list[tuple[float, int]]], pairs: list[tuple[str, str]], target: float) -> None:
    print(f"\n== {title}")
    for name, values in runs.items():
        rates = [rate for rate, _ in values]
        print(f"{name:>24}  median {statistics.median(rates):6.1f} tok/s  "
              f"({', '.join(f'{r:.1f}' for r in rates)}; tokens {', '.join(str(n) for _, n in values)})")
    for top, bottom in pairs:
        ratios = [a[0] / b[0] for a, b in zip(runs[top], runs[bottom], strict=True) if b[0]]
        print(f"{top} / {bottom}: median of per-round ratios {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})   target >= {target}")


def bench_decode(path: Path, args: argparse.Namespace) -> None:
    baseline = load_baseline(args.baseline)
    theirs = baseline.LlamaBackend(baseline.LlamaSettings(path, n_ctx=N_CTX))
    ours = LlamaBackend(LlamaSettings(path, n_ctx=N_CTX))
    for backend in (theirs, ours):
        backend.load().result()
    greedy = greedy_settings(args.max_tokens)
    sampled = {"seed": 1, "max_tokens": args.max_tokens}
    sides = {
        f"{args.baseline} greedy": lambda: decode_rate(theirs, "tui_chat_baseline", STORY, greedy),
        "ours greedy": lambda: decode_rate(ours, "tui_chat", STORY, greedy),
        f"{args.baseline} sampled": lambda: decode_rate(theirs, "tui_chat_baseline", STORY, sampled),
        "ours sampled": lambda: decode_rate(ours, "tui_chat", STORY, sampled),
        f"{args.baseline} sampled, --xray": lambda: decode_rate(theirs, "tui_chat_baseline", STORY, sampled, xray=True),
        "ours sampled, --xray": lambda: decode_rate(ours, "tui_chat", STORY, sampled, xray=True),
    }
    runs = alternate(sides, args.rounds)
    report(f"Decode, X-ray closed (and run --xray's stages per token): this tree against {args.baseline}, "
           f"{args.rounds} rounds", runs,
           [("ours greedy", f"{args.baseline} greedy"), ("ours sampled", f"{args.baseline} sampled"),
            ("ours sampled, --xray", "ours sampled"), (f"{args.baseline} sampled, --xray", f"{args.baseline} sampled")],
           0.98)
    theirs.close()
    bench_xray(ours)
    ours.close()


def bench_xray(backend: LlamaBackend) -> None:
    """Time to open the X-ray, and to ask a word's probability, at each position of a sampled reply."""
    params = SamplingParams(seed=4, max_tokens=32)
    live = LiveParams(params)
    tokens, prompt_ids = [], ()
    for event in backend.generate(Request([Message("user", STORY)], live)):
        if isinstance(event, PromptProgress) and event.prompt_ids:
            prompt_ids = event.prompt_ids
        elif isinstance(event, Token):
            tokens.append(event)
    xray_ms, word_ms = [], []
    for index, token in enumerate(tokens):
        context = position_context(prompt_ids, tokens, index)
        xray_ms.append(backend.xray(context, token.token_id, params).result().elapsed_s * 1000)
        started = time.perf_counter()
        backend.word_probability(context, " dragon flew").result()
        word_ms.append((time.perf_counter() - started) * 1000)
    print(f"\n== X-ray on demand over {len(tokens)} positions (context {len(prompt_ids)}+ tokens)")
    print(f"open X-ray: median {statistics.median(xray_ms):.1f} ms, max {max(xray_ms):.1f} ms   target < 100")
    print(f"probability of a two-token phrase: median {statistics.median(word_ms):.1f} ms, max {max(word_ms):.1f} ms")


def bench_formats(path: Path, args: argparse.Namespace) -> None:
    backend = LlamaBackend(LlamaSettings(path, n_ctx=N_CTX, chat_template=args.chat_template))
    backend.load().result()
    greedy = greedy_settings(args.max_tokens)
    outputs = {"free text": TEXT, "JSON": choose("json"), "JSON schema": json_schema(json.dumps(SCHEMA))}
    sides = {name: (lambda output=output: decode_rate(backend, "tui_chat", JSON_PROMPT, greedy, format=output))
             for name, output in outputs.items()}
    runs = alternate(sides, args.rounds)
    report(f"Output formats, greedy, chat template {args.chat_template}, {args.rounds} rounds", runs,
           [("JSON", "free text"), ("JSON schema", "free text")], 0.85)
    done = backend.generate(Request([Message("user", JSON_PROMPT)], LiveParams(SamplingParams(**greedy)),
                                    format=outputs["JSON schema"])).result()
    print(f"grammar cost under the schema: {done.metrics.grammar_ms_per_token:.2f} ms per token; "
          f"reply starts {done.text[:60]!r}")
    backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds, default 7")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per reply, default 256")
    parser.add_argument("--model", type=shared.model_arg, metavar="PATH", help=shared.MODEL_HELP)
    parser.add_argument("--baseline", default="main", help="git ref of the engine to compare with, default main")
    parser.add_argument("--chat-template", help="for the formats (default: gemma for the starter model, else auto)")
    parser.add_argument("--only", choices=("decode", "formats"), help="run one part")
    args = parser.parse_args()
    args.chat_template = args.chat_template or ("auto" if args.model else "gemma")
    path, _ = bench_model(args.model)
    print(f"model {path.name}, llama_cpp {llama_cpp.__version__}, {os.cpu_count()} CPUs, "
          f"load avg {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    if args.only != "formats":
        bench_decode(path, args)
    if args.only != "decode":
        bench_formats(path, args)
    print(f"\nfinished in {time.perf_counter() - started:.0f} s, load avg {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
