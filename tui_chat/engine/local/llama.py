"""The in-process llama.cpp backend: one model behind one worker thread; requests in, events out.

The backend owns its worker (worker.py), the model once loaded (model.py) and the conversation's transcript
(transcript.py). A reply being written is a `Reply` (reply.py) the worker runs; the sampling lab (lab.py) and the
serving slots (slots.py) are collaborators that run their own shapes of reply on the same worker.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..base import Embedded, EngineError, Error, Loaded, ModelInfo, Request, Stream
from ..formats import FormatError, OutputFormat
from ..params import LiveParams, SamplingParams
from ..prompts import PromptError
from .cpu import ThreadGovernor
from .draft import DraftController
from .embed import Embeddings
from .grammar import check_format
from .lab import Lab
from .llamacpp import LlamaSession
from .model import LoadedModel, describe, open_model
from .reply import Reply, ReplyMaker
from .settings import LlamaSettings
from .slots import Slots
from .transcript import Transcript
from .worker import Worker
from .xray import word_probability, xray_at


class LlamaBackend:
    """Every public method is safe from any thread: each hands its work to the worker, or reads only the
    vocabulary (under the lock that guards which model is loaded)."""

    def __init__(self, settings: LlamaSettings, name: str | None = None) -> None:
        self.settings = settings
        self.name = name or settings.path.stem
        self.info: ModelInfo | None = None
        self.model: LoadedModel | None = None  # set on the worker, read by others under `_model_lock`
        self._model_lock = threading.Lock()
        self.transcript = Transcript()
        self.drafting: DraftController | None = None  # the last reply's: what it measured carries to the next
        self.threads = ThreadGovernor(settings.threads, settings.threads_batch)
        self._embeddings = Embeddings(settings.embeddings, settings.embeddings_name)  # a context of their own
        self.worker = Worker(on_exit=self._unload)
        self.lab = Lab(self)
        self.slots = Slots(self)

    # --- the engine's Protocols -----------------------------------------------------------------------------

    def load(self) -> Stream:
        return self.worker.submit(self._load)

    def generate(self, request: Request) -> Stream:
        return self.worker.submit(lambda stream: self.write(request, stream))

    def compare(self, request: Request, columns: Sequence[LiveParams]) -> Stream:
        """The sampling lab's (`Comparing`): see lab.py."""
        return self.lab.compare(request, columns)

    def generate_together(self, request: Request, room: int) -> Stream:
        """The serving slots' (`Serving`): see slots.py."""
        return self.slots.generate_together(request, room)

    def xray(self, context: Sequence[int], token: int, params: SamplingParams) -> Stream:
        """Why `token` was drawn after `context` (`probe.position_context`) under `params` (the settings it
        was drawn with: `LiveParams.at(token.params_version)`): ends with an `XRay` or an `Error`.
        Runs between two tokens when a reply is being written."""
        context = tuple(context)
        return self.worker.submit_quick(lambda: xray_at(self.loaded().session, context, token, params))

    def word_probability(self, context: Sequence[int], text: str) -> Stream:
        """The probability that the model writes `text` right after `context`: ends with a
        `WordProbability` or an `Error`. Runs between two tokens when a reply is being written."""
        context = tuple(context)
        return self.worker.submit_quick(lambda: word_probability(self.loaded().session, context, text))

    def check_format(self, output: OutputFormat) -> str:
        """Raises FormatError where `output` cannot be used with this model, so that a command refuses it
        as the user's input (exit 2) before a reply starts; returns what of it is only checked when a reply
        is done (a note, "" when none). Compiling a format only reads the vocabulary, so no worker hop."""
        with self._model_lock:
            return check_format(self.loaded().session, output)

    def count_tokens(self, text: str) -> int:
        """Tokens `text` takes in this model."""
        return len(self.tokenize(text))

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens in this model, no BOS; tokenizing only reads the vocabulary, so no worker hop."""
        with self._model_lock:
            return self.loaded().session.tokenize(text, add_bos=False)

    def embed(self, texts: Sequence[str]) -> Embedded:
        """Texts' pooled embeddings (`Embedding`), read in a context of their own (embed.py) on the caller's thread,
        beside whatever the worker decodes; an `InputRefused` for a text longer than that context."""
        return self._embeddings.embed(texts, self.threads.threads)

    def close(self) -> None:
        self.worker.close()

    # --- on the worker ----------------------------------------------------------------------------------------

    @property
    def session(self) -> LlamaSession | None:
        """The loaded model's llama.cpp session (None before a load)."""
        return self.model.session if self.model is not None else None

    def loaded(self) -> LoadedModel:
        if self.model is None:
            raise EngineError("no model is loaded")
        return self.model

    def write(self, request: Request, stream: Stream, make: ReplyMaker | None = None) -> None:
        """A reply; or, with `make`, a reply of another shape that builds on it (the lab's)."""
        try:
            model = self.loaded()
            if model.disk is not None:
                model.disk.start_turn()
            (make or Reply)(self, request, stream).run()
        except (EngineError, PromptError, FormatError) as error:
            stream.put(Error(str(error)))
            return
        # After Done, so the reply is not kept waiting. Not for a lab (it leaves the conversation's cache at its
        # prompt), nor for a reply no chat keeps (`run` without --save): its state would only fill the disk
        if model.disk is not None and make is None and request.conversation:
            transcript = self.transcript
            model.disk.save(model.session, request.conversation, (transcript.text, transcript.tokens),
                            transcript.last_prompt)

    def _load(self, stream: Stream) -> None:
        self._unload()
        try:
            model = open_model(self.settings, self.threads, self._embeddings, self.name, stream)
        except (EngineError, PromptError) as error:
            cancelled = stream.cancelled.is_set()
            stream.put(Error(f"loading {self.settings.path.name} was cancelled" if cancelled else str(error)))
            return
        self.info = describe(model, self.settings, self.name)
        with self._model_lock:
            self.model = model
        self.transcript.reset()
        self.drafting = None
        stream.put(Loaded(self.info))

    def _unload(self) -> None:
        """The model goes, its embeddings first (they read it)."""
        self._embeddings.close()
        with self._model_lock:
            model, self.model = self.model, None
        if model is not None:
            model.close()
