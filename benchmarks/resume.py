"""Instant resume: the next turn of a ~3,000-token chat in a fresh process, its KV cache on disk vs cleared.

Why: a reopened chat (a restart, `run --continue`, another chat and back) would read its whole history
again; with the state saved after each reply it reads only the new message. Every run below is a process
of its own (as a restarted app is), loading the model the same way; runs alternate restored / cleared so
background load hits both sides alike. Each restored run starts from a copy of the same saved state, once
with the file in the page cache (the usual case: saved minutes ago) and once evicted from it
(posix_fadvise DONTNEED: as after a reboot, where the kernel honours it). Also: how long saving holds the
engine's worker after a reply (the reply itself is never kept waiting: Done goes out first) and the bytes
per token on disk. It prints numbers and asserts nothing.

    python benchmarks/resume.py [--model PATH] [--rounds 2] [--history-tokens 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N_CTX = 4096
SENTENCES = (
    "The old harbour town wakes early, and the fishing boats are out before the bakeries open.",
    "Most visitors come for the cliffs, but the locals will tell you the market is the real attraction.",
    "A narrow road climbs from the station past the church to the lighthouse on the headland.",
    "In winter the ferries run twice a day, weather permitting, and the cafes close by six.",
    "The museum keeps a collection of ship models, maps and letters from the whaling years.",
    "Walkers can follow the coastal path north for twelve kilometres to the next village.",
    "Fresh fish, smoked cheese and dark rye bread are what the region is known for.",
    "The annual regatta fills every room in town for a week at the end of August.",
)
QUESTION = "Thanks. What should I pack for a weekend there in October?"
FOLLOW_UP = "And which of the places you mentioned should I see first?"


def history(target_tokens: int, model: Path) -> list[dict[str, str]]:
    """A chat of user questions and long answers, about `target_tokens` long (the model counts one turn)."""
    from tui_chat.engine.local.llamacpp import count_tokens

    def turn(number: int) -> list[dict[str, str]]:
        answer = " ".join(SENTENCES[(number + i) % len(SENTENCES)] for i in range(10))
        return [{"role": "user", "content": f"Tell me more about the town, part {number + 1}."},
                {"role": "assistant", "content": answer}]

    per_turn = count_tokens(model, "\n".join(message["content"] for message in turn(0))) + 8  # with the template
    messages = [{"role": "system", "content": "You are a helpful travel guide. Answer in detail."}]
    for number in range(max(1, round(target_tokens / per_turn))):
        messages += turn(number)
    return messages


def child(mode: str, model: Path, kv: Path, chat: Path) -> None:
    """One fresh process: load, take one turn, close (which waits for the save); print its figures."""
    from tui_chat.engine.base import Done, Message, Request
    from tui_chat.engine.local import logs
    from tui_chat.engine.local.kvstore import KvStore
    from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
    from tui_chat.engine.params import LiveParams, SamplingParams

    logs.install(kv.parent / "logs")
    messages = [Message(m["role"], m["content"]) for m in json.loads(chat.read_text())]
    started = time.perf_counter()
    backend = LlamaBackend(LlamaSettings(model, n_ctx=N_CTX, kv_dir=kv))
    backend.load().result()
    loaded_s = time.perf_counter() - started
    if mode == "evicted":
        for path in kv.glob("*.kv"):
            descriptor = os.open(path, os.O_RDONLY)
            os.fsync(descriptor)  # dirty pages (the copy was just written) cannot be dropped
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(descriptor)
    params = LiveParams(SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=48))
    done = backend.generate(Request(messages, params, conversation="bench")).result()
    assert isinstance(done, Done), done
    disk = backend.model.disk
    backend.close()
    entries = KvStore(kv).list_entries()
    print(json.dumps({"load_s": loaded_s, "text": done.text, **done.metrics.as_dict(),
                      "save_s": disk.last_save_s if disk else None,
                      "bytes_per_token": entries[0].size_bytes / entries[0].n_tokens if entries else None,
                      "state_bytes": entries[0].size_bytes if entries else None}))


def run_child(mode: str, model: Path, kv: Path, messages: list[dict[str, str]]) -> dict:
    kv.parent.mkdir(parents=True, exist_ok=True)
    chat = kv.parent / "chat.json"
    chat.write_text(json.dumps(messages))
    result = subprocess.run([sys.executable, __file__, "--child", mode, "--model", str(model), "--kv", str(kv),
                             "--chat", str(chat)], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--history-tokens", type=int, default=3000)
    parser.add_argument("--child", choices=("saver", "restored", "evicted", "cleared"))
    parser.add_argument("--kv", type=Path)
    parser.add_argument("--chat", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model, args.kv, args.chat)
        return
    model = args.model or _starter()
    with tempfile.TemporaryDirectory(prefix="tui-chat-resume-") as tmp:
        measure(model, Path(tmp), args.rounds, args.history_tokens)


def measure(model: Path, tmp: Path, rounds: int, history_tokens: int) -> None:
    from tui_chat.engine.local import logs

    logs.install(tmp / "logs")  # llama.cpp's lines while counting tokens
    chat = history(history_tokens, model)
    first = [*chat, {"role": "user", "content": QUESTION}]
    saved = tmp / "saved"
    saver = run_child("saver", model, saved / "kv", first)
    resumed = [*first, {"role": "assistant", "content": saver["text"]}, {"role": "user", "content": FOLLOW_UP}]
    runs: dict[str, list[dict]] = {"restored": [], "evicted": [], "cleared": []}
    for _ in range(rounds):
        for mode in runs:
            work = tmp / mode
            shutil.rmtree(work, ignore_errors=True)
            if mode == "cleared":
                (work / "kv").mkdir(parents=True)
            else:
                shutil.copytree(saved, work)
            runs[mode].append(run_child(mode, model, work / "kv", resumed))
    report(model, saver, runs)


def report(model: Path, saver: dict, runs: dict[str, list[dict]]) -> None:
    ttft = {mode: statistics.median(run["ttft_s"] for run in found) for mode, found in runs.items()}
    cleared = runs["cleared"][0]
    print(f"model {model.name}, n_ctx {N_CTX}; next turn of a {cleared['prompt_tokens']:,}-token chat, "
          f"each run a fresh process (median of {len(runs['cleared'])})")
    print(f"{'':34}{'TTFT':>10}{'vs cleared':>12}{'restored':>10}{'read':>8}{'restore':>10}")
    for mode, label in (("cleared", "cache cleared (reads it all)"), ("restored", "restored (file in page cache)"),
                        ("evicted", "restored (file evicted first)")):
        run = runs[mode][0]
        print(f"{label:34}{ttft[mode] * 1000:>8.0f} ms{ttft[mode] / ttft['cleared']:>11.3f}x"
              f"{run['restored_tokens']:>10,}{run['prompt_tokens'] - run['cached_tokens']:>8,}"
              f"{run['restore_s'] * 1000:>7.0f} ms")
    restored = [run["text"] for mode in ("restored", "evicted") for run in runs[mode]]
    print(f"restored runs reply alike: {len(set(restored)) == 1}; as the cold read: {restored[0] == cleared['text']} "
          "(a cold read re-tokenizes the chat and reads the replies batched: it may part at a near tie)")
    print(f"saving after a reply holds the worker {saver['save_s'] * 1000:.0f} ms for "
          f"{saver['state_bytes'] / 2**20:.1f} MB ({saver['context_tokens']:,} tokens); after the resumed turn "
          f"{statistics.median(run['save_s'] for run in runs['restored']) * 1000:.0f} ms")
    print(f"bytes per token on disk: {saver['bytes_per_token']:,.0f}; model load {saver['load_s']:.2f} s (not in "
          f"TTFT); reading time the restore spared, estimated: {runs['restored'][0]['restore_avoided_s']:.1f} s")


def _starter() -> Path:
    from tui_chat.config import models_dir
    from tui_chat.engine.models import starter_path

    return starter_path(models_dir())


if __name__ == "__main__":
    main()
