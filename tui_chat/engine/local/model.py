"""A model as the backend holds it once loaded: the llama.cpp session, its prompt format, what the engine reads of
its vocabulary (thinking and call markers), the draft model beside it and the KV cache on disk."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..base import EngineError, LoadProgress, Message, ModelInfo, Stream
from ..models import check_gguf
from ..prompts import PromptError, PromptFormat, choose_format
from .cpu import ThreadGovernor
from .cpu_path import ProbeResult, choose as choose_cpu_path, on_trial, run_probe
from .draft import KINDS as DRAFTERS, Drafter, ModelDrafter, NgramDrafter, check_vocabulary
from .embed import Embeddings
from .ggml import build_features, build_version, device_memory
from .kvcache import DiskCache, open_disk_cache
from .llamacpp import LlamaSession, quantization_of
from .settings import LlamaSettings

PREFILL_CHUNK = 256


@dataclass(frozen=True)
class LoadedModel:
    session: LlamaSession
    format: PromptFormat
    markers: dict[int, bytes]  # control tokens of the thinking and call markers, read as their text
    end_thinking: list[int]  # the tokens the engine writes to end a thinking past its budget
    opens_thinking: frozenset[int]  # the token a reply opens its thinking with, if one
    draft: LlamaSession | None  # the draft model, with a KV cache of its own
    ngram: bool  # drafting by prompt lookup
    disk: DiskCache | None

    def new_drafter(self, tokens: list[int]) -> Drafter | None:
        """A reply's drafter over the text so far (None: drafting is off)."""
        if self.draft is not None:
            return ModelDrafter(self.draft, tokens)
        return NgramDrafter(tokens) if self.ngram else None

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
        self.session.close()


def open_model(settings: LlamaSettings, threads: ThreadGovernor, embeddings: Embeddings, name: str,
               stream: Stream) -> LoadedModel:
    """The model of `settings` with all that goes with it, its progress on `stream`; an `EngineError` or a
    `PromptError` in one line, with nothing left open."""
    header = check_gguf(settings.path)  # read once for the load: the check, the CPU path and the KV key
    cpu_path = choose_cpu_path(settings.extra_buffers, settings.path, header.tensor_types, settings.cache_dir,
                               build_features(), probe=_announced_probe(stream))
    with on_trial(cpu_path, settings.cache_dir):  # a death in here: the next load takes the safe path
        session = LlamaSession(
            settings.path,
            n_ctx=settings.n_ctx,
            gpu_layers=settings.resolved_gpu_layers,
            n_batch=PREFILL_CHUNK,
            threads=threads.threads,
            cpu_path=cpu_path,
            on_progress=lambda fraction: _report_load(stream, fraction),
            backend_sampling=settings.backend_sampling,
        )
    try:
        prompt_format = choose_format(settings.chat_template, session.chat_template())
        _warm_template(prompt_format, session)
        draft = _open_draft_model(settings, session, threads)
    except (EngineError, PromptError):
        session.close()
        raise
    try:
        embeddings.open(session, name, settings.resolved_gpu_layers)  # a dedicated model that fails, fails the load
    except EngineError:
        if draft is not None:
            draft.close()
        session.close()
        raise
    thinking, calls = prompt_format.thinking, prompt_format.calls
    opens = session.tokenize(thinking.open, add_bos=False) if prompt_format.names_thinking else []
    return LoadedModel(
        session=session,
        format=prompt_format,
        markers=_marker_pieces(session, (thinking.open, thinking.close, *(calls.markers if calls else ()))),
        end_thinking=session.continuation(thinking.close),
        opens_thinking=frozenset(opens) if len(opens) == 1 else frozenset(),
        draft=draft,
        ngram=settings.draft == "ngram",
        disk=open_disk_cache(settings.kv_dir, settings.kv_budget_bytes, session, settings.path, header,
                             build_version()),
    )


def describe(model: LoadedModel, settings: LlamaSettings, name: str) -> ModelInfo:
    """What the app shows of a loaded model."""
    session, prompt_format = model.session, model.format
    description = session.description()
    return ModelInfo(
        name=name,
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


def _open_draft_model(settings: LlamaSettings, session: LlamaSession, threads: ThreadGovernor) -> LlamaSession | None:
    """The draft model named by `draft`, loaded beside the model on the same threads; one that does not share its
    vocabulary is refused in one line."""
    if settings.draft in DRAFTERS:
        return None
    path = Path(settings.draft).expanduser()
    try:
        draft = LlamaSession(path, n_ctx=session.n_ctx, gpu_layers=settings.resolved_gpu_layers,
                             n_batch=PREFILL_CHUNK, threads=threads.threads, cpu_path=session.cpu_path)
    except EngineError as error:
        raise EngineError(f"the draft model: {error}") from None
    try:
        check_vocabulary(draft, session, path)
    except EngineError:
        draft.close()
        raise
    return draft


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


def _single_tokens(session: LlamaSession, markers: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """The markers that are one token of the model's vocabulary, with its id: a grammar names them by id, as
    LLGuidance reads an added token (Qwen's `<tool_call>`, Mistral's `[TOOL_CALLS]`) as special, never as text."""
    found = ((marker, session.tokenize(marker, add_bos=False)) for marker in markers)
    return tuple((marker, tokens[0]) for marker, tokens in found if len(tokens) == 1)
