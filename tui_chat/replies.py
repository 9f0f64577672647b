"""What the user asked of the model, and what came of it: the words of `Workspace.start_reply`, the one place a
reply starts (a message sent, a reply written again or gone on with, a branch from a token, the lab's columns).

Every entry point once checked by hand that no load was in flight and that there was a model, then called the
session with the backend's `generate` itself; a sixth would have forgotten, and a reply would have been written
by a model about to go. Now each says what it wants (`Ask`, `Again`, `BranchAt`, `SideBySide`) and reads the
outcome: the reply being written (`Started`), the message held for the load on its way (`Held`), or why not
(`Refused`, one line)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .engine.base import Candidate, Request, Stream
    from .engine.params import LiveParams
    from .session import Turn


@dataclass(frozen=True, slots=True)
class Ask:
    """A message sent: the next turn's question."""

    text: str


@dataclass(frozen=True, slots=True)
class Again:
    """The last reply written again (Ctrl+R) or gone on with from where it stopped (F8)."""

    how: Literal["regenerate", "continue"]


@dataclass(frozen=True, slots=True)
class BranchAt:
    """The latest reply cut at token `index`, `candidate` put there, and the model going on from it."""

    turn: Turn
    index: int
    candidate: Candidate


@dataclass(frozen=True, slots=True)
class SideBySide:
    """The lab: one read of the request's prompt, a column of reply for each of `columns`' settings."""

    request: Request
    columns: Sequence[LiveParams]


Asked = Ask | Again | BranchAt | SideBySide


@dataclass(frozen=True, slots=True)
class Started:
    """The reply being written: its turn in the chat (None for the lab's columns, which are not the chat's yet)
    and its events."""

    turn: Turn | None
    stream: Stream


@dataclass(frozen=True, slots=True)
class Held:
    """The message waits for the model being loaded (`shown`: its name as the user knows it), and is sent when
    it has loaded: by the model the chat will be on, never the one about to go."""

    shown: str


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


Outcome = Started | Held | Refused
