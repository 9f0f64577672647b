"""Structured output on real JSON schemas: coverage per split and the mask's cost per token.

Why: a format's guarantee (a reply that ends unflagged validates) must hold on schemas people write, and
the mask must cost microseconds. Each schema of --schemas (by default data/jsonschemabench_sample.jsonl,
a fixed-seed sample of JSONSchemaBench, see data/README.md; or a folder with one folder per split and one
`.json` file per schema) is given to the starter model greedily (at most the app's default max tokens,
1024); the reply is checked with jsonschema and counted as

- compliant: it ended unflagged and validates;
- refused: the schema was refused before decoding, in one line;
- incomplete: it was flagged (max tokens, or a finished reply that broke what was checked afterwards);
- violated: it ended unflagged and does not validate (the guarantee broken: must stay 0);
- crashed: the reply ended with an error.

Per split, as the JSONSchemaBench paper's table: `enforced` (compiled with nothing left to check afterwards
nor a length bound left out: the declared coverage, enforced / schemas) and `valid` (compliant / schemas:
the empirical coverage). Decode under a schema against free text: each schema's prompt is also decoded
with no format, in the same run, the two alternating which goes first; the ratio is the decode rate under
the schema's grammar over the free one (tokens over decode time, summed over the schemas).

The mask's cost: each reply's tokens replayed through a fresh matcher, the whole vocabulary's mask timed
at every position (mean and p99).

    python benchmarks/schemas.py [--schemas FILE.jsonl|DIR] [--split S] [--limit N] [--model PATH]
                                 [--max-tokens N] [--no-free] [--compact] [--json]
                                 [--kubernetes N [--kubernetes-version v1.29.0-local-strict]]

`--limit N` takes the first N schemas of each split (the fixture's order is the draw's), `--split S` one
split; `--no-free` skips the free decodes (half the time, no rate ratio); `--compact` writes the JSON on one line
(`, ` and `: ` between items, no other blank) instead of the app's (one space, or a newline and an indent), to
measure how many replies the blanks take to max tokens. `--kubernetes N` runs instead
the held-out split: N schemas kept out of the repo, from kubernetes-validate's package (k8s_schemas.py;
`pip install kubernetes-validate`). Beside each split it prints the paper's coverage (arXiv 2501.10868)
where this project has it.
It prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from k8s_schemas import VERSION, held_out
from llguidance import LLTokenizer
from llguidance.numpy import allocate_token_bitmask
from shared import bench_model, greedy_settings

from tui_chat.engine.base import Done, Message, Request, Token
from tui_chat.engine.formats import TEXT, FormatError, json_schema
from tui_chat.engine.local import grammar
from tui_chat.engine.local.grammar import compile_format, mask_of, new_matcher, tokenizer_for
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import SPECS, LiveParams, SamplingParams
from tui_chat.engine.schema import violation

OUTCOMES = ("compliant", "refused", "incomplete", "violated", "crashed")
PROMPT_CHARS = 6000  # the schema as the prompt shows it, cut to fit the context
SAMPLE = Path(__file__).parent / "data" / "jsonschemabench_sample.jsonl"
# The paper's empirical coverage (arXiv 2501.10868) as quoted in issue 27 and the team notes: every engine
# above 0.86 on GlaiveAI; GitHub-hard as below. Other splits are left out until read from the paper itself.
PAPER = {"Github_hard": {"Guidance": 0.41, "llama.cpp": 0.39, "XGrammar": 0.28, "Outlines": 0.03}}
PAPER_NOTE = "paper (arXiv 2501.10868): every engine > 0.86 on Glaiveai2K"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemas", type=Path, default=SAMPLE)
    parser.add_argument("--split")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--max-tokens", type=int, default=SPECS["max_tokens"].default)  # the app's own
    parser.add_argument("--no-free", action="store_true")
    parser.add_argument("--compact", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubernetes", type=int, metavar="N")
    parser.add_argument("--kubernetes-version", default=VERSION)
    args = parser.parse_args()
    if args.kubernetes:
        schemas, source = held_out(args.kubernetes, args.kubernetes_version)
    else:
        schemas, source = _schemas(args.schemas, args.split, args.limit), str(args.schemas)
    if args.compact:
        grammar.JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    model, _ = bench_model(args.model)
    backend = LlamaBackend(LlamaSettings(model, n_ctx=4096, chat_template="gemma"))
    backend.load().result()
    params = SamplingParams(**greedy_settings(args.max_tokens))
    session = backend.session
    assert session is not None, "loaded above"
    tokenizer = tokenizer_for(session)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    masks: list[float] = []
    notes: list[dict[str, str]] = []
    rates = {"schema": [0, 0.0], "free": [0, 0.0]}  # decode steps, decode seconds
    for index, (split, name, text) in enumerate(schemas):
        try:
            output = json_schema(text)
            unchecked = backend.check_format(output)
        except FormatError as error:
            counts[split]["refused"] += 1
            notes.append({"schema": f"{split}/{name}", "outcome": "refused", "why": str(error)})
            continue
        counts[split]["enforced"] += not unchecked
        prompt = f"Reply with one JSON object that follows this JSON schema:\n{text[:PROMPT_CHARS]}"
        runs = [("schema", output)] + ([] if args.no_free else [("free", TEXT)])
        for kind, shape in runs[:: -1 if index % 2 else 1]:
            request = Request([Message("user", prompt)], LiveParams(params), format=shape)
            ids, done = _decode(backend, request)
            if isinstance(done, Done) and done.metrics.decode_tok_s:
                rates[kind][0] += done.metrics.completion_tokens - 1
                rates[kind][1] += done.metrics.decode_s
            if kind == "schema":
                tokens, final = ids, done
        outcome = _outcome(final, json.loads(output.source))
        counts[split][outcome] += 1
        if outcome != "compliant":
            why = final.note if isinstance(final, Done) else getattr(final, "message", "")
            notes.append({"schema": f"{split}/{name}", "outcome": outcome, "why": why})
        masks += _mask_times(tokenizer, compile_format(tokenizer, output).grammar, tokens)
    backend.close()
    report = _report(counts, masks, notes, rates) | {"source": source, "whitespace": "compact" if args.compact
                                                      else "one space, or a newline and an indent"}
    print(json.dumps(report, indent=2) if args.json else _table(report))


def _schemas(source: Path, split: str | None, limit: int | None) -> list[tuple[str, str, str]]:
    """(split, name, schema text) in the sample's order: a .jsonl of {"split", "id", "schema"} or a folder
    of split folders of .json files; `limit` per split."""
    if source.is_dir():
        found = [(p.parent.name, p.name, p.read_text(encoding="utf-8")) for p in sorted(source.glob("*/*.json"))]
    else:
        rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
        found = [(row["split"], row["id"], json.dumps(row["schema"])) for row in rows]
    taken: Counter[str] = Counter()
    chosen = []
    for entry in found:
        if (split is None or entry[0] == split) and (limit is None or taken[entry[0]] < limit):
            taken[entry[0]] += 1
            chosen.append(entry)
    return chosen


def _decode(backend: LlamaBackend, request: Request) -> tuple[list[int], object]:
    """A reply's token ids and its final event."""
    tokens, final = [], None
    for event in backend.generate(request):
        if isinstance(event, Token):
            tokens.append(event.token_id)
        final = event
    return tokens, final


def _outcome(final: object, schema: dict) -> str:
    if not isinstance(final, Done):
        return "crashed"
    if final.incomplete:
        return "incomplete"
    return "violated" if violation(schema, final.text) else "compliant"


def _mask_times(tokenizer: LLTokenizer, grammar: str, tokens: list[int]) -> list[float]:
    """The whole vocabulary's mask timed at each position of a reply, in seconds."""
    matcher = new_matcher(tokenizer, grammar)
    bitmask = allocate_token_bitmask(1, tokenizer.vocab_size)
    times = []
    for token in tokens:
        started = time.perf_counter()
        mask_of(matcher, bitmask, tokenizer.vocab_size)
        times.append(time.perf_counter() - started)
        if not matcher.consume_token(token):
            break
    return times


def _report(counts: dict[str, Counter[str]], masks: list[float], notes: list[dict[str, str]],
            rates: dict[str, list]) -> dict:
    splits = {split: _row(c) | {"paper": PAPER.get(split)} for split, c in sorted(counts.items())}
    mask = {"positions": len(masks), "mean_us": float(np.mean(masks)) * 1e6 if masks else None,
            "p99_us": float(np.percentile(masks, 99)) * 1e6 if masks else None}
    tok_s = {kind: steps / seconds if seconds else None for kind, (steps, seconds) in rates.items()}
    decode = {"schema_tok_s": tok_s["schema"], "free_tok_s": tok_s["free"],
              "ratio": tok_s["schema"] / tok_s["free"] if tok_s["schema"] and tok_s["free"] else None}
    return {"splits": splits, "all": _row(sum(counts.values(), Counter())), "mask": mask, "decode": decode,
            "not_compliant": notes, "paper_note": PAPER_NOTE}


def _row(c: Counter[str]) -> dict:
    schemas = sum(c[o] for o in OUTCOMES)
    return {o: c[o] for o in OUTCOMES} | {"schemas": schemas, "enforced": c["enforced"],
                                         "declared": c["enforced"] / max(1, schemas),
                                         "coverage": c["compliant"] / max(1, schemas)}


def _table(report: dict) -> str:
    width = max([16, *(len(split) + 1 for split in report["splits"])])  # "Kubernetes (held out)" is longer
    lines = [f"{'split':<{width}}" + "".join(f"{o:>11}" for o in OUTCOMES) + f"{'enforced':>10}{'valid':>8}"]
    for split, row in [*report["splits"].items(), ("all", report["all"])]:
        paper = ", ".join(f"{engine} {value:.2f}" for engine, value in (row.get("paper") or {}).items())
        lines.append(f"{split:<{width}}" + "".join(f"{row[o]:>11}" for o in OUTCOMES) + f"{row['declared']:>10.2f}"
                     + f"{row['coverage']:>8.2f}" + (f"   paper: {paper}" if paper else ""))
    lines += [report["paper_note"], f"schemas: {report['source']} · whitespace: {report['whitespace']}"]
    decode = report["decode"]
    if decode["ratio"]:
        lines.append(f"decode under the schema {decode['schema_tok_s']:.1f} tok/s, free {decode['free_tok_s']:.1f} "
                     f"tok/s: {decode['ratio']:.2f} x")
    mask = report["mask"]
    if mask["positions"]:
        lines.append(f"mask over the vocabulary: {mask['mean_us']:.0f} µs mean, {mask['p99_us']:.0f} µs p99 "
                     f"({mask['positions']} positions)")
    lines += [f"  {n['schema']}: {n['outcome']}: {n['why']}" for n in report["not_compliant"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
