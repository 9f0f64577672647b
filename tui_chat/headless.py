"""`tui-chat run`: one conversation without the UI, for scripts, benchmarks and CI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TextIO

from .engine.base import Backend, Done, EngineError, Error, Message, Request, Token
from .engine.context import left_out
from .engine.params import LiveParams, SamplingParams
from .recording import SavedChat, Saving
from .safetext import terminal_safe


def _writer(out: TextIO) -> Callable[[str], None]:
    clean = terminal_safe if out.isatty() else (lambda text: text)

    def write(text: str) -> None:
        out.write(clean(text))
        out.flush()

    return write


def run_conversation(
    backend: Backend,
    prompts: list[str],
    params: SamplingParams,
    *,
    system: str | None,
    as_json: bool,
    top_logprobs: int = 0,
    out: TextIO = sys.stdout,
    saving: Saving | None = None,
) -> int:
    """Answer each prompt in turn as one conversation; returns the process exit status."""
    messages: list[Message] = [Message("system", system)] if system else []
    turns: list[dict] = []
    write = _writer(out)
    saved = SavedChat(saving) if saving else None
    for index, prompt in enumerate(prompts):
        messages.append(Message("user", prompt))
        reply = None
        if saved:
            reply = saved.start_reply(saved.add_user(prompt, backend.info.name, system or "", params))
            if index == 0:
                print(f"tui-chat: saving as conversation {saved.id}", file=sys.stderr)
        stream = backend.generate(Request(list(messages), LiveParams(params), top_logprobs=top_logprobs))
        shown = ""
        final = None
        tokens: list[dict] = []
        try:
            for event in stream:
                if isinstance(event, Token):
                    if top_logprobs:
                        tokens.append(_token_entry(event))
                    if not as_json and event.text:
                        shown = _show(write, shown, event.text)
                    if reply:
                        reply.append(event.text)
                elif isinstance(event, (Done, Error)):
                    final = event
        except KeyboardInterrupt:
            stream.cancel()
            final = stream.result()
        if saved:
            saved.end_reply(reply, final)
        if isinstance(final, Error):
            if shown and not as_json:
                write("\n")  # the part of the reply that arrived stays, on its own line
            raise EngineError(final.message)
        if final.metrics.dropped_turns:
            print(f"tui-chat: note: {left_out(final.metrics.dropped_turns)} to fit the {final.metrics.n_ctx}-token "
                  "context", file=sys.stderr)
        if not as_json:
            shown = _show(write, shown, final.text[len(shown) :] if final.text.startswith(shown) else "")
            write("\n\n" if index < len(prompts) - 1 else "\n")
        messages.append(Message("assistant", final.text))
        turn = {"prompt": prompt, "text": final.text.strip(), "stop_reason": final.stop_reason, **final.metrics.as_dict()}
        if top_logprobs:
            turn |= {"prompt_ids": list(final.prompt_ids), "tokens": tokens}
        turns.append(turn)
        if final.stop_reason == "cancelled":
            break
    if as_json:
        info = backend.info
        report = {
            "model": info.name,
            "model_path": info.path,
            "backend": info.backend,
            "gpu_layers": info.gpu_layers,
            "params": params.as_dict(),
            "turns": turns,
        }
        write(json.dumps(report, indent=2) + "\n")
    return 130 if turns and turns[-1]["stop_reason"] == "cancelled" else 0


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
