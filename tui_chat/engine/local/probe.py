"""The CPU path self-test, run in a child process: `python -m tui_chat.engine.local.probe PATH MODEL`.

Loads MODEL on CPU path PATH (see cpu_path.py) as the app loads it (the same batch size, so the load's warm-up
reads a whole batch and one token on AMX), then reads a prompt and decodes a few tokens; exit status 0 means it
works. A crash kills only this process, which is the point.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..params import SamplingParams
from .cpu import choose_threads, read_topology
from .cpu_path import PATHS, CpuPath
from .llamacpp import LlamaSession
from .model import PREFILL_CHUNK

PROBE_TOKENS = 4


def self_test(model: Path, path_name: str) -> None:
    session = LlamaSession(model, n_ctx=2 * PREFILL_CHUNK, gpu_layers=0, n_batch=PREFILL_CHUNK,
                           threads=choose_threads(read_topology()), cpu_path=CpuPath(path_name, amx=True, simd=""))
    try:
        if session.cpu_path is None or session.cpu_path.name != path_name:
            raise SystemExit(3)  # AMX could not be denied here: this path cannot be tested
        prompt = session.tokenize("The capital of France is", add_bos=session.add_bos)
        session.prefill(prompt, lambda _done: None, lambda: False)
        sampler = session.new_sampler(SamplingParams(temperature=0.0), seed=0)
        for _ in range(PROBE_TOKENS):
            session.step(session.sample(sampler))
        session.free_sampler(sampler)
    finally:
        session.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in PATHS:
        print(f"usage: python -m tui_chat.engine.local.probe {{{','.join(PATHS)}}} MODEL.gguf", file=sys.stderr)
        return 2
    self_test(Path(argv[1]), argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
