"""One reply as it streams in from a server: its text, a Token event per token, and its metrics.

Metrics come from the client's own clock (TTFT, decode rate) and from what the server reports:
`usage`, llama.cpp's `timings` and `prompt_progress`. Until the server has said how long the prompt
was, its size is the client's estimate (`TurnMetrics.prompt_estimated`), so a reply stopped early still
counts the input the server read.
"""

from __future__ import annotations

import time
from typing import Any

from ..base import Done, Metrics, PromptProgress, Request, StopReason, Stream, Token, TurnMetrics
from ..params import SamplingParams
from .wire import RemoteError, TokenProb, count, parse_chunk, rate

METRICS_INTERVAL_S = 0.1


class StreamedReply:
    def __init__(self, request: Request, params_version: int, n_ctx: int) -> None:
        self.request = request
        self.params_version = params_version
        self.n_ctx = n_ctx
        self.text = ""
        self.reasoning = ""  # the thinking the server sent apart from the answer
        self.thinking = 0  # tokens of it
        self.thought_at: float | None = None  # when its last token came
        self.tokens = 0  # tokens the server wrote (a branch's given start excluded)
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.progress: dict[str, Any] | None = None
        self.extras: dict[str, Any] | None = None  # `tui-chat serve`'s own figures (x_tui_chat)
        self.estimate: int | None = None  # the prompt's tokens as the client counted them
        self._echo: str | None = None  # a branch's given text, until the server has repeated it or written anew
        self.first_at: float | None = None
        self.visible_at: float | None = None
        self.last_at: float | None = None
        self._next_metrics = 0.0
        self._calls: dict[int, dict[str, str]] = {}  # the tool calls streamed so far, by index: id, name, arguments

    def given_start(self, stream: Stream) -> None:
        """A branch: the tokens it must start with are the start of the reply, as the in-process engine
        replays them; the server is asked to continue from their text."""
        now = time.perf_counter()
        for token_id, text in zip(self.request.forced, self.request.forced_text, strict=True):
            self.text += text
            stream.put(Token(token_id, text, now, -1, text, forced=True))
        self._echo = "".join(self.request.forced_text) or None

    def estimated(self, tokens: int, stream: Stream) -> None:
        """The client's count of the prompt arrived: shown until the server reports its own."""
        self.estimate = tokens
        stream.put(Metrics(self.metrics()))

    def take(self, data: str, stream: Stream) -> bool:
        """Apply one event's data; True once the server said the stream is over."""
        if data.strip() == "[DONE]":
            return True
        chunk = parse_chunk(data)
        if chunk.error is not None:
            raise RemoteError(f"the server stopped the reply: {chunk.error}")
        self.usage = chunk.usage or self.usage
        self.timings = chunk.timings or self.timings
        self.extras = chunk.extras or self.extras
        self.finish_reason = chunk.finish_reason or self.finish_reason
        now = time.perf_counter()
        if chunk.progress is not None:
            self._read_progress(chunk.progress, stream)
        for piece in chunk.calls:
            call = self._calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = call["id"] or piece.ident
            call["name"] = call["name"] or piece.name  # sent whole, once (some servers repeat it)
            call["arguments"] += piece.arguments
        content = self._unechoed(chunk.content, bool(chunk.tokens))
        if chunk.reasoning:
            self._thought(stream, chunk.reasoning, now, chunk.tokens)
        elif chunk.tokens:
            for index, token in enumerate(chunk.tokens):
                self._token(stream, content if index == 0 else "", now, token)
        elif content:
            self._token(stream, content, now, None)
        if now >= self._next_metrics:
            stream.put(Metrics(self.metrics()))
            self._next_metrics = now + METRICS_INTERVAL_S
        return False

    def _unechoed(self, content: str, drawn: bool) -> str:
        """`content` without the repeat of a branch's given start: llama-server sends the assistant message it
        continues back first (as text without token probabilities) before the tokens it draws."""
        echo = self._echo
        if echo is None or not content:
            return content
        if not drawn and echo.startswith(content):
            self._echo = echo[len(content):] or None
            return ""
        self._echo = None
        return content.removeprefix(echo) if not drawn else content

    def _read_progress(self, progress: dict[str, Any], stream: Stream) -> None:
        """llama-server reading the prompt: what it reuses and how far it got, as the in-process engine says it."""
        self.progress = progress
        total, cache, done = count(progress, "total"), count(progress, "cache") or 0, count(progress, "processed")
        if total is not None and done is not None and cache <= done <= total:
            elapsed = (count(progress, "time_ms") or 0) / 1000
            stream.put(PromptProgress(done - cache, total - cache, elapsed))

    def _thought(self, stream: Stream, text: str, now: float, tokens: tuple[TokenProb, ...]) -> None:
        """Thinking sent as `reasoning_content`: a token event for each of its tokens (one where the server
        does not list them), the text with the first, as the in-process engine emits a thinking."""
        self.reasoning += text
        self.thought_at = now
        for index, prob in enumerate(tokens or (None,)):
            self.thinking += 1
            self._token(stream, "", now, prob, text if index == 0 else "", thinking=True)

    def _token(self, stream: Stream, text: str, now: float, prob: TokenProb | None, reasoning: str = "",
               thinking: bool = False) -> None:
        self.tokens += 1
        self.text += text
        self.first_at = self.first_at or now
        self.last_at = now
        if (text or reasoning) and self.visible_at is None:
            self.visible_at = now
        if prob is None:
            stream.put(Token(-1, text, now, self.params_version, reasoning=reasoning, thinking=thinking))
        else:
            stream.put(Token(prob.token_id, text, now, self.params_version, prob.text, prob.prob, prob.top,
                             reasoning=reasoning, thinking=thinking))

    def metrics(self, ended: StopReason | None = None) -> TurnMetrics:
        """Counts the server reported win over our own: it knows the prompt, the cache and the tokens. A reply
        `ended` on a stop sequence: the tokens the server counted beyond those it sent are the stop sequence's,
        which it held back (llama-server, vLLM); they are not timed here."""
        usage, timings, progress = self.usage, self.timings, self.progress
        evaluated, cache_n = count(timings, "prompt_n"), count(timings, "cache_n")
        from_timings = evaluated + (cache_n or 0) if evaluated is not None else None
        # timings while the prompt is read (llama-server's timings_per_token) count what was read so far
        reported = count(usage, "prompt_tokens") or count(progress, "total") or from_timings
        prompt = reported or self.estimate or 0
        cached = self.cached_tokens() or 0
        completion = count(usage, "completion_tokens") or count(timings, "predicted_n") or self.tokens
        unsent = max(0, completion - self.tokens) if ended is not None else 0  # counted, with no record of its own
        withheld, unrecorded = (unsent, 0) if ended == "stop" else (0, unsent)
        first = self.visible_at or self.first_at
        started, last = self.first_at, self.last_at  # both set with the first token, thinking's included
        ttft = None if first is None else first - self.request.submitted_at
        kv = count(self.extras, "kv_used")  # the cells its cache holds: the last token drawn is not read yet
        return TurnMetrics(
            prompt_tokens=prompt,
            cached_tokens=min(cached, prompt),
            completion_tokens=completion,
            ttft_s=ttft,
            prefill_s=self._prefill_s(bool(reported), from_timings == prompt, ttft),
            decode_s=0.0 if started is None or last is None else last - started,
            context_tokens=prompt + completion if kv is None else kv,
            n_ctx=self.n_ctx,
            server_decode_tok_s=rate(timings, "predicted_per_second"),
            prompt_estimated=not reported and self.estimate is not None,
            reasoning_tokens=count(usage, "completion_tokens_details", "reasoning_tokens") or self.thinking,
            thinking_s=None if self.thought_at is None or started is None else self.thought_at - started,
            withheld_tokens=withheld,
            unrecorded_tokens=unrecorded,
        )

    def cached_tokens(self) -> int | None:
        """The prompt's tokens the server said it had in its cache; None where it did not say."""
        said = (count(self.usage, "prompt_tokens_details", "cached_tokens"), count(self.timings, "cache_n"),
                count(self.progress, "cache"))
        return next((n for n in said if n is not None), None)

    def read_prompt(self) -> bool | None:
        """Whether the server read the prompt anew (None: it did not say). llama.cpp reads a wholly cached
        prompt's last token again, for its logits: that is no new read."""
        metrics, cached = self.metrics(), self.cached_tokens()
        if cached is None or metrics.prompt_estimated or not metrics.prompt_tokens:
            return None
        return cached < metrics.prompt_tokens - 1

    def _prefill_s(self, counted: bool, timed: bool, ttft: float | None) -> float:
        """The server's own time for reading the whole prompt (`timed`: its timings cover all of it); without
        it, the time to first token bounds it from above where the server `counted` the prompt (an estimate
        over a time is no measured rate); 0: no rate to show (the prompt still being read, or not counted)."""
        prompt_ms = rate(self.timings, "prompt_ms")
        if prompt_ms and timed:
            return prompt_ms / 1000
        return ttft if counted and ttft else 0.0

    @property
    def context_full(self) -> bool:
        """`tui-chat serve` said it stopped for a full context, which OpenAI's `length` does not tell from max
        tokens."""
        return self.extras is not None and self.extras.get("stop_reason") == "context"

    def done(self, reason: StopReason, stops: tuple[str, ...] = ()) -> Done:
        """`stops`: the stop sequences sent; a server does not say which one it ended on, so only a lone one
        is named."""
        incomplete = self.request.format.constrained and reason in ("length", "cancelled", "cut")
        sequence = stops[0] if reason == "stop" and len(stops) == 1 else ""
        calls = tuple({"id": call["id"], "type": "function",
                       "function": {"name": call["name"], "arguments": call["arguments"]}}
                      for _, call in sorted(self._calls.items()))
        return Done(reason, self.text, self.metrics(reason), incomplete=incomplete, reasoning=self.reasoning,
                    answer_from=self.thinking, stop_sequence=sequence, server_calls=calls)


def stop_reason(finish_reason: str | None, params: SamplingParams, implicit_stops: tuple[str, ...] = (),
                context_full: bool = False) -> StopReason:
    """OpenAI's "stop" covers both the end of text and a stop sequence; with stop sequences sent (the user's,
    or a plain transcript's `\\nUser:`, as the in-process engine names it) we cannot tell which, and name
    the stop sequence. Its "length" is a full context where the server said so (`context_full`)."""
    if finish_reason == "length":
        return "context" if context_full else "length"
    return "stop" if (params.stop or implicit_stops) and finish_reason == "stop" else "eos"
