"""Our in-process llama.cpp engine against raw llama-cpp-python streaming, on one model in one run.

Why: the engine drives llama.cpp through its C API on a worker thread and hands out one event per
token; this shows what that costs in decode speed, and what reusing the KV cache across turns buys
in time to first token, next to `Llama.create_completion(stream=True)` with the same prompt, sampling
settings and seed. Runs alternate ours / raw so background load hits both sides alike.
It prints numbers and asserts nothing.

    python benchmarks/engine_vs_raw.py [--rounds 5] [--max-tokens 256] [--model PATH] [--top-logprobs 5]
                                       [--busy N] [--cpu-paths]

--busy N keeps N cores busy with other processes for the decode rounds: raw runs at every thread
count and its best is the mark; ours picks its own. --cpu-paths also times our decode with llama.cpp's
extra buffer types (CPU_REPACK, AMX) on and off: what the safe fallback on an AMX machine costs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import shared
from shared import alternate, bench_model, fmt, greedy_settings, median, ms, ratio

from tui_chat.engine.base import Done, Error, Message, Request, Token
from tui_chat.engine.local.cpu import cpu_model, read_topology
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import LiveParams, SamplingParams

N_CTX = 4096
N_BATCH = 256
STOP = "\nUser:"
# Decode rounds need replies that run to max tokens on any CPU: greedy replies differ with the CPU's
# arithmetic, so the first of these that does, here, is used (and said).
LONG_PROMPTS = (
    "Write a long story about a dragon who learns to fly.",
    "Count from 1 to 1000, separated by commas.",
    "List the numbers from 1 to 500, one per line.",
)
REPLY_TOKENS = 32
QUESTIONS = (
    "Hi! What is your name?",
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "How many legs does a spider have?",
    "What do bees make?",
    "Tell me a fact about the Moon.",
    "What is two plus two?",
    "Which animal is known as the king of the jungle?",
    "What is the boiling point of water in Celsius?",
    "Say goodbye in French.",
)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(**greedy_settings(max_tokens))


@dataclass(frozen=True, slots=True)
class Run:
    """One generation as its caller saw it: times are taken when each piece reached the caller."""

    text: str
    prompt_ids: tuple[int, ...]
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None
    decode_tok_s: float | None
    engine_decode_tok_s: float | None = None


def client_decode_rate(n_tokens: int, first_at: float | None, last_at: float | None) -> float | None:
    """Tokens after the first over the time since the first, measured the same way on both sides."""
    if first_at is None or last_at is None or last_at <= first_at or n_tokens < 2:
        return None
    return (n_tokens - 1) / (last_at - first_at)


def transcript(messages: list[Message]) -> str:
    """The plain `User:` / `Assistant:` transcript, written independently of the engine's template."""
    lines = [f"{'User' if m.role == 'user' else 'Assistant'}: {m.content.strip()}\n" for m in messages]
    return "".join(lines) + "Assistant:"


def run_ours(backend: LlamaBackend, messages: list[Message], params: SamplingParams, top_logprobs: int = 0) -> Run:
    request = Request(list(messages), LiveParams(params), top_logprobs=top_logprobs)
    first_at = first_text_at = last_at = None
    done: Done | None = None
    for event in backend.generate(request):
        now = time.perf_counter()
        if isinstance(event, Token):
            first_at = first_at or now
            last_at = now
            if event.text and first_text_at is None:
                first_text_at = now
        elif isinstance(event, Done):
            done = event
        elif isinstance(event, Error):
            sys.exit(f"our engine failed: {event.message}")
    m = done.metrics
    return Run(
        text=done.text,
        prompt_ids=done.prompt_ids,
        cached_tokens=m.cached_tokens,
        completion_tokens=m.completion_tokens,
        ttft_s=None if first_text_at is None else first_text_at - request.submitted_at,
        decode_tok_s=client_decode_rate(m.completion_tokens, first_at, last_at),
        engine_decode_tok_s=m.decode_tok_s,
    )


def run_raw(llm: llama_cpp.Llama, prompt: str, params: SamplingParams) -> Run:
    # What create_completion feeds the model for a text prompt: BOS, then the text with specials parsed.
    tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    cached = min(llama_cpp.Llama.longest_token_prefix(llm._input_ids.tolist(), tokens), len(tokens) - 1)
    pieces: list[str] = []
    first_at = last_at = None
    started = time.perf_counter()
    for chunk in llm.create_completion(
        prompt,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repeat_penalty=params.repeat_penalty,
        seed=params.seed,
        stop=[STOP],
        stream=True,
    ):
        now = time.perf_counter()
        if text := chunk["choices"][0]["text"]:
            pieces.append(text)
            first_at = first_at or now
            last_at = now
    # Chunks are not tokens (text held back for the stop comes later in one piece). The token that
    # ended the reply is sampled but never evaluated, so it is the one missing from n_tokens.
    completion = llm.n_tokens - len(tokens) + 1
    return Run(
        text="".join(pieces),
        prompt_ids=tuple(tokens),
        cached_tokens=cached,
        completion_tokens=completion,
        ttft_s=None if first_at is None else first_at - started,
        decode_tok_s=client_decode_rate(completion, first_at, last_at),
    )


def bench_chat(backend: LlamaBackend, llm: llama_cpp.Llama, questions: tuple[str, ...]) -> tuple[list[Run], list[Run]]:
    """One growing chat per side, alternating turn by turn; each side continues with its own replies."""
    ours_msgs: list[Message] = []
    raw_msgs: list[Message] = []
    ours_runs: list[Run] = []
    raw_runs: list[Run] = []
    for question in questions:
        ours_msgs.append(Message("user", question))
        raw_msgs.append(Message("user", question))
        ours = run_ours(backend, ours_msgs, greedy(REPLY_TOKENS))
        raw = run_raw(llm, transcript(raw_msgs), greedy(REPLY_TOKENS))
        ours_msgs.append(Message("assistant", ours.text))
        raw_msgs.append(Message("assistant", raw.text))
        ours_runs.append(ours)
        raw_runs.append(raw)
    return ours_runs, raw_runs


def report_decode(
    decode: dict[str, list[Run]], warm: tuple[Run, Run], args: argparse.Namespace, prompt: str
) -> dict[str, float | None]:
    """Prints the decode table; returns the median tok/s of each side."""
    warm_ours, warm_raw = warm
    names = list(decode)
    print(f"\n== Decode: {prompt!r}, max_tokens {args.max_tokens}, temperature 0, seed 1, "
          f"{args.rounds} rounds alternating {' / '.join(names)}")
    same_prompt = "yes" if warm_ours.prompt_ids == warm_raw.prompt_ids else "NO"
    same_reply = "yes" if warm_ours.text == warm_raw.text else "NO"
    print(f"prompt tokens identical on both sides: {same_prompt} ({len(warm_raw.prompt_ids)}); "
          f"warm-up replies identical: {same_reply}")
    print("round  " + "  ".join(f"{name + ' tok/s':>16}{'tokens':>8}" for name in names)
          + "  ours/raw  ours engine-side tok/s")
    for i in range(args.rounds):
        cells = "  ".join(f"{fmt(decode[n][i].decode_tok_s):>16}{decode[n][i].completion_tokens:>8}" for n in names)
        r = ratio(decode["ours"][i].decode_tok_s, decode["raw"][i].decode_tok_s)
        print(f"{i + 1:>5}  {cells}  {fmt(r, '.3f'):>8}  {fmt(decode['ours'][i].engine_decode_tok_s):>21}")
    med = {name: median([r.decode_tok_s for r in runs]) for name, runs in decode.items()}
    # Rounds are paired in time, so the median of per-round ratios shrugs off a round that load hit.
    paired = median([ratio(o.decode_tok_s, w.decode_tok_s) for o, w in zip(decode["ours"], decode["raw"], strict=True)])
    cells = "  ".join(f"{fmt(med[n]):>16}{'':>8}" for n in names)
    engine_med = median([r.engine_decode_tok_s for r in decode["ours"]])
    print(f"{'median':>5}  {cells}  {fmt(paired, '.3f'):>8}  {fmt(engine_med):>21}")
    print(f"decode ours/raw: {fmt(ratio(med['ours'], med['raw']), '.3f')} from the median tok/s, "
          f"{fmt(paired, '.3f')} as the median of per-round ratios   target >= 0.98")
    if args.top_logprobs:
        on = med[f"ours+top{args.top_logprobs}"]
        print(f"top_logprobs={args.top_logprobs} on/off (median) = {fmt(ratio(on, med['ours']), '.3f')}")
    return med


def report_chat(chats: list[tuple[list[Run], list[Run]]]) -> tuple[list[float | None], list[float | None]]:
    """Prints TTFT per turn (median over the chats); returns those medians for ours and raw."""
    turns = len(QUESTIONS)
    ttft_ours = [median([chat[0][t].ttft_s for chat in chats]) for t in range(turns)]
    ttft_raw = [median([chat[1][t].ttft_s for chat in chats]) for t in range(turns)]
    same = sum(o.text == w.text for ours, raw in chats for o, w in zip(ours, raw, strict=True))
    print(f"\n== TTFT over one growing chat: {turns} user turns, whole transcript re-sent each turn, "
          f"max_tokens {REPLY_TOKENS}, median of {len(chats)} chats")
    print(f"replies identical on both sides: {same}/{turns * len(chats)}; token counts below are from the first chat")
    print(f"{'turn':>4}  {'prompt ours/raw':>15}  {'cached ours/raw':>15}  {'reply ours/raw':>14}  "
          f"{'TTFT ours ms':>12}  {'TTFT raw ms':>11}  {'ours/raw':>8}")
    for t, (o, w) in enumerate(zip(*chats[0], strict=True)):
        prompt, cached = f"{len(o.prompt_ids)}/{len(w.prompt_ids)}", f"{o.cached_tokens}/{w.cached_tokens}"
        print(f"{t + 1:>4}  {prompt:>15}  {cached:>15}  "
              f"{f'{o.completion_tokens}/{w.completion_tokens}':>14}  {ms(ttft_ours[t]):>12}  {ms(ttft_raw[t]):>11}  "
              f"{fmt(ratio(ttft_ours[t], ttft_raw[t]), '.3f'):>8}")
    print(f"TTFT turn {turns}/turn 1: ours {fmt(ratio(ttft_ours[-1], ttft_ours[0]), '.2f')} (target <= 1.2), "
          f"raw {fmt(ratio(ttft_raw[-1], ttft_raw[0]), '.2f')}")
    print(f"TTFT ours/raw at turn {turns}: {fmt(ratio(ttft_ours[-1], ttft_raw[-1]), '.2f')}")
    return ttft_ours, ttft_raw


def report_markdown(
    title: str, med: dict[str, float | None], ttft_ours: list, ttft_raw: list, args: argparse.Namespace
) -> None:
    """The summary as a table for README.md."""
    last = len(ttft_ours)
    print(f"\n| {title} | ours | raw llama-cpp-python | ours/raw | target |")
    print("|---|---:|---:|---:|---|")
    print(f"| decode tok/s, median of {args.rounds} | {fmt(med['ours'])} | {fmt(med['raw'])} | "
          f"{fmt(ratio(med['ours'], med['raw']), '.3f')} | >= 0.98 |")
    print(f"| TTFT turn 1, ms | {ms(ttft_ours[0])} | {ms(ttft_raw[0])} | "
          f"{fmt(ratio(ttft_ours[0], ttft_raw[0]), '.2f')} | |")
    print(f"| TTFT turn {last}, ms | {ms(ttft_ours[-1])} | {ms(ttft_raw[-1])} | "
          f"{fmt(ratio(ttft_ours[-1], ttft_raw[-1]), '.2f')} | |")
    print(f"| TTFT turn {last} / turn 1 | {fmt(ratio(ttft_ours[-1], ttft_ours[0]), '.2f')} | "
          f"{fmt(ratio(ttft_raw[-1], ttft_raw[0]), '.2f')} | | ours <= 1.2 |")
    if args.top_logprobs:
        on = med[f"ours+top{args.top_logprobs}"]
        print(f"| decode tok/s with top_logprobs={args.top_logprobs} | {fmt(on)} | | "
              f"{fmt(ratio(on, med['ours']), '.3f')} vs off | |")


def long_prompt(backend: LlamaBackend, max_tokens: int) -> str:
    """The first of LONG_PROMPTS whose greedy reply runs to `max_tokens` on this machine."""
    for prompt in LONG_PROMPTS:
        if run_ours(backend, [Message("user", prompt)], greedy(max_tokens)).completion_tokens >= max_tokens:
            return prompt
    print(f"warning   no prompt runs to {max_tokens} tokens here: rounds are shorter (see the tokens column)")
    return LONG_PROMPTS[0]


@contextlib.contextmanager
def busy_cores(count: int):
    """Other processes that each keep one core busy, as a build or a browser tab would."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if count else 0)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def bench_busy(backend: LlamaBackend, path: Path, prompt: str, args: argparse.Namespace) -> None:
    """Decode with `args.busy` cores taken: raw at every thread count (its best is the mark), ours as it chooses."""
    counts = range(1, (os.cpu_count() or 1) + 1)
    raws = {n: llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_BATCH, n_threads=n, n_threads_batch=n,
                               flash_attn=True, verbose=False) for n in counts}
    messages = [Message("user", prompt)]
    sides: dict[str, Callable[[], Run]] = {"ours": lambda: run_ours(backend, messages, greedy(args.max_tokens))}
    for n, llm in raws.items():
        sides[f"raw {n} thr"] = lambda llm=llm: run_raw(llm, transcript(messages), greedy(args.max_tokens))
    with busy_cores(args.busy):
        runs = alternate(sides, args.rounds)
    med = {name: median([r.decode_tok_s for r in side]) for name, side in runs.items()}
    best = max((name for name in med if name.startswith("raw")), key=lambda name: med[name] or 0)
    threads = backend.session.threads.decode if backend.session else "?"
    print(f"\n== Decode with {args.busy} of {os.cpu_count()} cores kept busy by other processes, "
          f"{args.rounds} rounds, median tok/s")
    for name, value in med.items():
        print(f"{name:>12}  {fmt(value):>8}" + (f"   (chose {threads} threads by the end)" if name == "ours" else ""))
    print(f"ours / best raw ({best}): {fmt(ratio(med['ours'], med[best]), '.3f')}   target >= 0.9")
    for llm in raws.values():
        llm.close()


def bench_cpu_paths(path: Path, prompt: str, args: argparse.Namespace) -> None:
    """Our decode with llama.cpp's extra buffer types on, then off (what the AMX-crash fallback costs)."""
    messages = [Message("user", prompt)]
    backends = {}
    for setting in ("all", "none"):
        backends[setting] = LlamaBackend(LlamaSettings(path, n_ctx=N_CTX, extra_buffers=setting))
        if isinstance(loaded := backends[setting].load().result(), Error):
            sys.exit(f"cannot load {path} with extra buffers {setting}: {loaded.message}")
    sides = {name: (lambda b=b: run_ours(b, messages, greedy(args.max_tokens))) for name, b in backends.items()}
    runs = alternate(sides, args.rounds)
    med = {name: median([r.decode_tok_s for r in side]) for name, side in runs.items()}
    print(f"\n== Extra buffer types (CPU_REPACK, AMX where built): decode tok/s, median of {args.rounds}")
    print(f"on (all): {fmt(med['all'])}   off (none): {fmt(med['none'])}   "
          f"off/on: {fmt(ratio(med['none'], med['all']), '.3f')}")
    for backend in backends.values():
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (decode runs and chats), default 5")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per decode run, default 256")
    parser.add_argument("--model", type=shared.model_arg, metavar="PATH", help=shared.MODEL_HELP)
    parser.add_argument("--top-logprobs", type=int, default=0, metavar="N",
                        help="also time our engine with top_logprobs=N, against it off")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="also decode with N cores kept busy by other processes")
    parser.add_argument("--cpu-paths", action="store_true", help="also time extra buffer types on against off")
    args = parser.parse_args()
    if args.rounds < 1 or args.max_tokens < 128 or args.top_logprobs < 0 or args.busy < 0:
        parser.error("--rounds must be >= 1, --max-tokens >= 128, --top-logprobs >= 0, --busy >= 0")

    path, log_dir = bench_model(args.model)
    topology = read_topology()
    print(f"machine   {topology.logical} CPUs, {topology.physical} cores ({cpu_model() or platform.processor()}), "
          f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, "
          f"llama_cpp {llama_cpp.__version__}, load avg {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()

    backend = LlamaBackend(LlamaSettings(path, n_ctx=N_CTX))
    loaded = backend.load().result()
    if isinstance(loaded, Error):
        sys.exit(f"our engine cannot load {path}: {loaded.message}")
    threads = loaded.info.threads
    # Our context leaves flash attention on llama.cpp's "auto", which turns it on here; raw defaults to off.
    # Matching it keeps the logits equal, so greedy replies, and the chats built from them, stay identical.
    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_BATCH, n_threads=threads, n_threads_batch=threads,
                          flash_attn=True, verbose=False)
    info = loaded.info
    print(f"model     {path.name} ({info.description}), chat format {info.chat_format}, n_ctx {N_CTX}, "
          f"n_batch {N_BATCH}, {threads} threads on both sides (ours: its own choice), flash attention on, "
          f"{info.offload}")
    print(f"logs      {log_dir / 'llama.log'}")
    if info.chat_format != "plain":
        print("note      this model has its own chat template: raw gets the plain transcript, so prompts differ")

    prompt = long_prompt(backend, args.max_tokens)
    story = [Message("user", prompt)]
    warm = run_ours(backend, story, greedy(16)), run_raw(llm, transcript(story), greedy(16))
    sides: dict[str, Callable[[], Run]] = {
        "ours": lambda: run_ours(backend, story, greedy(args.max_tokens)),
        "raw": lambda: run_raw(llm, transcript(story), greedy(args.max_tokens)),
    }
    if args.top_logprobs:
        n = args.top_logprobs
        sides[f"ours+top{n}"] = lambda: run_ours(backend, story, greedy(args.max_tokens), n)
    med = report_decode(alternate(sides, args.rounds), warm, args, prompt)

    # A new chat each round, opening with another question, so only "User:" is left to reuse from the last one.
    chats = [bench_chat(backend, llm, QUESTIONS[r % len(QUESTIONS):] + QUESTIONS[: r % len(QUESTIONS)])
             for r in range(args.rounds)]
    ttft_ours, ttft_raw = report_chat(chats)
    llm.close()
    if args.busy:
        bench_busy(backend, path, prompt, args)
    backend.close()
    if args.cpu_paths:
        bench_cpu_paths(path, prompt, args)
    print(f"\nfinished in {time.perf_counter() - started:.0f} s, load avg {os.getloadavg()[0]:.2f}")
    report_markdown(f"{path.name}, {cpu_model()}, {topology.logical} CPUs, llama_cpp {llama_cpp.__version__}",
                    med, ttft_ours, ttft_raw, args)


if __name__ == "__main__":
    main()
