"""The conversation's transcript as the engine read it: text and tokens, so that the next prompt keeps them.

Re-tokenizing the whole transcript can merge the end of the last reply differently from how it was generated,
which would break prefix reuse right at the turn boundary. A regenerated or branched reply starts from the last
prompt itself; a chat reopened from disk, from the transcript saved with its KV state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .kvcache import DiskCache
from .llamacpp import LlamaSession


@dataclass
class Transcript:
    """The chat's text up to the end of its last reply (what of it stays in the conversation) with its tokens, and
    the last prompt read (a reply's, or the lab's) with its own."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    last_prompt: tuple[str, list[int]] = ("", [])

    def tokens_for(self, session: LlamaSession, text: str, disk: DiskCache | None) -> list[int]:
        """Tokens for the rendered prompt `text`, keeping those of a known transcript it starts with as they were."""
        for known_text, known_tokens in self._known(text, disk):
            if known_text and text.startswith(known_text):
                return known_tokens + session.tokenize(text[len(known_text) :], add_bos=False)
        add_bos = session.add_bos and not (session.bos_text and text.startswith(session.bos_text))
        return session.tokenize(text, add_bos=add_bos)

    def _known(self, text: str, disk: DiskCache | None) -> Iterator[tuple[str, list[int]]]:
        """This chat's, the last prompt, then the disk's (only looked up when the others do not fit)."""
        yield self.text, self.tokens
        yield self.last_prompt
        if disk is not None:
            yield disk.reading(text)

    def replied(self, prompt: tuple[str, list[int]], kept: tuple[str, list[int]]) -> None:
        """A reply ended: `kept` is the prompt and the part of the reply the conversation keeps."""
        self.text, self.tokens = kept
        self.last_prompt = prompt

    def reset(self) -> None:
        """Another model: nothing read yet."""
        self.text, self.tokens, self.last_prompt = "", [], ("", [])
