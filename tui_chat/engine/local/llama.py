"""The in-process llama.cpp backend: one worker thread owns the model; requests in, events out."""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TypedDict

from ..base import (
    Done,
    Embedded,
    EngineError,
    Error,
    GrammarMask,
    Loaded,
    LoadProgress,
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
from ..context import fit_context
from ..formats import FormatError, OutputFormat
from ..models import check_gguf
from ..params import SamplingParams
from ..prompts import PromptError, PromptFormat, choose_format, opens_thinking
from ..reasoning import ReplyText, ThinkingSplitter
from ..stops import StopScanner
from . import logs
from .chain import Chain
from .cpu import ThreadGovernor
from .cpu_path import ProbeResult, choose as choose_cpu_path, on_trial, run_probe
from .draft import KINDS as DRAFTERS, DraftController, Drafter, ModelDrafter, NgramDrafter, check_vocabulary
from .embed import Embeddings
from .ggml import build_features, build_version, device_memory
from .grammar import Constraint, FormatStuck, check_format
from .inspector import Inspection, Later
from .kvcache import DiskCache, Restored, open_disk_cache
from .llamacpp import LlamaSession, PrefillAborted, quantization_of
from .settings import LlamaSettings
from .xray import word_probability, xray_at

METRICS_INTERVAL_S = 0.1
PREFILL_CHUNK = 256
_UNSEEN = Inspection(None, (), None)  # a token drawn with the inspector off
Seen = Inspection | Later  # the inspector's figures of a token, or their promise (`inspect_later`)


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
        self._draft_session: LlamaSession | None = None  # the draft model, with a KV cache of its own
        self._disk: DiskCache | None = None
        self._format: PromptFormat | None = None
        self._markers: dict[int, bytes] = {}  # control tokens of the thinking and call markers, read as their text
        self._end_thinking: list[int] = []  # the tokens the engine writes to end a thinking past its budget
        self._opens_thinking: frozenset[int] = frozenset()  # the token a reply opens its thinking with, if one
        self._history_text = ""
        self._history_tokens: list[int] = []
        self._last_prompt: tuple[str, list[int]] = ("", [])
        self._drafting: DraftController | None = None  # the last reply's: what it measured carries to the next
        self._session_lock = threading.Lock()
        self._embeddings = Embeddings(settings.embeddings, settings.embeddings_name)  # a context of their own
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
        """Why `token` was drawn after `context` (`probe.position_context`) under `params` (the settings it
        was drawn with: `LiveParams.at(token.params_version)`): ends with an `XRay` or an `Error`.
        Runs between two tokens when a reply is being written."""
        context = tuple(context)
        return self._quick_job(lambda session: xray_at(session, context, token, params))

    def word_probability(self, context: Sequence[int], text: str) -> Stream:
        """The probability that the model writes `text` right after `context`: ends with a
        `WordProbability` or an `Error`. Runs between two tokens when a reply is being written."""
        context = tuple(context)
        return self._quick_job(lambda session: word_probability(session, context, text))

    def check_format(self, output: OutputFormat) -> str:
        """Raises FormatError where `output` cannot be used with this model, so that a command refuses it
        as the user's input (exit 2) before a reply starts; returns what of it is only checked when a reply
        is done (a note, "" when none). Compiling a format only reads the vocabulary, so no worker hop."""
        with self._session_lock:
            if self._session is None:
                raise EngineError("no model is loaded")
            return check_format(self._session, output)

    def count_tokens(self, text: str) -> int:
        """Tokens `text` takes in this model."""
        return len(self.tokenize(text))

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens in this model, no BOS; tokenizing only reads the vocabulary, so no worker hop."""
        with self._session_lock:
            if self._session is None:
                raise EngineError("no model is loaded")
            return self._session.tokenize(text, add_bos=False)

    def embed(self, texts: Sequence[str]) -> Embedded:
        """Texts' pooled embeddings (`Embedding`), read in a context of their own (embed.py) on the caller's thread,
        beside whatever the worker decodes; an `InputRefused` for a text longer than that context."""
        return self._embeddings.embed(texts, self.threads.threads)

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
        self._close_draft_model()
        self._embeddings.close()
        with self._session_lock:
            if self._session is not None:
                self._session.close()
                self._session = None

    def _load(self, stream: Stream) -> None:
        settings = self.settings
        try:
            self._embeddings.close()  # before the model they read goes
            with self._session_lock:
                if self._session is not None:
                    self._session.close()
                    self._session = None
            self._disk = None
            self._close_draft_model()
            header = check_gguf(settings.path)  # read once for the load: the check, the CPU path and the KV key
            cpu_path = choose_cpu_path(settings.extra_buffers, settings.path, header.tensor_types, settings.cache_dir,
                                       build_features(), probe=_announced_probe(stream))
            with on_trial(cpu_path, settings.cache_dir):  # a death in here: the next load takes the safe path
                session = LlamaSession(
                    settings.path,
                    n_ctx=settings.n_ctx,
                    gpu_layers=settings.resolved_gpu_layers,
                    n_batch=PREFILL_CHUNK,
                    threads=self.threads.threads,
                    cpu_path=cpu_path,
                    on_progress=lambda fraction: _report_load(stream, fraction),
                    backend_sampling=settings.backend_sampling,
                )
            try:
                prompt_format = choose_format(settings.chat_template, session.chat_template())
            except PromptError:
                session.close()
                raise
            _warm_template(prompt_format, session)
            self._open_draft_model(session)
            self._open_embeddings(session)
        except (EngineError, PromptError) as error:
            cancelled = stream.cancelled.is_set()
            stream.put(Error(f"loading {settings.path.name} was cancelled" if cancelled else str(error)))
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
            thinking=prompt_format.thinking.label if prompt_format.names_thinking else "",
            thinking_switch=prompt_format.thinking_switch,
            draft="" if settings.draft == "off" else Path(settings.draft).name,  # "ngram" stays itself
            tool_syntax=prompt_format.calls.family if prompt_format.calls else "",
            call_tokens=_single_tokens(session, prompt_format.calls.markers) if prompt_format.calls else (),
            memory=device_memory(session.allocated),
        )
        self._disk = open_disk_cache(settings.kv_dir, settings.kv_budget_bytes, session, settings.path, header,
                                     build_version())
        with self._session_lock:
            self._session = session
        self._format = prompt_format
        calls = prompt_format.calls
        self._markers = _marker_pieces(session, (prompt_format.thinking.open, prompt_format.thinking.close,
                                                 *(calls.markers if calls else ())))
        self._end_thinking = session.continuation(prompt_format.thinking.close)
        opens = session.tokenize(prompt_format.thinking.open, add_bos=False) if prompt_format.names_thinking else []
        self._opens_thinking = frozenset(opens) if len(opens) == 1 else frozenset()
        self._history_text, self._history_tokens = "", []
        self._last_prompt = ("", [])
        self._drafting = None
        stream.put(Loaded(self.info))

    def _open_draft_model(self, session: LlamaSession) -> None:
        """The draft model named by `draft`, loaded beside the model on the same threads; one that does not share
        its vocabulary is refused in one line (the model is closed too: the load fails as a whole)."""
        if self.settings.draft in DRAFTERS:
            return
        path = Path(self.settings.draft).expanduser()
        try:
            draft = LlamaSession(path, n_ctx=session.n_ctx, gpu_layers=self.settings.resolved_gpu_layers,
                                 n_batch=PREFILL_CHUNK, threads=self.threads.threads, cpu_path=session.cpu_path)
        except EngineError as error:
            session.close()
            raise EngineError(f"the draft model: {error}") from None
        try:
            check_vocabulary(draft, session, path)
        except EngineError:
            draft.close()
            session.close()
            raise
        self._draft_session = draft

    def _open_embeddings(self, session: LlamaSession) -> None:
        """The embeddings follow the model; a dedicated embedding model that cannot load fails the load as a whole."""
        try:
            self._embeddings.open(session, self.name, self.settings.resolved_gpu_layers)
        except EngineError:
            self._close_draft_model()
            session.close()
            raise

    def _close_draft_model(self) -> None:
        if self._draft_session is not None:
            self._draft_session.close()
            self._draft_session = None

    def new_drafter(self, tokens: list[int]) -> Drafter | None:
        """This turn's drafter over the text so far (None: drafting is off)."""
        if self._draft_session is not None:
            return ModelDrafter(self._draft_session, tokens)
        return NgramDrafter(tokens) if self.settings.draft == "ngram" else None

    def _generate(self, request: Request, stream: Stream, turn: TurnMaker | None = None) -> None:
        """A reply; or, with `turn`, a turn of another shape that builds on the reply's (the lab's)."""
        try:
            session, prompt_format = self._session, self._format
            if session is None or prompt_format is None:
                raise EngineError("no model is loaded")
            if self._disk is not None:
                self._disk.start_turn()
            (turn or _Turn)(self, session, prompt_format, request, stream).run()
        except (EngineError, PromptError, FormatError) as error:
            stream.put(Error(str(error)))
            return
        # After Done, so the reply is not kept waiting. Not for a lab (it leaves the conversation's cache at its
        # prompt), nor for a reply no chat keeps (`run` without --save): its state would only fill the disk
        if self._disk is not None and turn is None and request.conversation:
            self._disk.save(session, request.conversation, (self._history_text, self._history_tokens),
                            self._last_prompt)

    def _prompt_tokens(self, session: LlamaSession, text: str) -> list[int]:
        """Tokens for the rendered prompt, keeping the tokens the model saw last turn as they were.

        Re-tokenizing the whole transcript can merge the end of the last reply differently from how it
        was generated, which would break prefix reuse right at the turn boundary. A regenerated or
        branched reply starts from the last prompt itself; a chat reopened from disk, from the transcript
        saved with its KV state.
        """
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


def _warm_template(prompt_format: PromptFormat, session: LlamaSession) -> None:
    """Render a message once at load, as llama.cpp's tools warm up: Jinja compiles a template at its first render
    (~9 ms on the starter's), which the first reply's time to its first token would otherwise pay."""
    with contextlib.suppress(PromptError):
        prompt_format.render([Message("user", "Hello")], session.bos_text, session.eos_text,
                             prompt_format.options(True, ()))


def _report_load(stream: Stream, fraction: float) -> bool:
    stream.put(LoadProgress(fraction))
    return not stream.cancelled.is_set()


def _marker_pieces(session: LlamaSession, markers: tuple[str, ...]) -> dict[int, bytes]:
    """Control tokens print nothing, yet some families mark their thinking (`<|START_THINKING|>`, gpt-oss's
    `<|end|>`) or their tool calls (Mistral's `[TOOL_CALLS]`) with them: those tokens are read as their text,
    so the markers can be seen in a reply."""
    pieces: dict[int, bytes] = {}
    for marker in markers:
        for token in session.tokenize(marker, add_bos=False):
            if not session.piece(token) and (text := session.special_text(token)):
                pieces[token] = text.encode("utf-8")
    return pieces


TurnMaker = Callable[[LlamaBackend, LlamaSession, PromptFormat, Request, Stream], "_Turn"]


def _single_tokens(session: LlamaSession, markers: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """The markers that are one token of the model's vocabulary, with its id: a grammar names them by id, as
    LLGuidance reads an added token (Qwen's `<tool_call>`, Mistral's `[TOOL_CALLS]`) as special, never as text."""
    found = ((marker, session.tokenize(marker, add_bos=False)) for marker in markers)
    return tuple((marker, tokens[0]) for marker, tokens in found if len(tokens) == 1)


class _TokenFacts(TypedDict):
    forced: bool
    stages: tuple[Stage, ...]
    grammar: GrammarMask | None
    inserted: bool
    drafted: bool
    rejected: str


class _Turn:
    """One reply: prompt, prefill with progress, then the decode loop that reads params every token.

    A reasoning model's thinking is split from its answer as the tokens come (`ReplyText`); once it has
    thought for its budget, the engine writes the end of the thinking itself and the model answers. An
    output format's grammar governs the answer only: the thinking is drawn free of it.

    Speculative decoding (draft.py): instead of one step, the token just drawn and a draft of the tokens
    guessed to follow it are decoded in one batch; the loop then draws row by row, exactly as it would
    have drawn each token alone, keeping the guesses it draws and stopping at the first it does not (that
    draw is the correction). So every token is a true draw of the target, a seeded reply draws the same
    random numbers, and stops, the grammar, the thinking budget, live settings and Esc act token by token
    as without a draft. The cells of the guesses not kept are dropped from the cache (`_settle`).
    """

    drafts = True  # the lab's turns say no: their columns step together, a row each
    overlaps_inspector = True  # its figures may come a decode later; rows of one decode (the lab's, slots') share one

    def __init__(self, backend: LlamaBackend, session: LlamaSession, prompt_format: PromptFormat, request: Request,
                 stream: Stream, fitted: tuple[str, list[int], int] | None = None) -> None:
        self.backend = backend
        self.session = session
        self.format = prompt_format
        self.request = request
        self.stream = stream
        self.started_at = time.perf_counter()
        self.template_s = self.tokenize_s = self.prefix_s = 0.0  # parts of the time to the first token
        self.implicit_stops = prompt_format.implicit_stops
        self.shown = bool(request.top_logprobs or request.xray)  # each token's own text goes with it
        self.forced = list(request.forced)
        self.allowance = len(self.forced) if request.continuing else 0  # tokens beyond max tokens
        # the prompt's text, tokens and turns left out: a lab's columns take the lab's
        self.prompt_text, self.prompt, self.dropped_turns = fitted or self._fitted_prompt()
        self.inside = opens_thinking(self.prompt_text, prompt_format.thinking)  # the prompt opened the thinking
        self.context = self.prompt + self.forced  # all the model reads before its first new token
        self.cached = 0
        self.restored: Restored | None = None
        self.prefill_s = 0.0
        self.generated: list[int] = []
        self.drawn = 0  # generated tokens the model chose (a branch's forced ones excluded)
        self.inserted = 0  # generated tokens the engine wrote: the end of a thinking past its budget
        self.text = self._new_text()
        self.first_at: float | None = None
        self.visible_at: float | None = None
        self.last_at: float | None = None
        self.decode_at: float | None = None  # when the reply's first token came due
        self.thought_at: float | None = None  # when its thinking ended
        self.constraint: Constraint | None = None
        self.stuck = ""  # why the output format's engine allowed no next token, where it did not
        self.later: Later | None = None  # the inspector's figures for the token event `held`
        self.held: Callable[..., Token] | None = None  # its event, to be made with them
        self.drafter = backend.new_drafter(self.prompt) if self.drafts else None
        self.control = DraftController.after(backend._drafting)
        self.guesses: list[int] = []  # the draft being walked: row i of the batch is drawn against guesses[i]
        self.kept = 0  # of them, those drawn as guessed so far
        self.cycle_at: float | None = None  # when the last step or verification started
        self.sampling_path = "python"  # where the current chain draws: "llama.cpp" (in its graph) or "python"

    def _fitted_prompt(self) -> tuple[str, list[int], int]:
        """The prompt's text and tokens, the oldest turns left out if the conversation outgrew the context."""
        backend, session = self.backend, self.session
        rendered: dict[int, tuple[str, list[int]]] = {}
        extra = self.format.options(self.request.thinking, self.request.tools)

        def count(messages: list[Message]) -> int:
            started = time.perf_counter()
            text = self.format.render(messages, session.bos_text, session.eos_text, extra)
            rendered_at = time.perf_counter()
            rendered[len(messages)] = text, backend._prompt_tokens(session, text)
            self.template_s += rendered_at - started
            self.tokenize_s += time.perf_counter() - rendered_at
            return len(rendered[len(messages)][1]) + len(self.forced)

        _, params = self.request.params.snapshot()
        fitted = fit_context(self.request.messages, count, session.n_ctx, params.max_tokens)
        text, tokens = rendered[len(fitted.messages)]
        return text, tokens, fitted.dropped_turns

    def _new_text(self, stops: tuple[str, ...] = ()) -> ReplyText:
        return ReplyText(ThinkingSplitter(self.format.thinking, self.inside), StopScanner(stops))

    def _piece(self, token: int) -> bytes:
        return self.backend._markers.get(token) or self.session.piece(token)

    def retune_threads(self) -> None:
        """Follow the machine's load: fewer threads while other processes keep cores busy; the draft model's too,
        as it decodes on the same cores between the model's batches."""
        governor = self.backend.threads
        if governor.retune(step_ms=self.control.plain_ms):
            self.session.set_threads(governor.threads)
            if (draft := self.backend._draft_session) is not None:
                draft.set_threads(governor.threads)

    def run(self) -> None:
        """The reply; an output format's grammar first, so a bad one is the reply's only event."""
        output = self.request.format
        opening = self.backend._opens_thinking if not self.inside and not self.forced else frozenset()
        self.constraint = Constraint(self.session, output, opening) if output.constrained else None
        if self.constraint is not None:
            self.constraint.accept_given(self._given_answer())
        self._write()

    def _given_answer(self) -> list[int]:
        """A branch's given tokens that the grammar governs: those after the thinking."""
        text = self._new_text()
        for index, token in enumerate(self.forced):
            if not text.splitter.thinking:
                return self.forced[index:]
            text.add(self._piece(token))
        return []

    def _write(self) -> None:
        session, disk = self.session, self.backend._disk
        self.retune_threads()
        self.restored = disk.restore(session, self.context) if disk is not None else None
        matching = time.perf_counter()
        self.cached = session.keep_prefix(self.context)
        self.prefix_s = time.perf_counter() - matching
        session.reset_perf()
        self.text = self._new_text(self.request.params.snapshot()[1].stop + self.implicit_stops)
        try:
            self._prefill()
        except PrefillAborted:
            self._finish("cancelled")
            return
        if disk is not None:
            disk.observe_prefill(len(self.context) - self.cached, self.prefill_s)
        self.decode_at = time.perf_counter()
        try:
            reason = self._replay_forced() or self._decode()
        except FormatStuck as stuck:
            reason, self.stuck = "format", str(stuck)
        self._finish(reason)

    def _prefill(self) -> None:
        todo = self.context[self.cached :]
        started = time.perf_counter()

        def progress(done: int) -> None:
            ids = tuple(self.prompt) if done == 0 else ()
            self.stream.put(PromptProgress(done, len(todo), time.perf_counter() - started, ids))
            self.retune_threads()

        progress(0)
        self.session.prefill(todo, progress, self.stream.cancelled.is_set)
        self.prefill_s = time.perf_counter() - started

    def _replay_forced(self) -> StopReason | None:
        """A branch's given tokens become the start of the reply text, as if they had been drawn."""
        for token in self.forced:
            reason = self._take(token, time.perf_counter(), -1, _UNSEEN, forced=True)
            if reason is not None:
                return reason
        return None

    def _decode(self) -> StopReason:
        session, stream, live = self.session, self.stream, self.request.params
        quick = self.backend._quick
        governor = self.backend.threads
        sampler: Chain | None = None
        version = -1
        in_graph = False  # the chain is to be attached after its first draw
        next_metrics = 0.0
        try:
            while True:
                if stream.cancelled.is_set():
                    return "cancelled"
                if live.version != version or sampler is None:
                    self._settle()
                    version, params = live.snapshot()
                    if self.drafter is not None:
                        self.control.limit = params.draft_max
                    if sampler is not None:
                        self._drop_sampler(sampler)
                    seed = params.seed if params.seed >= 0 else random.getrandbits(32)
                    sampler = session.new_sampler(params, seed)
                    in_graph = self._draws_in_graph()
                    self.sampling_path = "python"
                    self.text.scanner.stops = params.stop + self.implicit_stops
                if len(self.generated) >= params.max_tokens + self.allowance:
                    return "length"
                if self._budget_spent(params):
                    self._settle()
                    reason = self._end_thinking(sampler, version, params)
                    if reason is not None:
                        return reason
                    continue
                token, seen, stages = self._draw(sampler, params)
                if in_graph:  # after its first draw, on the host from the logits row: llama.cpp draws the rest
                    in_graph = False
                    self.sampling_path = "llama.cpp" if session.attach(sampler) else "python"
                now = time.perf_counter()
                self.first_at = self.first_at or now
                self.last_at = now
                self.drawn += 1
                guess = self.guesses[session.row] if self.guesses and session.row < len(self.guesses) else None
                self.kept += token == guess
                reason = self._take(token, now, version, seen, stages, drafted=token == guess,
                                    rejected=guess if guess is not None and token != guess else None
                                    ) or self._no_room(params)
                if reason is not None:
                    return reason
                if token == guess:  # kept: it is in the cache already, and the batch has the next row
                    session.row += 1
                    continue
                self._settle(now)
                if quick:
                    self.backend._run_quick()
                self._advance(token, params)
                if now >= next_metrics:
                    self._flush()
                    stream.put(Metrics(self.metrics()))
                    next_metrics = now + METRICS_INTERVAL_S
                if time.monotonic() >= governor.next_check:
                    self.retune_threads()
        finally:
            self._flush()
            self._settle()
            self.backend._drafting = self.control
            if sampler is not None:
                session.free_sampler(sampler)

    def _draws_in_graph(self) -> bool:
        """Whether this reply's chains are offered to llama.cpp to draw in its graph (`LlamaSession.attach`, which
        takes those it can): not where the host reads the model's logits row (the inspector, the X-ray, an output
        format's grammar), nor with a draft, whose verification asks several rows of the sequence (llama.cpp draws
        one a sequence a decode)."""
        request = self.request
        return not (request.top_logprobs or request.xray or self.constraint is not None or self.drafter is not None)

    def _drop_sampler(self, sampler: Chain) -> None:
        """Free the chain that settings changed mid-reply replace; where it drew in llama.cpp's graph, the last
        token is read again, so that the new one draws its first token from the logits row."""
        attached = sampler.seq is not None
        self.session.free_sampler(sampler)
        if attached:
            self.session.reread_last()

    def _advance(self, token: int, params: SamplingParams) -> None:
        """Put the token just drawn into the cache: with a draft of what follows it where the drafter has one
        and the controller says drafting pays now (one batch), else alone (one step)."""
        session = self.session
        room = min(session.n_ctx - len(session.tokens) - 2,
                   params.max_tokens + self.allowance - len(self.generated))
        size = min(self.control.next_size(), room)
        self.cycle_at = time.perf_counter()
        draft = self.drafter.propose(size) if self.drafter is not None and size > 0 else []
        if draft:
            session.verify([token, *draft])
            self.guesses = draft
        else:
            session.step(token)

    def _settle(self, now: float | None = None) -> None:
        """Time the step or verification whose rows were just drawn, and drop from the cache the cells of the
        guesses not kept. `now`: the row's draw ended a verification (or a step) the usual way, so it is timed;
        without it, something else cut it short (the reply ended, a setting changed, the thinking's budget)."""
        if self.guesses:
            self.session.truncate(self._cached())
        if now is not None and self.cycle_at is not None:
            if self.guesses:
                self.control.verified(len(self.guesses), self.kept, now - self.cycle_at)
            else:
                self.control.plain(now - self.cycle_at)
        elif self.guesses:
            self.control.stopped(len(self.guesses), self.kept)
        self.guesses, self.kept = [], 0
        self.cycle_at = None

    def _take(self, token: int, now: float, version: int, seen: Seen, stages: tuple[Stage, ...] = (), *,
              forced: bool = False, inserted: bool = False, drafted: bool = False,
              rejected: int | None = None) -> StopReason | None:
        """A token joins the reply: its text, split into thinking and answer, and its event. Returns why the
        reply ends with it, if it does. `drafted`: a guess of the draft, kept; `rejected`: the guess this token
        replaced (a correction). With the inspector's figures still to come, the event waits for them: it goes
        out before the next event (`_flush`), one decode later."""
        self._flush()
        if isinstance(seen, Later):
            self.later = seen
            seen = _UNSEEN
        self.generated.append(token)
        if self.drafter is not None:
            self.drafter.add(token)
        events: _TokenFacts = {"forced": forced, "stages": stages, "grammar": seen.mask, "inserted": inserted,
                               "drafted": drafted, "rejected": "" if rejected is None else self._guess_text(rejected)}
        named = self.shown or forced  # the token's own text (or a special token's name) goes with it
        if self.session.is_end_of_generation(token):
            self.text.add_end()
            self._put_token(seen, partial(Token, token, "", now, version, "", thinking=self._thinking(),
                                          special=self.session.special_text(token) if named else "", **events))
            return "eos"
        piece = self._piece(token)
        special = self.session.special_text(token) if named and not piece else ""
        decoded, thought, shown = self.text.add(piece)
        if (thought or shown) and self.visible_at is None and not forced:
            self.visible_at = now
        if self.thought_at is None and self.text.splitter.opened and not self.text.splitter.thinking:
            self.thought_at = now
        self._put_token(seen, partial(Token, token, shown, now, version, decoded if named else "", reasoning=thought,
                                      thinking=self._thinking(), special=special, **events))
        return "stop" if self.text.scanner.stopped else None

    def _put_token(self, seen: Inspection, event: Callable[..., Token]) -> None:
        """The token's event, made with the inspector's figures: now, or when they come (`later`)."""
        if self.later is None:
            self.stream.put(event(prob=seen.prob, top=seen.top, pool=seen.pool))
        else:
            self.held = event

    def _flush(self) -> None:
        """The token event waiting for the inspector's figures, with them: out before any later event."""
        if self.held is not None and self.later is not None:
            seen = self.later.result()
            self.stream.put(self.held(prob=seen.prob, top=seen.top, pool=seen.pool))
        self.held = self.later = None

    def _guess_text(self, token: int) -> str:
        return self._piece(token).decode("utf-8", errors="replace") or self.session.special_text(token)

    def _thinking(self) -> bool:
        """Whether the token just taken belongs to the thinking, as far as is known now."""
        splitter = self.text.splitter
        return splitter.opened and splitter.answer_at is None

    def _no_room(self, params: SamplingParams) -> StopReason | None:
        if len(self.generated) >= params.max_tokens + self.allowance:
            return "length"
        if self._cached() + 1 >= self.session.n_ctx:
            return "context"
        return None

    def _cached(self) -> int:
        """Cache cells up to the row being drawn from: those of a draft's guesses past it are not the reply's yet."""
        session = self.session
        return len(session.tokens) - len(self.guesses) + session.row if self.guesses else len(session.tokens)

    def _budget_spent(self, params: SamplingParams) -> bool:
        """Thinking off (or a budget) and the model is thinking past it, and the engine has not ended it yet.
        Counted from the start of the reply, where the thinking is."""
        budget = params.thinking_budget if self.request.thinking else 0
        return 0 <= budget <= len(self.generated) and self.text.splitter.thinking and not self.inserted

    def _end_thinking(self, sampler: Chain, version: int, params: SamplingParams) -> StopReason | None:
        """Write the template's end-of-thinking text as tokens, as if the model had; it then answers.
        With the inspector on, each carries what the model would have given it there."""
        top_n = self.request.top_logprobs
        for token in self.backend._end_thinking:
            seen = self.session.inspect(token, top_n, params) if top_n else _UNSEEN
            sampler.accept(token)
            self.inserted += 1
            reason = self._take(token, time.perf_counter(), version, seen, inserted=True) or self._no_room(params)
            if reason is not None:
                return reason
            self.session.step(token)
        return None

    def _draw(self, sampler: Chain, params: SamplingParams) -> tuple[int, Seen, tuple[Stage, ...]]:
        """The next token from the chain, within the output format's grammar if there is one (past the
        thinking), and what the inspector and the X-ray record of it when they are on (nothing otherwise). The
        inspector's figures of a plain draw come later (`inspect_later`): computed while the next token decodes."""
        session, top_n = self.session, self.request.top_logprobs
        constraint = None if self.text.splitter.thinking else self.constraint
        replay = sampler.clone() if self.request.xray else None
        recent = tuple(sampler.recent) if top_n and "penalties" in sampler.stages else ()  # the pool's, before this
        token = session.sample(sampler) if constraint is None else constraint.draw(sampler, session.logits())
        judge = constraint.judge if constraint is not None else None
        seen: Seen = _UNSEEN
        if top_n and judge is None and replay is None and self.overlaps_inspector:
            seen = session.inspect_later(token, top_n, params, recent)
        elif top_n:
            seen = session.inspect(token, top_n, params, recent, judge)
        if constraint is not None:
            constraint.accept(token)
        return token, seen, self._stages(replay, token) if replay is not None else ()

    def _stages(self, replay: Chain, token: int) -> tuple[Stage, ...]:
        """The X-ray of the token just drawn, from a clone of the chain taken before the draw."""
        try:
            return self.session.stage_reader.stages(replay, self.session.logits(), token)
        finally:
            replay.free()

    def _finish(self, reason: StopReason) -> None:
        text = self.text
        text.finish()
        kept = kept_token_count(text.ends, text.kept_chars)
        self.backend._history_text = self.prompt_text + text.raw[: text.ends[kept - 1]] if kept else self.prompt_text
        self.backend._history_tokens = self.prompt + self.generated[:kept]
        self.backend._last_prompt = (self.prompt_text, self.prompt)
        self.stream.put(self._done(reason))

    def _done(self, reason: StopReason) -> Done:
        """The reply's last event, once its text is finished."""
        text = self.text
        constraint = self.constraint
        incomplete, note = constraint.verdict(reason == "eos", text.scanner.visible) if constraint else (False, "")
        note = "; ".join(filter(None, (note, self.stuck)))
        return Done(reason, text.scanner.visible, self.metrics(), tuple(self.prompt), incomplete,
                    text.reasoning, text.answer_from(), note, stop_sequence=text.scanner.matched)

    def _thinking_figures(self) -> tuple[int, float | None]:
        """The tokens the model drew while thinking, and how long it thought (None: it did not)."""
        if not self.text.splitter.opened or self.decode_at is None:
            return 0, None
        thought = self.text.answer_from() - min(len(self.forced), self.text.answer_from()) - self.inserted
        until = self.thought_at or self.last_at or self.decode_at
        return max(thought, 0), until - self.decode_at

    def metrics(self) -> TurnMetrics:
        first = self.visible_at or self.first_at
        restored = self.cached if self.restored else 0
        rate = self.restored.prefill_tok_s if self.restored else None
        reasoning_tokens, thinking_s = self._thinking_figures()
        return TurnMetrics(
            prompt_tokens=len(self.context),
            cached_tokens=self.cached,
            completion_tokens=self.drawn,
            ttft_s=None if first is None else first - self.request.submitted_at,
            prefill_s=self.prefill_s,
            decode_s=0.0 if self.first_at is None or self.last_at is None else self.last_at - self.first_at,
            context_tokens=self._cached(),
            n_ctx=self.session.n_ctx,
            dropped_turns=self.dropped_turns,
            threads=self.session.threads.decode,
            restored_tokens=restored,
            restore_s=self.restored.seconds if self.restored else 0.0,
            queued_s=max(0.0, self.started_at - self.request.submitted_at),
            template_s=self.template_s,
            tokenize_s=self.tokenize_s,
            prefix_s=self.prefix_s,
            first_draw_s=0.0 if self.first_at is None or self.decode_at is None else self.first_at - self.decode_at,
            restore_avoided_s=restored / rate if rate else None,
            grammar_s=self.constraint.spent_s if self.constraint is not None else 0.0,
            reasoning_tokens=reasoning_tokens,
            thinking_s=thinking_s,
            draft_kind=("ngram" if isinstance(self.drafter, NgramDrafter) else "model") if self.drafter else "",
            drafted=self.control.drafted,
            draft_accepted=self.control.accepted,
            verifications=self.control.verifications,
            plain_ms_per_token=self.control.plain_ms,
            sampling_path=self.sampling_path,
        )
