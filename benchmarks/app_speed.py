"""The whole app's speed: the chat screen in a terminal, `tui-chat run`, and llama.cpp's own llama-bench.

Why: every other speed figure comes from the headless engine or a synthetic UI, so none of them sees
what a user sees. This runs the real app in tmux on the starter model, sends a prompt, waits for the
reply's footer and reads the side panel's Decode and Prefill; beside it `tui-chat run --json` on the
same prompt and settings, and llama-bench's tg128 and pp512 built from the same vendored llama.cpp as
the installed llama-cpp-python, with the engine's batch sizes and threads. Rounds alternate
app / run / llama-bench so background load hits all three alike; each runs in a session of its own,
as the app does in its terminal (Linux's autogroups share CPU between sessions first). While the app's
reply streams, the CPU time of its main (UI) thread is sampled from /proc. It prints numbers and
asserts nothing; --json prints one JSON document (rounds, medians, ratios, the CPU) instead.

    python benchmarks/app_speed.py [--rounds 3] [--threads N] [--llama-bench PATH] [--json]
                                   [--model PATH] [--gpu-layers N] [--max-tokens N]

On a GPU a reply of 128 tokens lasts a fifth of a second: too short to time, so give it --max-tokens 1024.
The app runs its engine in a process of its own: the UI thread's CPU and the whole app's (both processes) are
reported apart.

The first run builds llama-bench once (pip download of the sdist, cmake, minutes on 2 cores) into
the user cache dir, keyed by llama-cpp-python's version; CMAKE_ARGS is passed on, as pip does.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import shared
from shared import fmt, median, own_dirs, ratio

from tui_chat.config import cache_dir, models_dir
from tui_chat.engine.local.cpu import cpu_model, read_topology
from tui_chat.engine.local.llamacpp import device_batch
from tui_chat.engine.local.model import PREFILL_CHUNK
from tui_chat.engine.models import starter_path
from tui_chat.wording import STOP_LABELS

MAX_TOKENS = 128
INSPECTOR_TOP = 10  # the app's default: run records as many with --top-logprobs, so both do the same work a token
SHORT_PROMPT = "Write a long story about a dragon who learns to fly."
# ~512 tokens in the starter's chat template, for prompt reading beside llama-bench's pp512.
LONG_PROMPT = " ".join(
    f"Day {day}: the keeper of the lighthouse wrote that the wind turned, the boats came home late "
    "and the lamp needed oil." for day in range(1, 20)
) + " Summarize the keeper's log."
SIZE = ("120", "40")
REPLY_TIMEOUT_S = 300
FOOTER = re.compile(rf"(?:{'|'.join(map(re.escape, STOP_LABELS.values()))}) · \d+ tokens?")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def llama_bench_binary(version: str) -> Path:
    return llama_cpp_tool("llama-bench", version)


def llama_cpp_tool(target: str, version: str) -> Path:
    """A llama.cpp tool (`llama-bench`, `llama-server`) from the llama.cpp vendored in this llama-cpp-python
    release, built once per version."""
    home = cache_dir() / target / version
    binary = home / "build" / "bin" / target
    if binary.exists():
        return binary
    print(f"building {target} for llama-cpp-python {version} into {home} (once; minutes)", file=sys.stderr)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    quiet([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           f"llama-cpp-python=={version}", "-d", str(home)])
    with tarfile.open(next(home.glob("*.tar.gz"))) as sdist:
        sdist.extractall(home / "src", filter="data")
    source = next((home / "src").glob("*/vendor/llama.cpp"))
    build = home / "build"
    quiet(["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
           "-DLLAMA_CURL=OFF", *shlex.split(os.environ.get("CMAKE_ARGS", ""))])
    quiet(["cmake", "--build", str(build), "--target", target, "-j", str(os.cpu_count() or 2)])
    # The binary finds its shared libraries in build/bin by rpath: keep that folder, drop the rest.
    shutil.rmtree(home / "src")
    for path in [*home.glob("*.tar.gz"), *(p for p in build.iterdir() if p.name != "bin")]:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return binary


def quiet(command: list[str]) -> None:
    """Run a build step; its output only if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{shlex.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def isolated_env(root: Path, max_tokens: int) -> dict[str, str]:
    """XDG dirs of our own under `root`, with a config that makes every reply greedy and 128 tokens long;
    no KV cache on disk, so no reply starts from a saved state."""
    env = own_dirs(root)
    config = root / "config" / "tui-chat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f"kv_cache_budget_gb = 0\ninspector_top = {INSPECTOR_TOP}\n\n"
                      f"[sampling]\ntemperature = 0.0\nmax_tokens = {max_tokens}\n")
    return env


def tui_chat(*args: str) -> list[str]:
    return [sys.executable, "-m", "tui_chat", *args]


def run_turn(env: dict[str, str], model_args: list[str], prompt: str, max_tokens: int) -> dict:
    """`tui-chat run --json` on one prompt: its turn's metrics."""
    done = subprocess.run(tui_chat("run", *model_args, "-p", prompt, "--json", "--temperature", "0",
                                   "--max-tokens", str(max_tokens), "--top-logprobs", str(INSPECTOR_TOP)),
                          env=env, capture_output=True, text=True, start_new_session=True)
    if done.returncode:
        sys.exit(f"tui-chat run failed: {done.stderr.strip()}")
    return json.loads(done.stdout)["turns"][0]


class Tmux:
    """The real app in a pseudo-terminal of a tmux server of our own (its own socket and environment)."""

    def __init__(self, env: dict[str, str], command: list[str]) -> None:
        self.env = env
        self.socket = f"tui-chat-bench-{os.getpid()}"
        self.client: subprocess.Popen[str] | None = None  # a control-mode client, for looks at the screen
        self("new-session", "-d", "-x", SIZE[0], "-y", SIZE[1], "-s", "app", shlex.join(["exec", *command]))
        self.pid = 0
        self.socket_path = Path(self("display-message", "-p", "#{socket_path}"))
        try:
            self.pid = self._app_pid(int(self("display-message", "-p", "-t", "app", "#{pane_pid}")))
        except Exception:
            self.close()
            raise

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, input=stdin, capture_output=True,
                              text=True, check=True).stdout.strip()

    @staticmethod
    def _app_pid(pane: int) -> int:
        """The pane runs the crash watcher; the app is its forked child."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            children = Path(f"/proc/{pane}/task/{pane}/children").read_text().split()
            if children:
                return int(children[0])
            time.sleep(0.05)
        raise RuntimeError("the app did not start")

    def screen(self) -> str:
        """The pane's text, asked of one control-mode client (`tmux -C`): a `tmux capture-pane` process for each look
        took ~3 ms of CPU, and polled every few ms while a key was timed that was half a core beside the app."""
        return "\n".join(self._control("capture-pane -p -t app")).strip()

    def _control(self, command: str) -> list[str]:
        """`command`'s output, through the control client (started at the first call, told to send no output)."""
        if self.client is None:
            self.client = subprocess.Popen(["tmux", "-L", self.socket, "-C", "attach", "-t", "app"], env=self.env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            self._answer()  # the attach's own
            self._control("refresh-client -f no-output")
        assert self.client.stdin is not None
        self.client.stdin.write(command + "\n")
        self.client.stdin.flush()
        return self._answer()

    def _answer(self) -> list[str]:
        """The lines of the control client's next %begin ... %end block (notifications between blocks skipped)."""
        assert self.client is not None and self.client.stdout is not None
        lines: list[str] | None = None
        while line := self.client.stdout.readline():
            line = line.rstrip("\n")
            if lines is None:
                lines = [] if line.startswith("%begin") else None
            elif line.startswith(("%end", "%error")):
                if line.startswith("%error"):
                    raise RuntimeError(f"tmux said: {' '.join(lines)}")
                return lines
            else:
                lines.append(line)
        raise RuntimeError("the tmux control client ended")

    def wait_for(self, found, timeout_s: float, every_s: float = 0.1) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if found(screen := self.screen()):
                return screen
            time.sleep(every_s)
        raise RuntimeError(f"timed out; the screen:\n{self.screen()}")

    def close(self) -> None:
        if self.client is not None:
            self.client.kill()
            self.client.wait()
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
        self.socket_path.unlink(missing_ok=True)  # kill-server leaves it behind
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def panel(screen: str) -> str:
    """The side panel's text: each screen line right of the panel's edge, joined."""
    return " ".join(line.rsplit("▏", 1)[1].strip() for line in screen.splitlines() if "▏" in line)


def panel_rate(text: str, label: str) -> float | None:
    """`Decode   1,234.5 tok/s` → 1234.5; None where the panel shows none (`–`, or `3 tokens read`)."""
    found = re.search(rf"{label}\s+([\d,.]+) tok/s", text)
    return float(found[1].replace(",", "")) if found else None


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    return seconds


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process `pid`, its threads that ended too."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its child processes (the app and its engine process)."""
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    return process_cpu_s(pid) + sum(tree_cpu_s(child) for child in children)


def last_reply_metrics(env: dict[str, str]) -> dict:
    """The figures the app saved with its last reply: the ones its panel shows, for when the panel cannot be read
    (text in a script whose width the terminal and Rich disagree on shifts the panel's edge on those lines)."""
    database = Path(env["XDG_DATA_HOME"]) / "tui-chat" / "history.sqlite3"
    with contextlib.closing(sqlite3.connect(database)) as history:
        row = history.execute("SELECT metrics FROM messages WHERE role = 'assistant' ORDER BY id DESC LIMIT 1"
                              ).fetchone()
    return json.loads(row[0])


def app_turn(env: dict[str, str], model_args: list[str], prompt: str) -> dict:
    """Launch the app, paste the prompt, wait for the reply's footer, read the panel; with the CPU use of
    the UI (main) thread and the whole app (its engine process too) from Enter to the footer."""
    app = Tmux(env, tui_chat(*model_args))
    try:
        app.wait_for(lambda s: re.search(r"(?:·|\s)\d+\s+threads?\b|GPU \d+/\d+ layers", panel(s)), 120)  # loaded
        app("load-buffer", "-b", "prompt", "-", stdin=prompt)
        app("paste-buffer", "-p", "-d", "-b", "prompt", "-t", "app")
        app.wait_for(lambda s: "Type a message" not in s, 10, 0.05)  # the placeholder gave way to the prompt
        before, whole, started = thread_cpu_s(app.pid), tree_cpu_s(app.pid), time.monotonic()
        app("send-keys", "-t", "app", "Enter")
        screen = app.wait_for(lambda s: FOOTER.search(s), REPLY_TIMEOUT_S)
        after, wall = thread_cpu_s(app.pid), time.monotonic() - started
        whole = tree_cpu_s(app.pid) - whole
    finally:
        app.close()
    text = panel(screen)
    stored = last_reply_metrics(env)
    tokens = re.search(r"Tokens\s+in ~?([\d,]+) · out ([\d,]+)", text)
    completion = int(tokens[2].replace(",", "")) if tokens else stored["completion_tokens"]
    ui_s = after[app.pid] - before[app.pid]
    return {
        "decode_tok_s": panel_rate(text, "Decode") or stored["decode_tok_s"],
        "prefill_tok_s": panel_rate(text, "Prefill") or stored["prefill_tok_s"],
        "panel_read": bool(tokens),  # False: a script whose width Rich and the terminal disagree on moved the panel
        "prompt_tokens": int(tokens[1].replace(",", "")) if tokens else stored["prompt_tokens"],
        "completion_tokens": completion,
        "threads": stored["threads"],
        "ui_core": ui_s / wall,
        "ui_ms_per_token": ui_s * 1000 / completion,
        "app_cores": whole / wall,
    }


def bench_turn(binary: Path, model: Path, threads: dict[str, int], repack: bool, max_tokens: int,
               gpu_layers: int) -> dict:
    """llama-bench's pp512 on the reading threads and tg128 on the decode threads, with the engine's batch,
    ubatch, flash attention and CPU path."""
    batch, ubatch = device_batch(PREFILL_CHUNK, 4096, int(gpu_layers != 0))  # -1: every layer

    def rate(prompt: int, gen: int, threads: int) -> float:
        done = subprocess.run([str(binary), "-m", str(model), "-p", str(prompt), "-n", str(gen), "-t", str(threads),
                               "-b", str(batch), "-ub", str(ubatch), "-fa", "auto",
                               "--repack", str(int(repack)), "-ngl", str(99 if gpu_layers < 0 else gpu_layers),
                               "-r", "1", "-o", "json"],
                              capture_output=True, text=True, check=True, start_new_session=True)
        return json.loads(done.stdout)[0]["avg_ts"]

    return {"pp512_tok_s": rate(512, 0, threads["batch"]), "tg_tok_s": rate(0, max_tokens, threads["decode"]),
            "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds app / run / llama-bench, default 3")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="fix the threads of all three (default: the app and run follow the load, and "
                             "llama-bench gets what run used in the same round)")
    parser.add_argument("--llama-bench", type=Path, metavar="PATH", help="an existing llama-bench binary")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    parser.add_argument("--model", type=shared.model_arg, metavar="PATH", help=shared.MODEL_HELP)
    parser.add_argument("--gpu-layers", type=int, metavar="N", help="layers offloaded, -1 all, 0 none (default: "
                        "the app's own choice; llama-bench gets the same)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, metavar="N",
                        help=f"reply tokens, and llama-bench's tgN (default {MAX_TOKENS}; 1024 on a GPU)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    version = importlib.metadata.version("llama-cpp-python")
    binary = args.llama_bench or llama_bench_binary(version)
    model = args.model or starter_path(models_dir())
    fixed = ["--threads", str(args.threads), "--threads-batch", str(args.threads)] if args.threads else []
    offload = [] if args.gpu_layers is None else ["--gpu-layers", str(args.gpu_layers)]
    model_args = ["--model", str(model), *fixed, *offload]
    max_tokens = args.max_tokens
    home = Path(tempfile.mkdtemp(prefix="tui-chat-app-speed-"))
    env = isolated_env(home, max_tokens)
    info = json.loads(subprocess.run(tui_chat("info", "--json"), env=env, capture_output=True, text=True,
                                     check=True).stdout)
    extra_buffers = info["cpu"]["extra_buffers"]
    repack = not extra_buffers.startswith("none")
    topology = read_topology()
    batch, ubatch = device_batch(PREFILL_CHUNK, 4096, int((args.gpu_layers or 0) != 0))
    settings = {
        "engine": f"n_batch {batch}, n_ubatch {ubatch}, flash attention auto, swa_full on, extra buffers "
                  f"{extra_buffers}, threads {'fixed' if args.threads else 'following the load'}",
        "llama-bench": f"-b {batch} -ub {ubatch} -fa auto --repack {int(repack)} -r 1, -t "
                       f"{args.threads or 'as run (its decode threads: the reading ones too but on a hybrid CPU)'}"
                       ", -ngl "
                       f"{'99 (all)' if (args.gpu_layers or 0) < 0 else args.gpu_layers or 0}, "
                       "swa_full off (it has no flag)",
        "replies": f"temperature 0, {max_tokens} tokens, the config's n_ctx, no KV cache on disk, the top "
                   f"{INSPECTOR_TOP} of every token recorded on both sides (the app's inspector, run's --top-logprobs)",
    }
    log = sys.stderr if args.json else sys.stdout
    print(f"machine   {cpu_model() or platform.processor()}, {topology.physical} cores ({topology.logical} logical), "
          f"llama-cpp-python {version}, load avg {os.getloadavg()[0]:.2f}", file=log)
    print(f"model     {model}\nbinary    {binary}\nfiles     {home} (the app's and run's config, logs, history)",
          file=log)
    for name, value in settings.items():
        print(f"{name + ':':<13}{value}", file=log)
    columns = ("app dec", "run dec", f"tg{max_tokens}", "app read", "run read", "pp512", "thr a/r/b(pp)", "UI core",
               "UI ms/tok")
    print("\nround " + "".join(f"{c:>14}" for c in columns), file=log)

    rounds = []
    for index in range(args.rounds):
        app = {"short": app_turn(env, model_args, SHORT_PROMPT), "long": app_turn(env, model_args, LONG_PROMPT)}
        run = {"short": run_turn(env, model_args, SHORT_PROMPT, max_tokens),
               "long": run_turn(env, model_args, LONG_PROMPT, max_tokens)}
        threads = {"decode": args.threads or run["short"]["threads"], "batch": args.threads or run["long"]["threads"]}
        bench = bench_turn(binary, model, threads, repack, max_tokens, args.gpu_layers or 0)
        rounds.append({"app": app, "run": run, "llama_bench": bench})
        cells = (app["short"]["decode_tok_s"], run["short"]["decode_tok_s"], bench["tg_tok_s"],
                 app["long"]["prefill_tok_s"], run["long"]["prefill_tok_s"], bench["pp512_tok_s"])
        used = f"{app['short']['threads']}/{run['short']['threads']}/{threads['decode']}({threads['batch']})"
        print(f"{index + 1:>5} " + "".join(f"{fmt(c):>14}" for c in cells) + f"{used:>14}"
              f"{fmt(app['short']['ui_core'], '.2f'):>14}{fmt(app['short']['ui_ms_per_token']):>14}", file=log)

    def pick(side: str, turn: str, key: str) -> float:
        return median([r[side][turn][key] for r in rounds])

    med = {
        "app_decode_tok_s": pick("app", "short", "decode_tok_s"),
        "run_decode_tok_s": pick("run", "short", "decode_tok_s"),
        "tg_tok_s": median([r["llama_bench"]["tg_tok_s"] for r in rounds]),
        "app_prefill_tok_s": pick("app", "long", "prefill_tok_s"),
        "run_prefill_tok_s": pick("run", "long", "prefill_tok_s"),
        "pp512_tok_s": median([r["llama_bench"]["pp512_tok_s"] for r in rounds]),
        "app_ui_core": pick("app", "short", "ui_core"),
        "app_ui_ms_per_token": pick("app", "short", "ui_ms_per_token"),
        "app_cores": pick("app", "short", "app_cores"),
    }
    ratios = {
        "app/run decode": ratio(med["app_decode_tok_s"], med["run_decode_tok_s"]),
        f"run/tg{max_tokens}": ratio(med["run_decode_tok_s"], med["tg_tok_s"]),
        f"app/tg{max_tokens}": ratio(med["app_decode_tok_s"], med["tg_tok_s"]),
        "run read/pp512": ratio(med["run_prefill_tok_s"], med["pp512_tok_s"]),
        "app read/pp512": ratio(med["app_prefill_tok_s"], med["pp512_tok_s"]),
    }
    prompts = {turn: rounds[0]["run"][turn]["prompt_tokens"] for turn in ("short", "long")}
    if args.json:
        print(json.dumps({"cpu": cpu_model(), "cores": topology.physical, "logical_cpus": topology.logical,
                          "llama_cpp_python": version, "model": str(model), "settings": settings,
                          "prompt_tokens": prompts, "rounds": rounds, "median": med, "ratios": ratios}, indent=2))
        return
    cells = [med[k] for k in ("app_decode_tok_s", "run_decode_tok_s", "tg_tok_s", "app_prefill_tok_s",
                              "run_prefill_tok_s", "pp512_tok_s")]
    print("median" + "".join(f"{fmt(c):>14}" for c in cells) + f"{'':>14}{fmt(med['app_ui_core'], '.2f'):>14}"
          f"{fmt(med['app_ui_ms_per_token']):>14}")
    replies = {side: [r[side]["short"]["completion_tokens"] for r in rounds] for side in ("app", "run")}
    print(f"\ndecode: a {prompts['short']}-token prompt, reply tokens app {replies['app']}, run {replies['run']}; "
          f"reading: a {prompts['long']}-token prompt")
    print("ratios  " + "   ".join(f"{name} {fmt(value, '.2f')}" for name, value in ratios.items()))
    print(f"while the app's reply streams: its UI thread {fmt(med['app_ui_core'], '.2f')} of a core, the whole app "
          f"{fmt(med['app_cores'], '.2f')} cores; load avg {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
