"""What the token inspector can ask the model about a position of a reply, recomputed when asked: the
X-ray of the drawn token (the chain stage by stage) and the exact probability of any word there.

Only the model in this process can answer: it recomputes the position's logits in a scratch sequence,
which a server does not offer. And only the model that wrote the reply: another one reads the same
token ids as other text. No Textual here.
"""

from __future__ import annotations

from collections.abc import Sequence

from .engine.base import Backend, Recomputing, Stream, Token
from .engine.params import LiveParams, SamplingParams
from .session import Branch


def position_context(prompt_ids: Sequence[int], tokens: Sequence[Token], index: int) -> tuple[int, ...]:
    """All the model had read before `tokens[index]` came: the prompt the reply follows (`Done.prompt_ids`,
    or the first `PromptProgress.prompt_ids`) and the reply's tokens before it, a branch's given ones too."""
    return tuple(prompt_ids) + tuple(t.token_id for t in tokens[:index])


class TokenProbe:
    def __init__(self, backend: Backend | None, live: LiveParams, branch: Branch | None, model: str) -> None:
        self.backend = backend
        self.live = live
        self.branch = branch
        self.model = model  # the session's model now

    def why_not(self) -> str | None:
        """Why this reply's positions cannot be recomputed now, in one line; None when they can."""
        backend = self.backend
        if backend is None or backend.info is None:
            return "No model is loaded."
        if not isinstance(backend, Recomputing):
            where = f"the server {backend.info.remote_host}" if backend.info.remote_host else backend.info.name
            return (f"The X-ray and word probabilities recompute this position's logits in the model itself; "
                    f"{where} gives none on demand. Open a local model (Ctrl+O) for them.")
        if self.branch is None or self.branch.model != self.model:
            return "This reply was written by another model than the one loaded now: its positions mean other text."
        if not self.branch.prompt_ids:
            return "This reply ended without its prompt recorded, so its positions cannot be recomputed."
        return None

    def context(self, index: int) -> tuple[int, ...]:
        """All the model had read before token `index` of the reply."""
        _, branch = self._ready()
        return position_context(branch.prompt_ids, branch.tokens, index)

    def settings(self, token: Token) -> tuple[SamplingParams, str]:
        """The settings `token` was drawn with, and a note when they are no longer kept (today's, then)."""
        try:
            return self.live.at(token.params_version), ""
        except KeyError:
            return self.live.snapshot()[1], "the settings it was drawn with are no longer kept: today's are used"

    def xray(self, index: int) -> Stream:
        """Ends with an `XRay` or an `Error`. Call only when `why_not()` is None."""
        backend, branch = self._ready()
        token = branch.tokens[index]
        return backend.xray(self.context(index), token.token_id, self.settings(token)[0])

    def word(self, index: int, text: str) -> Stream:
        """Ends with a `WordProbability` or an `Error`. Call only when `why_not()` is None."""
        backend, _ = self._ready()
        return backend.word_probability(self.context(index), text)

    def _ready(self) -> tuple[Recomputing, Branch]:
        backend, branch = self.backend, self.branch
        assert isinstance(backend, Recomputing) and branch is not None, "asked while why_not() says why not"
        return backend, branch
