"""`tui-chat run`: one conversation without the UI, for scripts, benchmarks and CI.

It drives the same `ChatSession` as the chat screen: each `--prompt` is a turn, saved as it streams
with `--save`; `--continue ID` appends the turns to a saved conversation, as reopening it in the app
would (its KV cache comes back from disk).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from ..config import Config, history_path, log_dir
from ..engine.base import Done, EngineError, FormatChecking, Recomputing, Token
from ..engine.compare import MAX_COLUMNS
from ..engine.context import left_out
from ..engine.formats import TEXT, OutputFormat, choose
from ..engine.params import (
    LIST_PARAMS,
    MAX_TOP_LOGPROBS,
    PARAMS,
    SAMPLER_STAGES,
    InvalidParameter,
    LiveParams,
    check_top_logprobs,
    label,
)
from ..engine.server_params import unsent_settings
from ..guard import watch
from ..history import Conversation, History
from ..replies import Ask, Refused
from ..session import ChatSession, Writing
from ..tools.loop import approve_listed, call_line
from ..tools.mcp import ToolError
from ..tools.setup import server_specs
from ..wording import no_thinking_note, wait_note
from ..workspace import Workspace
from .common import INTERRUPTED, RUNTIME_ERROR, add_model_options, fail, one_line, opener_for, writer
from .compare import lab_columns, run_lab

MODEL_FLAGS = ("model", "backend", "base_url", "remote")  # any of these opens another model than a continued chat's
LIST_METAVARS = {"stop": "STR", "logit_bias": "TEXT=BIAS", "sampler_order": "A,B,C"}
HELD_LINE_EVERY_S = 0.25


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser("run", description="Answer prompts without the UI: each --prompt is a turn of one "
                                                 "conversation; tokens stream to stdout.")
    add_model_options(run)
    run.add_argument("--prompt", "-p", action="append", required=True, help="a user turn; repeat for more turns")
    run.add_argument("--system", help="system prompt (default: system_prompt in the config)")
    for spec in PARAMS:
        run.add_argument(f"--{spec.name.replace('_', '-')}", type=spec.kind, metavar="N", help=spec.hint)
    for listed in LIST_PARAMS:
        more = " Repeatable." if listed.repeatable else f" Comma-separated, of: {', '.join(SAMPLER_STAGES)}."
        run.add_argument(f"--{listed.name.replace('_', '-')}", action="append" if listed.repeatable else "store",
                         metavar=LIST_METAVARS[listed.name], help=listed.hint + more)
    output = run.add_mutually_exclusive_group()
    output.add_argument("--format", choices=("text", "json"),
                        help="json: the reply is a JSON object, as OpenAI's JSON mode (a grammar allows nothing "
                             "else; its values shallow, numbers within ±10^15 with at most 6 decimals, strings of at "
                             "most 256 characters, arrays of at most 24 items)")
    output.add_argument("--json-schema", metavar="FILE_OR_JSON",
                        help="the reply is JSON matching this schema (its strings written with at most 256 characters "
                        "and its arrays with at most 24 items, unless the schema's own minimum asks for more)")
    output.add_argument("--grammar", metavar="FILE", help="the reply follows this GBNF grammar (a file, or its text)")
    run.add_argument("--no-stream", action="store_true",
                     help="hold each reply until it is complete (a line on stderr shows it being written), then "
                          "compare the wait with when the first word would have come")
    run.add_argument("--thinking", choices=("on", "off"),
                     help="let a reasoning model think before it answers (default: thinking in the config, or the "
                          "continued chat's)")
    run.add_argument("--top-logprobs", type=int, default=0, metavar="N",
                     help=f"with --json: each token's probability and the N likeliest (at most {MAX_TOP_LOGPROBS})")
    run.add_argument("--xray", action="store_true",
                     help="with --json: each token's `stages`, the sampler chain stage by stage (a local model only)")
    run.add_argument("--mcp", action="append", metavar="COMMAND_OR_NAME",
                     help="an MCP server whose tools the model may call: a command started over stdio "
                          "('python -m mcp_server_time') or a name from [mcp.servers] in the config. Repeatable")
    run.add_argument("--tool-choice", default="auto", metavar="auto|none|required|NAME",
                     help="auto (default): the model may call a tool; required or a tool's name: its first step is "
                          "a call (then auto)")
    run.add_argument("--approve", metavar="all|NAME,…",
                     help="the tools that may run; without it every call is recorded as not approved, and the "
                          "model told so")
    run.add_argument("--compare", action="append", metavar="SETTINGS",
                     help="the sampling lab: answer the prompt once for each of these settings (over the other flags), "
                          "e.g. 'temperature=1.0,top_p=0.9,seed=7', decoded together over one read of the prompt; "
                          f"repeat for each column (at most {MAX_COLUMNS}; a local model)")
    run.add_argument("--json", action="store_true", help="print one JSON report at the end instead of the text")
    run.add_argument("--save", action="store_true", help="keep the conversation in the history")
    run.add_argument("--continue", dest="continue_id", type=int, metavar="ID",
                     help="append the turns to saved conversation ID (see tui-chat history), with its model, system "
                          "prompt and settings (flags change them); implies --save")
    run.set_defaults(run=run_command)


def run_command(args: argparse.Namespace, config: Config) -> int:
    if any(not prompt.strip() for prompt in args.prompt):
        raise InvalidParameter("--prompt must not be empty: give the text of a user turn")
    given = {spec.name: getattr(args, spec.name) for spec in PARAMS if getattr(args, spec.name) is not None}
    for listed in LIST_PARAMS:
        value = getattr(args, listed.name)
        if value is not None:
            given[listed.name] = [listed.parse(item) for item in value] if listed.repeatable else listed.parse(value)
    check_top_logprobs(args.top_logprobs)
    if args.xray and not args.json:
        raise InvalidParameter("--xray needs --json: the stages are part of the JSON report")
    output = _output_format(args)
    if not args.mcp and (args.approve is not None or args.tool_choice != "auto"):
        raise InvalidParameter("--tool-choice and --approve need --mcp: the server whose tools the model may call")
    if args.mcp and output.constrained:
        raise InvalidParameter("--mcp with an output format is not supported yet: the reply's grammar is its calls'")
    opener, model = opener_for(config, args)
    if args.watched:
        watch(log_dir())
    workspace = Workspace(config, opener, History(history_path()) if args.save or args.continue_id is not None
                          else None)
    try:
        continued = workspace.chats.load(args.continue_id) if args.continue_id is not None else None
        if continued is not None and not any(getattr(args, flag, None) for flag in MODEL_FLAGS):
            model = continued.model or model
        params = (continued.sampling if continued else config.sampling).with_changes(**given)
        if args.compare:
            return run_lab(workspace, args, model, lab_columns(args, params), output)
        return _run_opened(workspace, args, model, continued, LiveParams(params), output)
    finally:
        workspace.close()


def _run_opened(workspace: Workspace, args: argparse.Namespace, model: str | None, continued: Conversation | None,
                live: LiveParams, output: OutputFormat) -> int:
    """Load the model and answer the prompts: in a new conversation, or going on with `continued`."""
    backend = workspace.load_now(model)
    info = backend.info
    assert info is not None, "a loaded backend knows its model"
    try:
        if args.xray and not isinstance(backend, Recomputing):
            raise InvalidParameter("--xray needs a local model: a server does not show its sampler chain's stages")
        workspace.streaming = not args.no_stream
        options = {"top_logprobs": args.top_logprobs, "warn": _warn, "xray": args.xray}
        if continued is not None:
            session = workspace.reopen(continued.id, live, **options)[0]
            if args.system is not None:
                session.set_system_prompt(args.system)
            if _format_given(args):
                session.output_format = output
        else:
            session = workspace.new_chat(live, output_format=output, **options, **(
                {} if args.system is None else {"system_prompt": args.system}))
        if isinstance(backend, FormatChecking):  # a local model: a format it cannot use is the user's to fix
            if unchecked := backend.check_format(session.output_format):
                print(f"tui-chat: note: {unchecked}", file=sys.stderr)
        if args.mcp:
            specs = server_specs(args.mcp, workspace.config.mcp)
            try:
                workspace.consent = approve_listed((args.approve or "").split(","))
                workspace.start_tools(specs, args.tool_choice)
            except ToolError as error:
                return fail(error, RUNTIME_ERROR)
            for line in (line for spec in specs for line in workspace.tool_servers.left_out(spec.name)):
                print(f"tui-chat: note: {line}", file=sys.stderr)
        if args.thinking is not None:
            session.set_thinking(args.thinking == "on")
            if note := no_thinking_note(info):
                print(f"tui-chat: {note}", file=sys.stderr)
        if unsent := unsent_settings(info.ignored_params, live.snapshot()[1]):
            print(f"tui-chat: note: not sent to this server, which takes no such setting: "
                  f"{', '.join(label(name) for name in unsent)}", file=sys.stderr)
        try:
            return run_conversation(workspace, args.prompt, as_json=args.json)
        except EngineError as error:
            return fail(error, RUNTIME_ERROR)
    finally:
        backend.close()


def run_conversation(workspace: Workspace, prompts: list[str], *, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Answer each prompt in turn in the workspace's chat; returns the process exit status."""
    session, backend = workspace.session, workspace.backend
    assert session is not None and backend is not None, "a chat on a loaded model"
    write = writer(out)
    turns: list[dict[str, Any]] = []
    for index, prompt in enumerate(prompts):
        continuing = session.conversation_id
        if isinstance(outcome := workspace.start_reply(Ask(prompt)), Refused):
            raise EngineError(outcome.reason)
        if index == 0 and session.conversation_id is not None:
            saved = "continuing" if continuing else "saving as"
            print(f"tui-chat: {saved} conversation {session.conversation_id}", file=sys.stderr)
        done, waited_s, tokens = _stream_turn(session, write, as_json)
        if not as_json:
            write("\n\n" if index < len(prompts) - 1 else "\n")
        _notes(session, done, waited_s)
        turns.append(_turn_report(prompt, done, tokens, session))
        if done.stop_reason == "cancelled":
            break
    if as_json:
        info = backend.info
        assert info is not None, "a loaded backend knows its model"
        report = {"model": info.name, "model_path": info.path, "backend": info.backend,
                  "gpu_layers": info.gpu_layers, "params": session.live.snapshot()[1].as_dict(),
                  "ignored_params": list(info.ignored_params), "ignored_formats": list(info.ignored_formats),
                  "server_notes": list(info.notes), "turns": turns}
        write(json.dumps(report, indent=2) + "\n")
    return INTERRUPTED if turns and turns[-1]["stop_reason"] == "cancelled" else 0


def _output_format(args: argparse.Namespace) -> OutputFormat:
    """--format, --json-schema or --grammar; a schema or grammar that cannot be used is one line (exit 2)."""
    if args.json_schema is not None:
        return choose("json_schema", args.json_schema)
    if args.grammar is not None:
        return choose("grammar", args.grammar)
    return TEXT if args.format in (None, "text") else choose(args.format)


def _format_given(args: argparse.Namespace) -> bool:
    """A continued chat keeps its output format unless a flag names another."""
    return args.format is not None or args.json_schema is not None or args.grammar is not None


def _stream_turn(session: ChatSession, write: Callable[[str], None],
                 as_json: bool) -> tuple[Done, float, list[dict[str, Any]]]:
    """One reply as it streams: the text to stdout (without the whitespace around it), Ctrl+C stops it.
    With streaming off the text waits for the end, and stderr's line shows the reply being written.
    Returns how it ended, the seconds waited and the tokens' entries for the report.
    A reply the engine gave up on is an EngineError, after what arrived of it."""
    writing = session.writing
    assert writing is not None, "the turn was just asked"
    held = _held_line(writing) if not session.streaming else None
    shown, ending = "", None
    tokens: list[dict[str, Any]] = []
    try:
        for event in writing.stream:
            if isinstance(event, Token) and (session.top_logprobs or session.xray):
                tokens.append(_token_entry(event))
            update = session.take([event])
            if update.text and held is not None:
                held()
            elif not as_json and update.text:
                shown = _show(write, shown, update.text)
            ending = update.ending or ending
    except KeyboardInterrupt:
        writing.stream.cancel()
        ending = session.take([writing.stream.result()]).ending
    if held is not None:
        held(end=True)
    assert ending is not None, "a stream ends with Done or Error"
    if ending.done is None:
        if shown and not as_json:
            write("\n")  # the part of the reply that arrived stays, on its own line
        raise EngineError(ending.died.said("") if ending.died is not None else ending.message)
    if not as_json:
        _show(write, shown, ending.done.text[len(shown):] if ending.done.text.startswith(shown) else "")
    return ending.done, ending.waited_s, tokens


def _held_line(writing: Writing) -> Callable[..., None]:
    """Streaming off: `Writing, streaming off: 57 tokens · 3.2 s` on a terminal's stderr, redrawn in place
    a few times a second and cleared at the end; nothing where stderr is a file."""
    if not sys.stderr.isatty():
        return lambda end=False: None
    drawn = [0.0]

    def show(end: bool = False) -> None:
        now = time.monotonic()
        if end:
            sys.stderr.write("\r\x1b[K")
        elif now - drawn[0] >= HELD_LINE_EVERY_S:
            drawn[0] = now
            sys.stderr.write(f"\r\x1b[K{writing.held_line()}")
        sys.stderr.flush()

    return show


def _notes(session: ChatSession, done: Done, waited_s: float) -> None:
    """What the reply's text alone does not say, on stderr: turns left out, an incomplete format, the wait."""
    if done.note:
        print(f"tui-chat: note: {done.note}", file=sys.stderr)
    for call in done.tool_calls:
        print(f"tui-chat: tool: {call_line(call)}", file=sys.stderr)
    if done.metrics.dropped_turns:
        print(f"tui-chat: note: {left_out(done.metrics.dropped_turns)} to fit the "
              f"{done.metrics.n_ctx}-token context", file=sys.stderr)
    if done.incomplete and done.stop_reason != "eos":  # at an end, the note says what the reply breaks
        print(f"tui-chat: note: the reply stopped ({done.stop_reason}) before its {session.output_format.label} "
              "was complete: the output is incomplete", file=sys.stderr)
    if not session.streaming:
        print(f"tui-chat: {wait_note(done.metrics.ttft_s, waited_s)}", file=sys.stderr)


RESTORE_NOTE = ("the prompt's first restored_tokens came from a KV cache saved on disk, not read again: on some CPUs "
                "the saved cache and a fresh read sum in another order (probabilities differ by ~2 %), so a greedy "
                "reply can part from a cold run's where two tokens nearly tie")


def _turn_report(prompt: str, done: Done, tokens: list[dict[str, Any]], session: ChatSession) -> dict[str, Any]:
    """`text` is the reply exactly as it entered the conversation (a script rebuilding the chat from it gets
    the same prompt); `reasoning` the thinking before it."""
    turn: dict[str, Any] = {"prompt": prompt, "text": done.text, "reasoning": done.reasoning,
                            "stop_reason": done.stop_reason, "stop_sequence": done.stop_sequence or None,
                            **done.metrics.as_dict()}
    metrics = done.metrics
    if metrics.restored_tokens:
        turn["restore_note"] = RESTORE_NOTE
    if metrics.draft_kind:
        turn["draft"] = {"kind": metrics.draft_kind, "drafted": metrics.drafted, "accepted": metrics.draft_accepted,
                         "acceptance": metrics.acceptance, "verifications": metrics.verifications}
    if session.output_format.constrained:
        turn |= {"format": session.output_format.kind, "incomplete": done.incomplete}
    if session.tools is not None:
        turn["tool_calls"] = [call.as_dict() for call in done.tool_calls]
    if session.top_logprobs or session.xray:
        turn |= {"prompt_ids": list(done.prompt_ids), "tokens": tokens}
    return turn


def _token_entry(token: Token) -> dict[str, Any]:
    """Probabilities under the model's raw distribution, so a turn can be replayed elsewhere; under an output
    format, what its grammar masked and which alternatives it allowed; with --xray, the chain's stages."""
    entry: dict[str, Any] = {
        "token": token.piece,
        "id": token.token_id,
        "prob": token.prob,
        "top": [{"token": c.text, "id": c.token_id, "prob": c.prob}
                | ({} if c.allowed is None else {"allowed": c.allowed}) for c in token.top],
    }
    if token.special:
        entry["special"] = token.special
    if token.grammar is not None:
        entry["grammar"] = {"removed": token.grammar.removed, "allowed": token.grammar.allowed,
                            "forced": token.grammar.forced}
    if token.stages:
        entry["stages"] = [stage.as_dict() for stage in token.stages]
    if token.drafted or token.rejected:
        entry["draft"] = "accepted" if token.drafted else "correction"
    return entry


def _show(write: Callable[[str], None], shown: str, text: str) -> str:
    """Print `text` without the whitespace around the reply (trailing space waits for what follows it).

    Returns all the text seen so far.
    """
    seen = shown + text
    write(seen.strip()[len(shown.strip()) :])
    return seen


def _warn(message: str) -> None:
    print(f"tui-chat: warning: {one_line(message)}", file=sys.stderr)
