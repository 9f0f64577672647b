"""One reply as it streams in from a server: its text, a Token event per token, and its metrics.

Metrics come from the client's own clock (TTFT, decode rate) and from what the server reports:
`usage`, and llama.cpp's `timings`.
"""

from __future__ import annotations

import time
from typing import Any

from ..base import Done, Metrics, Request, StopReason, Stream, Token, TurnMetrics
from ..params import SamplingParams
from .wire import RemoteError, TokenProb, count, parse_chunk, rate

METRICS_INTERVAL_S = 0.1


class StreamedReply:
    def __init__(self, request: Request, params_version: int, n_ctx: int) -> None:
        self.request = request
        self.params_version = params_version
        self.n_ctx = n_ctx
        self.text = ""
        self.tokens = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.first_at: float | None = None
        self.visible_at: float | None = None
        self.last_at: float | None = None
        self._next_metrics = 0.0

    def take(self, data: str, stream: Stream) -> bool:
        """Apply one event's data; True once the server said the stream is over."""
        if data.strip() == "[DONE]":
            return True
        chunk = parse_chunk(data)
        if chunk.error is not None:
            raise RemoteError(f"the server stopped the reply: {chunk.error}")
        self.usage = chunk.usage or self.usage
        self.timings = chunk.timings or self.timings
        self.finish_reason = chunk.finish_reason or self.finish_reason
        now = time.perf_counter()
        if chunk.tokens:
            for index, token in enumerate(chunk.tokens):
                self._token(stream, chunk.content if index == 0 else "", now, token)
        elif chunk.content:
            self._token(stream, chunk.content, now, None)
        if now >= self._next_metrics:
            stream.put(Metrics(self.metrics()))
            self._next_metrics = now + METRICS_INTERVAL_S
        return False

    def _token(self, stream: Stream, text: str, now: float, prob: TokenProb | None) -> None:
        self.tokens += 1
        self.text += text
        self.first_at = self.first_at or now
        self.last_at = now
        if text and self.visible_at is None:
            self.visible_at = now
        if prob is None:
            stream.put(Token(-1, text, now, self.params_version))
        else:
            stream.put(Token(-1, text, now, self.params_version, prob.text, prob.prob, prob.top))

    def metrics(self) -> TurnMetrics:
        """Counts the server reported win over our own: it knows the prompt, the cache and the tokens."""
        usage, timings = self.usage, self.timings
        evaluated, cache_n = count(timings, "prompt_n"), count(timings, "cache_n")
        from_timings = evaluated + (cache_n or 0) if evaluated is not None else None
        prompt = count(usage, "prompt_tokens") or from_timings or 0
        cached = count(usage, "prompt_tokens_details", "cached_tokens")
        cached = cache_n if cached is None else cached
        completion = count(usage, "completion_tokens") or count(timings, "predicted_n") or self.tokens
        first = self.visible_at or self.first_at
        ttft = None if first is None else first - self.request.submitted_at
        prompt_ms = rate(timings, "prompt_ms")
        # Without the server's prompt time, the time to first token bounds it from above.
        prefill_s = prompt_ms / 1000 if prompt_ms else ttft if prompt and ttft else 0.0
        return TurnMetrics(
            prompt_tokens=prompt,
            cached_tokens=min(cached or 0, prompt),
            completion_tokens=completion,
            ttft_s=ttft,
            prefill_s=prefill_s,
            decode_s=0.0 if self.first_at is None else self.last_at - self.first_at,
            context_tokens=prompt + completion,
            n_ctx=self.n_ctx,
            server_decode_tok_s=rate(timings, "predicted_per_second"),
        )

    def done(self, reason: StopReason) -> Done:
        return Done(reason, self.text, self.metrics())


def stop_reason(finish_reason: str | None, params: SamplingParams) -> StopReason:
    """OpenAI's "stop" covers both the end of text and a stop sequence; with stop sequences set we
    cannot tell which, and name the stop sequence."""
    if finish_reason == "length":
        return "length"
    return "stop" if params.stop and finish_reason == "stop" else "eos"
