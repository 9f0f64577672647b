"""The in-process llama.cpp backend: one worker thread owns the model; requests in, events out."""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import logs
from .base import (
    Done,
    EngineError,
    Error,
    LoadProgress,
    Loaded,
    Message,
    Metrics,
    ModelInfo,
    PromptProgress,
    Request,
    Stage,
    StopReason,
    Stream,
    Token,
    TurnMetrics,
    WordProbability,
    XRay,
)
from .chain import Chain
from .context import fit_context
from .cpu import ThreadGovernor
from .cpu_path import AUTO, ProbeResult, choose as choose_cpu_path, run_probe
from .formats import FormatError
from .ggml import build_features, build_version
from .grammar import Constraint
from .kvcache import DiskCache, Restored, open_disk_cache
from .kvstore import DEFAULT_BUDGET_BYTES
from .llamacpp import Inspection, LlamaSession, PrefillAborted, quantization_of, supports_gpu_offload
from .params import SamplingParams
from .prompts import PromptError, PromptFormat, choose_format
from .stops import StopScanner, Utf8Stream
from .xray import stage_cuts, word_probability, xray_at

METRICS_INTERVAL_S = 0.1
PREFILL_CHUNK = 256
_UNSEEN = Inspection(None, (), None)  # a token drawn with the inspector off


@dataclass(frozen=True, slots=True)
class LlamaSettings:
    path: Path
    n_ctx: int = 4096
    gpu_layers: int | None = None
    chat_template: str = "auto"
    extra_buffers: str = AUTO  # the CPU path (cpu_path.py): auto, all, no-amx or none
    threads: int | None = None  # decode threads; None follows the machine and its load
    threads_batch: int | None = None  # prompt-reading threads; likewise
    cache_dir: Path | None = None  # where the CPU path's self-test answer is kept
    kv_dir: Path | None = None  # where KV states are saved after each reply (None: not saved)
    kv_budget_bytes: int = DEFAULT_BUDGET_BYTES  # their total size; the least recently used go first

    @property
    def resolved_gpu_layers(self) -> int:
        """All layers where this build can offload, else none."""
        if self.gpu_layers is not None:
            return self.gpu_layers
        return -1 if supports_gpu_offload() else 0


def kept_token_count(ends: list[int | None], visible_len: int) -> int:
    """How many generated tokens lie wholly inside the visible reply.

    `ends[i]` is the text length after token i, or None while a UTF-8 character is still incomplete.
    Tokens past the visible text (a cut stop sequence) are not part of the conversation.
    """
    kept = 0
    for i, end in enumerate(ends):
        if end is not None:
            if end > visible_len:
                break
            kept = i + 1
    return kept


class LlamaBackend:
    """Owns a `LlamaSession` on a single worker thread; every public method is safe from any thread."""

    def __init__(self, settings: LlamaSettings, name: str | None = None) -> None:
        self.settings = settings
        self.name = name or settings.path.stem
        self.info: ModelInfo | None = None
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # Short jobs (an X-ray, a word's probability) that a reply being written takes between two tokens.
        self._quick: deque[Callable[[], None]] = deque()
        self._session: LlamaSession | None = None
        self._disk: DiskCache | None = None
        self._format: PromptFormat | None = None
        self._history_text = ""
        self._history_tokens: list[int] = []
        self._last_prompt: tuple[str, list[int]] = ("", [])
        self._session_lock = threading.Lock()
        self.threads = ThreadGovernor(settings.threads, settings.threads_batch)
        self._worker = threading.Thread(target=self._run, name="llama-worker", daemon=True)
        self._worker.start()

    # --- public API ---------------------------------------------------------------------------

    def load(self) -> Stream:
        stream = Stream()
        self._jobs.put(lambda: self._guarded(stream, lambda: self._load(stream)))
        return stream

    def generate(self, request: Request) -> Stream:
        stream = Stream()
        self._jobs.put(lambda: self._guarded(stream, lambda: self._generate(request, stream)))
        return stream

    def xray(self, context: Sequence[int], token: int, params: SamplingParams) -> Stream:
        """Why `token` was drawn after `context` (`xray.position_context`) under `params` (the settings it
        was drawn with: `LiveParams.at(token.params_version)`): ends with an `XRay` or an `Error`.
        Runs between two tokens when a reply is being written."""
        context = tuple(context)
        return self._quick_job(lambda session: xray_at(session, context, token, params))

    def word_probability(self, context: Sequence[int], text: str) -> Stream:
        """The probability that the model writes `text` right after `context`: ends with a
        `WordProbability` or an `Error`. Runs between two tokens when a reply is being written."""
        context = tuple(context)
        return self._quick_job(lambda session: word_probability(session, context, text))

    def count_tokens(self, text: str) -> int:
        """Tokens `text` takes in this model; tokenizing only reads the vocabulary, so no worker hop."""
        with self._session_lock:
            if self._session is None:
                raise EngineError("no model is loaded")
            return len(self._session.tokenize(text, add_bos=False))

    def close(self) -> None:
        self._jobs.put(None)
        self._worker.join()

    # --- worker -------------------------------------------------------------------------------

    @staticmethod
    def _guarded(stream: Stream, job: Callable[[], None]) -> None:
        """A bug in a job must end its stream with an error, not the worker thread (the UI would wait
        forever); the traceback goes to the log file, the user gets one line."""
        try:
            job()
        except Exception as error:  # noqa: BLE001 - the thread boundary: nothing may escape
            logs.record_exception(error)
            stream.put(Error(f"internal error ({type(error).__name__}: {error}); details in the log"))

    def _quick_job(self, compute: Callable[[LlamaSession], XRay | WordProbability]) -> Stream:
        stream = Stream()

        def job() -> None:
            try:
                if self._session is None:
                    raise EngineError("no model is loaded")
                stream.put(compute(self._session))
            except EngineError as error:
                stream.put(Error(str(error)))

        self._quick.append(lambda: self._guarded(stream, job))
        self._jobs.put(self._run_quick)  # wakes an idle worker; a reply being written gets there first
        return stream

    def _run_quick(self) -> None:
        while self._quick:
            self._quick.popleft()()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()
        with self._session_lock:
            if self._session is not None:
                self._session.close()
                self._session = None

    def _load(self, stream: Stream) -> None:
        settings = self.settings
        try:
            with self._session_lock:
                if self._session is not None:
                    self._session.close()
                    self._session = None
            self._disk = None
            cpu_path = choose_cpu_path(settings.extra_buffers, settings.path, settings.cache_dir, build_features(),
                                       probe=_announced_probe(stream))
            session = LlamaSession(
                settings.path,
                n_ctx=settings.n_ctx,
                gpu_layers=settings.resolved_gpu_layers,
                n_batch=PREFILL_CHUNK,
                threads=self.threads.threads,
                cpu_path=cpu_path,
                on_progress=lambda fraction: _report_load(stream, fraction),
            )
            try:
                prompt_format = choose_format(settings.chat_template, session.chat_template())
            except PromptError:
                session.close()
                raise
        except (EngineError, PromptError) as error:
            if stream.cancelled.is_set():
                error = EngineError(f"loading {settings.path.name} was cancelled")
            stream.put(Error(str(error)))
            return
        description = session.description()
        self.info = ModelInfo(
            name=self.name,
            path=str(settings.path),
            description=description,
            quantization=quantization_of(settings.path, description),
            size_bytes=session.size_bytes(),
            n_params=session.n_params(),
            n_layers=session.n_layers,
            gpu_layers=session.gpu_layers,
            n_ctx=session.n_ctx,
            n_ctx_train=session.n_ctx_train(),
            chat_format=prompt_format.name,
            cpu=session.cpu_path.describe() if session.cpu_path else "",
            threads=session.threads.decode,
        )
        self._disk = open_disk_cache(settings.kv_dir, settings.kv_budget_bytes, session, settings.path,
                                     build_version())
        with self._session_lock:
            self._session = session
        self._format = prompt_format
        self._history_text, self._history_tokens = "", []
        self._last_prompt = ("", [])
        stream.put(Loaded(self.info))

    def _generate(self, request: Request, stream: Stream) -> None:
        try:
            if self._session is None or self._format is None:
                raise EngineError("no model is loaded")
            _Turn(self, request, stream).run()
        except (EngineError, PromptError, FormatError) as error:
            stream.put(Error(str(error)))
            return
        if self._disk is not None:
            # after Done: the reply is not kept waiting
            self._disk.save(self._session, request.conversation, (self._history_text, self._history_tokens),
                            self._last_prompt)

    def _prompt_tokens(self, text: str) -> list[int]:
        """Tokens for the rendered prompt, keeping the tokens the model saw last turn as they were.

        Re-tokenizing the whole transcript can merge the end of the last reply differently from how it
        was generated, which would break prefix reuse right at the turn boundary. A regenerated or
        branched reply starts from the last prompt itself; a chat reopened from disk, from the transcript
        saved with its KV state.
        """
        session = self._session
        for known_text, known_tokens in self._known_transcripts(text):
            if known_text and text.startswith(known_text):
                return known_tokens + session.tokenize(text[len(known_text) :], add_bos=False)
        add_bos = session.add_bos and not (session.bos_text and text.startswith(session.bos_text))
        return session.tokenize(text, add_bos=add_bos)


    def _known_transcripts(self, text: str) -> Iterator[tuple[str, list[int]]]:
        """Texts the engine has read, with their tokens: this chat's, the last prompt, then the disk's (only
        looked up when the others do not fit)."""
        yield self._history_text, self._history_tokens
        yield self._last_prompt
        if self._disk is not None:
            yield self._disk.reading(text)


def _announced_probe(stream: Stream) -> Callable[[Path, str], ProbeResult]:
    """The CPU path self-test, said on the load line while it runs (it loads the model once more)."""

    def probe(model: Path, path_name: str) -> ProbeResult:
        stream.put(LoadProgress(0.0, f"testing this CPU's {path_name!r} path, once"))
        return run_probe(model, path_name)

    return probe


def _report_load(stream: Stream, fraction: float) -> bool:
    stream.put(LoadProgress(fraction))
    return not stream.cancelled.is_set()


class _Turn:
    """One reply: prompt, prefill with progress, then the decode loop that reads params every token."""

    def __init__(self, backend: LlamaBackend, request: Request, stream: Stream) -> None:
        self.backend = backend
        self.session: LlamaSession = backend._session
        self.request = request
        self.stream = stream
        self.implicit_stops = backend._format.implicit_stops
        self.forced = list(request.forced)
        self.allowance = len(self.forced) if request.continuing else 0  # tokens beyond max tokens
        self.prompt_text, self.prompt, self.dropped_turns = self._fitted_prompt()
        self.context = self.prompt + self.forced  # all the model reads before its first new token
        self.cached = 0
        self.restored: Restored | None = None
        self.prefill_s = 0.0
        self.generated: list[int] = []
        self.drawn = 0  # generated tokens the model chose (a branch's forced ones excluded)
        self.ends: list[int | None] = []
        self.first_at: float | None = None
        self.visible_at: float | None = None
        self.last_at: float | None = None
        self.constraint: Constraint | None = None

    def _fitted_prompt(self) -> tuple[str, list[int], int]:
        """The prompt's text and tokens, the oldest turns left out if the conversation outgrew the context."""
        backend, session = self.backend, self.session
        rendered: dict[int, tuple[str, list[int]]] = {}

        def count(messages: list[Message]) -> int:
            text = backend._format.render(messages, session.bos_text, session.eos_text)
            rendered[len(messages)] = text, backend._prompt_tokens(text)
            return len(rendered[len(messages)][1]) + len(self.forced)

        _, params = self.request.params.snapshot()
        fitted = fit_context(self.request.messages, count, session.n_ctx, params.max_tokens)
        text, tokens = rendered[len(fitted.messages)]
        return text, tokens, fitted.dropped_turns

    def retune_threads(self) -> None:
        """Follow the machine's load: fewer threads while other processes keep cores busy."""
        governor = self.backend.threads
        if governor.retune():
            self.session.set_threads(governor.threads)

    def run(self) -> None:
        """The reply; an output format's grammar first, so a bad one is the reply's only event."""
        output = self.request.format
        self.constraint = Constraint(self.session, output) if output.constrained else None
        try:
            if self.constraint is not None:
                self.constraint.accept_given(self.forced)
            self._write()
        finally:
            if self.constraint is not None:
                self.constraint.free()

    def _write(self) -> None:
        session, disk = self.session, self.backend._disk
        self.retune_threads()
        self.restored = disk.restore(session, self.context) if disk is not None else None
        self.cached = session.keep_prefix(self.context)
        session.reset_perf()
        try:
            self._prefill()
        except PrefillAborted:
            self._finish("cancelled", StopScanner(), Utf8Stream())
            return
        if disk is not None:
            disk.observe_prefill(len(self.context) - self.cached, self.prefill_s)
        scanner = StopScanner(self.request.params.snapshot()[1].stop + self.implicit_stops)
        utf8 = Utf8Stream()
        reason = self._replay_forced(scanner, utf8) or self._decode(scanner, utf8)
        self._finish(reason, scanner, utf8)

    def _prefill(self) -> None:
        todo = self.context[self.cached :]
        started = time.perf_counter()

        def progress(done: int) -> None:
            ids = tuple(self.context) if done == 0 else ()
            self.stream.put(PromptProgress(done, len(todo), time.perf_counter() - started, ids))
            self.retune_threads()

        progress(0)
        self.session.prefill(todo, progress, self.stream.cancelled.is_set)
        self.prefill_s = time.perf_counter() - started

    def _replay_forced(self, scanner: StopScanner, utf8: Utf8Stream) -> StopReason | None:
        """A branch's given tokens become the start of the reply text, as if they had been drawn."""
        session, stream = self.session, self.stream
        for token in self.forced:
            self.generated.append(token)
            if session.is_end_of_generation(token):
                self.ends.append(None)
                stream.put(Token(token, "", time.perf_counter(), -1, forced=True))
                return "eos"
            decoded = utf8.decode(session.piece(token))
            delta = scanner.feed(decoded)
            self.ends.append(len(scanner.text) if not utf8.pending else None)
            stream.put(Token(token, delta, time.perf_counter(), -1, decoded, forced=True))
            if scanner.stopped:
                return "stop"
        return None

    def _decode(self, scanner: StopScanner, utf8: Utf8Stream) -> StopReason:
        session, stream, live = self.session, self.stream, self.request.params
        shown = self.request.top_logprobs or self.request.xray
        quick = self.backend._quick
        governor = self.backend.threads
        sampler = None
        version = -1
        next_metrics = 0.0
        try:
            while True:
                if stream.cancelled.is_set():
                    return "cancelled"
                if live.version != version:
                    version, params = live.snapshot()
                    if sampler is not None:
                        session.free_sampler(sampler)
                    seed = params.seed if params.seed >= 0 else random.getrandbits(32)
                    sampler = session.new_sampler(params, seed)
                    scanner.stops = params.stop + self.implicit_stops
                if len(self.generated) >= params.max_tokens + self.allowance:
                    return "length"
                token, seen, stages = self._draw(sampler, params)
                now = time.perf_counter()
                prob, top, pool, mask = seen.prob, seen.top, seen.pool, seen.mask
                self.first_at = self.first_at or now
                self.last_at = now
                self.generated.append(token)
                self.drawn += 1
                if session.is_end_of_generation(token):
                    self.ends.append(None)
                    stream.put(Token(token, "", now, version, "", prob, top, pool, stages=stages, grammar=mask))
                    return "eos"
                decoded = utf8.decode(session.piece(token))
                delta = scanner.feed(decoded)
                self.ends.append(len(scanner.text) if not utf8.pending else None)
                if delta and self.visible_at is None:
                    self.visible_at = now
                stream.put(Token(token, delta, now, version, decoded if shown else "", prob, top, pool,
                                 stages=stages, grammar=mask))
                if scanner.stopped:
                    return "stop"
                if len(self.generated) >= params.max_tokens + self.allowance:
                    return "length"
                if len(session.tokens) + 1 >= session.n_ctx:
                    return "context"
                if quick:
                    self.backend._run_quick()
                session.step(token)
                if now >= next_metrics:
                    stream.put(Metrics(self.metrics()))
                    next_metrics = now + METRICS_INTERVAL_S
                if time.monotonic() >= governor.next_check:
                    self.retune_threads()
        finally:
            if sampler is not None:
                session.free_sampler(sampler)

    def _draw(self, sampler: Chain, params: SamplingParams) -> tuple[int, Inspection, tuple[Stage, ...]]:
        """The next token from the chain, within the output format's grammar if there is one, and what
        the inspector and the X-ray record of it when they are on (nothing otherwise)."""
        session, constraint, top_n = self.session, self.constraint, self.request.top_logprobs
        replay = sampler.clone() if self.request.xray else None
        token = session.sample(sampler) if constraint is None else constraint.draw(sampler, session.logits())
        judge = constraint.judge if constraint is not None else None
        seen = session.inspect(token, top_n, params, judge) if top_n else _UNSEEN
        if constraint is not None:
            constraint.accept(token)
        return token, seen, self._stages(replay, token) if replay is not None else ()

    def _stages(self, replay: Chain, token: int) -> tuple[Stage, ...]:
        """The X-ray of the token just drawn, from a clone of the chain taken before the draw."""
        try:
            return stage_cuts(replay, self.session.logits(), token)
        finally:
            replay.free()

    def _finish(self, reason: StopReason, scanner: StopScanner, utf8: Utf8Stream) -> None:
        scanner.feed(utf8.flush())
        scanner.flush()
        text = scanner.visible
        kept = kept_token_count(self.ends, len(text))
        self.backend._history_text = self.prompt_text + scanner.text[: self.ends[kept - 1]] if kept else self.prompt_text
        self.backend._history_tokens = self.prompt + self.generated[:kept]
        self.backend._last_prompt = (self.prompt_text, self.prompt)
        metrics = self.metrics()
        incomplete = self.constraint is not None and reason != "eos" and not self.constraint.can_end()
        self.stream.put(Done(reason, text, metrics, tuple(self.context), incomplete))

    def metrics(self) -> TurnMetrics:
        first = self.visible_at or self.first_at
        restored = self.cached if self.restored else 0
        rate = self.restored.prefill_tok_s if self.restored else None
        return TurnMetrics(
            prompt_tokens=len(self.context),
            cached_tokens=self.cached,
            completion_tokens=self.drawn,
            ttft_s=None if first is None else first - self.request.submitted_at,
            prefill_s=self.prefill_s,
            decode_s=0.0 if self.first_at is None else self.last_at - self.first_at,
            context_tokens=len(self.session.tokens),
            n_ctx=self.session.n_ctx,
            dropped_turns=self.dropped_turns,
            threads=self.session.threads.decode,
            restored_tokens=restored,
            restore_s=self.restored.seconds if self.restored else 0.0,
            restore_avoided_s=restored / rate if rate else None,
            grammar_s=self.constraint.spent_s if self.constraint is not None else 0.0,
        )
