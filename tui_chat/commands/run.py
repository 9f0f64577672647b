"""`tui-chat run`: one conversation without the UI, for scripts, benchmarks and CI.

It drives the same `ChatSession` as the chat screen: each `--prompt` is a turn, saved as it streams
with `--save`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TextIO

from ..config import Config, history_path, log_dir
from ..engine.base import Backend, Done, EngineError, Error, Token
from ..engine.context import left_out
from ..engine.params import MAX_TOP_LOGPROBS, PARAMS, InvalidParameter, LiveParams, check_top_logprobs
from ..guard import watch
from ..pricing import find_preset
from ..session import ChatSession
from .common import INTERRUPTED, RUNTIME_ERROR, add_model_options, opener_for, writer


def add_parser(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="answer prompts without the UI (tokens stream to stdout)",
                              description="Answer prompts without the UI: each --prompt is a turn of one "
                                          "conversation; tokens stream to stdout.")
    add_model_options(run)
    run.add_argument("--prompt", "-p", action="append", required=True, help="a user turn; repeat for more turns")
    run.add_argument("--system", help="system prompt (default: system_prompt in the config)")
    for spec in PARAMS:
        run.add_argument(f"--{spec.name.replace('_', '-')}", type=spec.kind, metavar="N", help=spec.hint)
    run.add_argument("--stop", action="append", metavar="STR", help="stop sequence (repeatable); not shown")
    run.add_argument("--thinking", choices=("on", "off"),
                     help="let a reasoning model think before it answers (default: thinking in the config)")
    run.add_argument("--top-logprobs", type=int, default=0, metavar="N",
                     help=f"with --json: each token's probability and the N likeliest (at most {MAX_TOP_LOGPROBS})")
    run.add_argument("--json", action="store_true", help="print one JSON report at the end instead of the text")
    run.add_argument("--save", action="store_true", help="keep the conversation in the history")
    run.set_defaults(run=run_command)


def run_command(args: argparse.Namespace, config: Config) -> int:
    if any(not prompt.strip() for prompt in args.prompt):
        raise InvalidParameter("--prompt must not be empty: give the text of a user turn")
    given = {spec.name: getattr(args, spec.name) for spec in PARAMS if getattr(args, spec.name) is not None}
    if args.stop:
        given["stop"] = args.stop
    params = config.sampling.with_changes(**given)
    check_top_logprobs(args.top_logprobs)
    opener, model = opener_for(config, args)
    if args.watched:
        watch(log_dir())
    backend = opener(model)
    try:
        loaded = backend.load().result()
        if isinstance(loaded, Error):
            raise EngineError(loaded.message)
        saving = _saving(config) if args.save else None
        system = config.system_prompt if args.system is None else args.system
        session = ChatSession(LiveParams(params), saving=saving, system_prompt=system, model=backend.info.name,
                              top_logprobs=args.top_logprobs, warn=_warn,
                              thinking=config.thinking if args.thinking is None else args.thinking == "on")
        try:
            return run_conversation(backend, session, args.prompt, as_json=args.json)
        except EngineError as error:
            print(f"tui-chat: error: {error}", file=sys.stderr)
            return RUNTIME_ERROR
        finally:
            if saving is not None:
                saving.history.close()
    finally:
        backend.close()


def run_conversation(backend: Backend, session: ChatSession, prompts: list[str], *, as_json: bool,
                     out: TextIO = sys.stdout) -> int:
    """Answer each prompt in turn; returns the process exit status."""
    write = writer(out)
    turns: list[dict] = []
    for index, prompt in enumerate(prompts):
        session.ask(prompt, backend.generate)
        if index == 0 and session.conversation_id is not None:
            print(f"tui-chat: saving as conversation {session.conversation_id}", file=sys.stderr)
        done, tokens = _stream_turn(session, write, as_json)
        if done.metrics.dropped_turns:
            print(f"tui-chat: note: {left_out(done.metrics.dropped_turns)} to fit the "
                  f"{done.metrics.n_ctx}-token context", file=sys.stderr)
        if not as_json:
            write("\n\n" if index < len(prompts) - 1 else "\n")
        turns.append(_turn_report(prompt, done, tokens, session.top_logprobs))
        if done.stop_reason == "cancelled":
            break
    if as_json:
        info = backend.info
        report = {"model": info.name, "model_path": info.path, "backend": info.backend,
                  "gpu_layers": info.gpu_layers, "params": session.live.snapshot()[1].as_dict(), "turns": turns}
        write(json.dumps(report, indent=2) + "\n")
    return INTERRUPTED if turns and turns[-1]["stop_reason"] == "cancelled" else 0


def _stream_turn(session: ChatSession, write: Callable[[str], None], as_json: bool) -> tuple[Done, list[dict]]:
    """One reply as it streams: the text to stdout (without the whitespace around it), Ctrl+C stops it.
    A reply the engine gave up on is an EngineError, after what arrived of it."""
    stream = session.writing.stream
    shown, tokens, ending = "", [], None
    try:
        for event in stream:
            if isinstance(event, Token) and session.top_logprobs:
                tokens.append(_token_entry(event))
            update = session.take([event])
            if not as_json and update.text:
                shown = _show(write, shown, update.text)
            ending = update.ending or ending
    except KeyboardInterrupt:
        stream.cancel()
        ending = session.take([stream.result()]).ending
    if ending.done is None:
        if shown and not as_json:
            write("\n")  # the part of the reply that arrived stays, on its own line
        raise EngineError(ending.message)
    if not as_json:
        _show(write, shown, ending.done.text[len(shown):] if ending.done.text.startswith(shown) else "")
    return ending.done, tokens


def _turn_report(prompt: str, done: Done, tokens: list[dict], top_logprobs: int) -> dict:
    """`text` is the reply exactly as it entered the conversation (a script rebuilding the chat from it gets
    the same prompt); `reasoning` the thinking before it."""
    turn = {"prompt": prompt, "text": done.text, "reasoning": done.reasoning, "stop_reason": done.stop_reason,
            **done.metrics.as_dict()}
    if top_logprobs:
        turn |= {"prompt_ids": list(done.prompt_ids), "tokens": tokens}
    return turn


def _token_entry(token: Token) -> dict:
    """Probabilities under the model's raw distribution, so a turn can be replayed elsewhere."""
    return {
        "token": token.piece,
        "id": token.token_id,
        "prob": token.prob,
        "top": [{"token": c.text, "id": c.token_id, "prob": c.prob} for c in token.top],
    }


def _show(write: Callable[[str], None], shown: str, text: str) -> str:
    """Print `text` without the whitespace around the reply (trailing space waits for what follows it).

    Returns all the text seen so far.
    """
    seen = shown + text
    write(seen.strip()[len(shown.strip()) :])
    return seen


def _saving(config: Config):
    from ..history import History
    from ..recording import Saving

    return Saving(History(history_path()), find_preset(config.prices, config.price))


def _warn(message: str) -> None:
    print(f"tui-chat: warning: {message}", file=sys.stderr)
