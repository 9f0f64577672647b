"""A long prompt arriving while others stream: how long the streams in flight stop for it, `tui-chat serve` beside
`llama-server --parallel` on the same model.

Why: a server that reads a newcomer's prompt in a decode of its own stops every other stream for the whole read
(seconds, for 2,000 tokens on a CPU); llama-server mixes the prompt into the decode batch a chunk at a time, so
the others go on a token per chunk. Here 3 clients stream a long completion; once they run, a fourth sends a
~2,000-token prompt. Each stream's tokens are timed as they arrive: printed are the others' median gap between
two tokens before the newcomer came, their longest gap while its prompt was read, and the newcomer's time to its
first token. Rounds alternate the sides; medians over rounds, or --json.

    python benchmarks/serve_newcomer.py [--rounds 3] [--prompt-tokens 2000] [--threads N] [--model PATH]
                                        [--llama-server PATH] [--json]
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import threading
import time

from serve_speed import set_up, side_by_side_arguments, start_llama_server, start_tui_chat, stop
from shared import fmt, median, ms

N_CTX = 16384  # 4,096 tokens a slot: room for the newcomer's prompt
RUNNING = 3
STREAM_TOKENS = 400


def stream(port: int, prompt: str, max_tokens: int, times: list[float], sent: list[float]) -> None:
    """One streamed completion; the time each piece of text arrived goes into `times`."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "repeat_penalty": 1.0,
                       "top_k": 1, "seed": 1, "stream": True})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent.append(time.perf_counter())
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    for line in connection.getresponse():
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            payload = json.loads(line[6:])
            if payload.get("choices") and payload["choices"][0].get("text"):
                times.append(time.perf_counter())
    connection.close()


def long_prompt(words: int, round_number: int, side: str) -> str:
    """About `words` tokens of numbered sentences, new each round and side (no cache to reuse)."""
    lines = [f"Line {n} of the {side} log, round {round_number}: the reading went on." for n in range(words // 16 + 1)]
    return "\n".join(lines) + "\nSummarise the log in one sentence:"


def one_round(port: int, prompt_tokens: int, round_number: int, side: str) -> dict:
    streams: list[list[float]] = [[] for _ in range(RUNNING)]
    sent: list[list[float]] = [[] for _ in range(RUNNING + 1)]
    workers = [threading.Thread(target=stream, args=(port, f"Round {round_number}, {side} client {n}. Count from 1 "
                                                     f"to 1000: 1, 2, 3,", STREAM_TOKENS, streams[n], sent[n]))
               for n in range(RUNNING)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 300
    while any(len(times) < 20 for times in streams) and time.monotonic() < deadline:
        time.sleep(0.05)  # all three streaming steadily
    newcomer: list[float] = []
    late = threading.Thread(target=stream, args=(port, long_prompt(prompt_tokens, round_number, side), 8, newcomer,
                                                 sent[RUNNING]))
    late.start()
    late.join()
    for worker in workers:
        worker.join()
    arrived, first = sent[RUNNING][0], (newcomer[0] if newcomer else None)
    before = [b - a for times in streams for a, b in zip(times, times[1:], strict=False) if b < arrived]
    during = [b - a for times in streams for a, b in zip(times, times[1:], strict=False)
              if first is not None and b > arrived and a < first]
    return {"gap_before_s": statistics.median(before) if before else None,
            "longest_gap_during_s": max(during) if during else None,
            "newcomer_ttft_s": (first - arrived) if first is not None else None}


def main() -> None:
    parser = side_by_side_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=2000, metavar="N", help="the newcomer's prompt, about")
    args = parser.parse_args()
    setup = set_up(args, "serve-newcomer")
    model, threads, log = setup.model, setup.threads, setup.log
    print(f"model     {model}\nsettings  {RUNNING} streams of {STREAM_TOKENS} tokens, then a ~{args.prompt_tokens}-"
          f"token prompt; n_ctx {N_CTX}, {threads} threads, greedy; files in {setup.home}", file=log)
    sides = {"tui-chat": start_tui_chat(model, threads, args.gpu_layers, setup.home, N_CTX),
             "llama-server": start_llama_server(setup.binary, model, threads, args.gpu_layers, N_CTX)}
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    try:
        for number in range(args.rounds):
            for side, (_, port) in sides.items():
                runs[side].append(one_round(port, args.prompt_tokens, number, side))
            print(f"round {number + 1}/{args.rounds} done", file=log, flush=True)
    finally:
        for process, _ in sides.values():
            stop(process)
    summary = {side: {key: median([run[key] for run in side_runs]) for key in side_runs[0]}
               for side, side_runs in runs.items()}
    print(f"\n{'':14}{'gap before (ms)':>17}{'longest gap while it is read (ms)':>36}{'newcomer TTFT (s)':>19}",
          file=log)
    for side, row in summary.items():
        print(f"{side:14}{ms(row['gap_before_s']):>17}{ms(row['longest_gap_during_s'], '.0f'):>36}"
              f"{fmt(row['newcomer_ttft_s'], '.2f'):>19}", file=log)
    if args.json:
        json.dump({"machine": setup.machine, "threads": threads, "summary": summary, "runs": runs}, sys.stdout,
                  indent=1)


if __name__ == "__main__":
    main()
