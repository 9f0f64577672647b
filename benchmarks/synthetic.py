"""A token source for the UI benchmarks: a `Backend` that writes given pieces at an exact rate, with the
figures and events the engine sends. `benchmarks/ui_streaming.py` runs it in an engine process of its own (as the
app runs llama.cpp), or on a thread of the app's own process (`--source thread`, how it was measured before)."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable

from tui_chat.engine.base import Candidate, Done, Loaded, Metrics, ModelInfo, Request, Stream, Token, TurnMetrics

METRICS_EVERY_S = 0.1
SHORT_ASK = "A short one first."  # answered with the first SHORT_REPLY pieces: the inspector's reply to open on
SHORT_REPLY = 40
INFO = ModelInfo(
    name="synthetic", path="-", description="paced synthetic tokens", quantization="-", size_bytes=0,
    n_params=0, n_layers=0, gpu_layers=0, n_ctx=262_144, n_ctx_train=262_144, chat_format="plain",
    backend="synthetic",
)

def split_tokens(text: str) -> list[str]:
    """Pieces of at most 4 visible characters with the whitespace before them: about a real token each."""
    return re.findall(r"\s*\S{1,4}", text)


WORDS = (
    "the model cache layer token batch thread queue widget screen render stream parser value "
    "request reply context buffer memory prompt decode sample window update latency budget table "
    "frame markdown terminal config schedule worker result chunk offset index number simple small "
    "fast slow every first last other useful careful bounded stable because while before after "
    "returns keeps moves reads writes grows holds checks builds skips sends shows waits"
).split()
CODE = (
    "def moving_average(values: list[float], window: int) -> list[float]:\n"
    "    total = sum(values[:window])\n"
    "    out = [total / window]\n"
    "    for i in range(window, len(values)):\n"
    "        total += values[i] - values[i - window]\n"
    "        out.append(total / window)\n"
    "    return out",
    "import asyncio\n\n"
    "async def fetch_all(urls: list[str], limit: int = 8) -> dict[str, int]:\n"
    "    gate = asyncio.Semaphore(limit)\n"
    "    async def one(url: str) -> tuple[str, int]:\n"
    "        async with gate:\n"
    "            return url, len(await download(url))\n"
    "    return dict(await asyncio.gather(*(one(u) for u in urls)))",
    "class LRU:\n"
    "    def __init__(self, size: int) -> None:\n"
    "        self.size, self.items = size, {}\n\n"
    "    def get(self, key):\n"
    "        value = self.items.pop(key)\n"
    "        self.items[key] = value\n"
    "        return value",
)


# --- the reply text ------------------------------------------------------------------------------


def sentence(rng: random.Random) -> str:
    words = rng.choices(WORDS, k=rng.randint(8, 16))
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(3, 6)))


def section(rng: random.Random) -> str:
    """A heading, paragraphs, a list and a fenced python block: about 400 tokens."""
    items = "\n".join(f"- **{rng.choice(WORDS)}**: {sentence(rng)}" for _ in range(rng.randint(3, 5)))
    return (f"## {sentence(rng)[:-1]}\n\n{paragraph(rng)}\n\n{paragraph(rng)}\n\n{items}\n\n"
            f"{paragraph(rng)}\n\n```python\n{rng.choice(CODE)}\n```\n\n")


def markdown_reply(rng: random.Random, tokens: int) -> str:
    """A Markdown reply of at least `tokens` pieces."""
    text = ""
    while len(split_tokens(text)) < tokens:
        text += section(rng)
    return text.strip()



class SyntheticBackend:
    """A `Backend` that replies with `pieces` at exactly `rate` tokens/s, each job on its own thread.

    Token i is due at t0 + i/rate. The thread sleeps until the next one is due and then puts every
    token that is due, so when the OS (or the GIL, held by the UI) wakes it late, it catches up in a
    batch instead of falling behind the schedule.
    """

    def __init__(self, pieces: list[str], rate: float, probabilities: bool = False, thinking: int = 0) -> None:
        self.info: ModelInfo | None = None
        self.pieces = pieces
        self.rate = rate
        self.probabilities = probabilities  # each token with its probability and top 10, as the engine records
        self.thinking = thinking  # the first `thinking` tokens are the reply's thinking
        self.first_at: float | None = None
        self.last_at: float | None = None
        self._jobs: list[tuple[threading.Thread, Stream]] = []

    def load(self) -> Stream:
        return self._start(self._load)

    def generate(self, request: Request) -> Stream:
        return self._start(lambda stream: self._generate(request, stream))

    def count_tokens(self, text: str) -> int:
        return len(split_tokens(text))

    def close(self) -> None:
        for thread, stream in self._jobs:
            stream.cancel()
            thread.join()

    def _start(self, job: Callable[[Stream], None]) -> Stream:
        stream = Stream()
        thread = threading.Thread(target=job, args=(stream,), name="synthetic-worker", daemon=True)
        self._jobs.append((thread, stream))
        thread.start()
        return stream

    def _load(self, stream: Stream) -> None:
        self.info = INFO
        stream.put(Loaded(INFO))

    def _generate(self, request: Request, stream: Stream) -> None:
        version = request.params.snapshot()[0]
        prompt = sum(self.count_tokens(m.content) for m in request.messages)
        pieces = self.pieces[:SHORT_REPLY] if request.messages[-1].content == SHORT_ASK else self.pieces
        n = len(pieces)
        self.first_at = self.last_at = None

        def metrics(done: int) -> TurnMetrics:
            started = self.first_at is not None
            return TurnMetrics(
                prompt_tokens=prompt, completion_tokens=done, context_tokens=prompt + done, n_ctx=INFO.n_ctx,
                ttft_s=self.first_at - request.submitted_at if started else None,
                decode_s=self.last_at - self.first_at if started else 0.0,
            )

        start = time.perf_counter()
        next_metrics = start + METRICS_EVERY_S
        i = 0
        while i < n and not stream.cancelled.is_set():
            due = min(n, int((time.perf_counter() - start) * self.rate) + 1)
            while i < due:
                now = time.perf_counter()
                stream.put(self._token(pieces[i], i, now, version))
                self.first_at = self.first_at or now
                self.last_at = now
                i += 1
            if self.last_at >= next_metrics:
                stream.put(Metrics(metrics(i)))
                next_metrics = self.last_at + METRICS_EVERY_S
            if i < n:
                time.sleep(max(0.0, start + i / self.rate - time.perf_counter()))
        answer = pieces[self.thinking:i]
        stream.put(Done("cancelled" if i < n else "length", "".join(answer), metrics(i),
                        reasoning="".join(pieces[:min(i, self.thinking)]), answer_from=min(i, self.thinking)))

    def _token(self, piece: str, i: int, now: float, version: int) -> Token:
        top = tuple(Candidate(j, f"alt{j}", 0.5 / (j + 1)) for j in range(10)) if self.probabilities else ()
        prob = 0.3 + (i % 7) / 10 if self.probabilities else None
        if i < self.thinking:
            return Token(i, "", now, version, piece, prob, top, reasoning=piece, thinking=True)
        return Token(i, piece, now, version, piece, prob, top)
