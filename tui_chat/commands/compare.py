"""`tui-chat run --compare`: the sampling lab without the UI. One prompt, answered once for each of several
sampling settings, decoded together over one read of the prompt; the columns print one after another with
their figures, or as one JSON report."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from ..engine.base import Comparing, EngineError, Error, LabDone, Message, Stream
from ..engine.compare import MAX_COLUMNS
from ..engine.formats import OutputFormat
from ..engine.params import InvalidParameter, SamplingParams
from ..lab import Column, Lab
from ..replies import Refused, SideBySide, Started
from ..safetext import quoted
from ..wording import INCOMPLETE_LABEL, stop_label
from ..workspace import Workspace
from .common import INTERRUPTED, RUNTIME_ERROR, fail, writer

_NOT_WITH = {"save": "--save", "continue_id": "--continue", "mcp": "--mcp", "xray": "--xray",
             "no_stream": "--no-stream"}


def lab_columns(args: argparse.Namespace, params: SamplingParams) -> list[Column]:
    """The columns of `--compare`, each over the run's settings; a mistake is the user's (exit 2) before any load."""
    if not 1 <= len(args.compare) <= MAX_COLUMNS:
        raise InvalidParameter(f"--compare takes 1 to {MAX_COLUMNS} settings (got {len(args.compare)})")
    if len(args.prompt) > 1:
        raise InvalidParameter("--compare answers one --prompt: which column would the next turn follow?")
    if given := [flag for name, flag in _NOT_WITH.items() if getattr(args, name)]:
        raise InvalidParameter(f"--compare does not go with {', '.join(given)}")
    return [Column.parsed(text, params) for text in args.compare]


def run_lab(workspace: Workspace, args: argparse.Namespace, model: str | None, columns: list[Column],
            output: OutputFormat, out: TextIO = sys.stdout) -> int:
    backend = workspace.load_now(model)
    try:
        if not isinstance(backend, Comparing):
            raise InvalidParameter("--compare: this model's backend has no sampling lab")
        session = workspace.new_chat(columns[0].live, output_format=output,
                                     **({} if args.system is None else {"system_prompt": args.system}))
        if args.thinking is not None:
            session.set_thinking(args.thinking == "on")
        lab = Lab(columns)
        prompt = args.prompt[0]
        request = lab.request([*session.messages(), Message("user", prompt)], top_logprobs=args.top_logprobs,
                              output=output, thinking=session.thinking)
        outcome = workspace.start_reply(SideBySide(request, [column.live for column in columns]))
        if not isinstance(outcome, Started):
            raise EngineError(outcome.reason if isinstance(outcome, Refused) else "the model is still loading")
        _drain(lab, outcome.stream)
        if isinstance(lab.ended, Error) or lab.ended is None:
            return fail(EngineError(lab.ended.message if lab.ended else "the lab ended without a word"),
                        RUNTIME_ERROR)
        if args.json:
            info = backend.info
            assert info is not None, "a loaded backend knows its model"
            report = {"model": info.name, "model_path": info.path, "backend": info.backend,
                      "gpu_layers": info.gpu_layers, "turns": [_turn(lab, prompt)]}
            writer(out)(json.dumps(report, indent=2) + "\n")
        else:
            _print(lab, writer(out))
        cancelled = any(done.stop_reason == "cancelled" for done in lab.ended.columns)
        return INTERRUPTED if cancelled else 0
    finally:
        backend.close()


def _drain(lab: Lab, stream: Stream) -> None:
    """Every event into the lab; Ctrl+C stops the columns, and what they wrote stays."""
    try:
        for event in stream:
            lab.take([event])
    except KeyboardInterrupt:
        stream.cancel()
        for event in stream:
            lab.take([event])


def _turn(lab: Lab, prompt: str) -> dict[str, Any]:
    """The prompt's figures once (it was read once), then each column's."""
    assert lab.ended is not None and not isinstance(lab.ended, Error)
    metrics = lab.ended.columns[0].metrics
    return {"prompt": prompt, "prompt_tokens": metrics.prompt_tokens, "cached_tokens": metrics.cached_tokens,
            "prefill_s": metrics.prefill_s, "prefill_tok_s": metrics.prefill_tok_s,
            "prompt_reads": lab.ended.prompt_reads, "n_ctx": metrics.n_ctx, "parallel": lab.ended.parallel,
            "note": lab.ended.note or None,
            "columns": [lab.report(index) for index in range(len(lab.columns))]}


def _print(lab: Lab, write: Callable[[str], None]) -> None:
    """Each column: a header with its settings, its text, and a line of its figures; then what the server did
    with the columns, where it did not decode them together."""
    for index, column in enumerate(lab.columns):
        report = lab.report(index)
        write(f"── column {index + 1}: {column.label} ──\n{column.text.strip()}\n")
        figures = [f"{report['completion_tokens']} tokens"]
        if report["decode_tok_s"]:
            figures.append(f"{report['decode_tok_s']:.1f} tok/s")
        figures.append(stop_label(report["stop_reason"], report["stop_sequence"] or ""))
        if report["incomplete"]:
            figures.append(INCOMPLETE_LABEL)
        if report["mean_surprise"] is not None:
            figures.append(f"surprise {report['mean_surprise']:.2f}")
        found = lab.divergence(index)
        if found is not None:
            figures.append(f"diverged from column 1 at token {found.position + 1}: "
                           f"{quoted(found.token.piece)} {_prob(found.token.prob)} where column 1 drew "
                           f"{quoted(found.first.piece)} {_prob(found.first.prob)}")
        elif index:
            figures.append("same tokens as column 1")
        write(f"({' · '.join(figures)})\n" + ("\n" if index < len(lab.columns) - 1 else ""))
    if isinstance(lab.ended, LabDone) and lab.ended.note:
        write(f"\n{lab.ended.note}\n")


def _prob(prob: float | None) -> str:
    return "" if prob is None else f"p={prob:.3f}"
