"""A backend that always writes the same reply with the same figures: for snapshot tests only.

A screenshot of the real engine holds numbers that depend on the CPU's arithmetic (probabilities,
speeds, the CPU's own name): the same screen differs between an AMD and an Intel machine. The real
engine's behaviour is tested everywhere else; here the look is, so every figure is fixed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tui_chat.engine.base import (
    Candidate,
    ColumnEvent,
    Done,
    LabDone,
    Loaded,
    Metrics,
    ModelInfo,
    PoolCut,
    Request,
    Stream,
    Token,
    TurnMetrics,
)
from tui_chat.engine.params import LiveParams

INFO = ModelInfo(
    name="scripted", path="/models/scripted.gguf", description="llama 1B Q4_K - Medium", quantization="Q4_K_M",
    size_bytes=800_000_000, n_params=1_000_000_000, n_layers=16, gpu_layers=0, n_ctx=1024, n_ctx_train=8192,
    chat_format="plain", cpu="AVX2", threads=2,
)
# (piece, probability of the drawn token, the alternatives after it)
REPLY = (
    ("Red", 0.93, ("Blue", "Green", "The")),
    (",", 0.61, (" and", ":", ".")),
    (" orange", 0.35, (" green", " blue", " yellow")),
    (" and", 0.72, (",", " or", ".")),
    (" yellow", 0.18, (" green", " blue", " violet")),
    (".", 0.97, ("!", ",", "\n")),
)
METRICS = TurnMetrics(prompt_tokens=12, cached_tokens=3, completion_tokens=len(REPLY), ttft_s=0.05, prefill_s=0.02,
                      decode_s=0.1, context_tokens=18, n_ctx=1024, threads=2)


def scripted_token(index: int, params_version: int) -> Token:
    piece, prob, others = REPLY[index]
    rest = (1.0 - prob) / 2
    top = (Candidate(1000 + index, piece, prob),
           *(Candidate(2000 + 10 * index + i, text, rest / 2**i) for i, text in enumerate(others)))
    top = tuple(sorted(top, key=lambda c: -c.prob))
    return Token(1000 + index, piece, 0.0, params_version, piece, prob, top, PoolCut(40, 3, 2))


class ScriptedBackend:
    info: ModelInfo | None = None

    def load(self) -> Stream:
        self.info = INFO
        stream = Stream()
        stream.put(Loaded(INFO))
        return stream

    def generate(self, request: Request) -> Stream:
        stream = Stream()
        version = request.params.snapshot()[0]

        def write() -> None:
            for index in range(len(REPLY)):
                stream.put(scripted_token(index, version))
            stream.put(Metrics(METRICS))
            stream.put(Done("eos", "".join(piece for piece, _, _ in REPLY), METRICS))

        threading.Thread(target=write, daemon=True).start()
        return stream

    def compare(self, request: Request, columns: Sequence[LiveParams]) -> Stream:
        """The sampling lab: every column writes the scripted reply, over one read of the prompt."""
        stream = Stream()
        done = Done("eos", "".join(piece for piece, _, _ in REPLY), METRICS)
        for column, live in enumerate(columns):
            for index in range(len(REPLY)):
                stream.put(ColumnEvent(column, scripted_token(index, live.snapshot()[0])))
            stream.put(ColumnEvent(column, Metrics(METRICS)))
            stream.put(ColumnEvent(column, done))
        stream.put(LabDone(tuple(done for _ in columns), 1))
        return stream

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def close(self) -> None:
        pass
