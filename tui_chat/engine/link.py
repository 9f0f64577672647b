"""What crosses between the app and its engine process: one typed message per kind, a version, one table.

The app (`process.py`) and the engine process (`host.py`) speak over one socket. Every message is a frozen
dataclass below, pickled; neither side reads a message by position. The engine process speaks first (`Hello`
with its version) and the app's first message (`Open`) carries the app's: each side checks the other's, so an
engine started from a newer install than the app that runs it (a `pip install` while the app is open) says so in
one line instead of failing on the first message it cannot read.

`CAPABILITIES` is the one list of what an engine does over there: each method of the engine Protocols in
`base.py`, as a *job* (a stream of events, cancellable) or a *call* (a value or an exception, with a timeout).
The app's proxy methods are declared from the Protocols' own methods through `remote` (so their signatures are
the Protocols'), and the host dispatches by the same table; a test checks that it covers every Protocol method.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from .base import (
    Backend,
    Comparing,
    Embedding,
    EngineError,
    Error,
    Event,
    FormatChecking,
    ModelInfo,
    Recomputing,
    Request,
    Serving,
)
from .params import LiveParams, SamplingParams

LINK_VERSION = 1  # raised whenever a message below changes shape or meaning
UI_PROCESS_ENV = "TUI_CHAT_UI_PROCESS"  # set in the engine process: the app's pid (its thread governor's load)
HEARTBEAT_S = 1.0  # the engine process says it is alive this often, whatever its worker is doing
CALL_TIMEOUT_S = 120.0  # a call unanswered this long (a bug over there) raises instead of waiting for good


class Kind(Enum):
    JOB = "job"  # a Stream of events; cancellable; the model loads again first after a death
    CALL = "call"  # a value back, or the exception raised over there


@dataclass(frozen=True)
class Capability:
    name: str
    kind: Kind
    protocol: type  # the Protocol in base.py that declares it


CAPABILITIES: dict[str, Capability] = {capability.name: capability for capability in (
    Capability("load", Kind.JOB, Backend),
    Capability("generate", Kind.JOB, Backend),
    Capability("count_tokens", Kind.CALL, Backend),
    Capability("check_format", Kind.CALL, FormatChecking),
    Capability("compare", Kind.JOB, Comparing),
    Capability("generate_together", Kind.JOB, Serving),
    Capability("tokenize", Kind.CALL, Serving),
    Capability("xray", Kind.JOB, Recomputing),
    Capability("word_probability", Kind.JOB, Recomputing),
    Capability("embed", Kind.CALL, Embedding),
)}
APP_SIDE = frozenset({"close"})  # Protocol methods the app's side does itself (closing ends the process)
ENGINE_PROTOCOLS = (Backend, FormatChecking, Comparing, Serving, Recomputing, Embedding)


# app → engine
@dataclass(frozen=True)
class Open:
    """The first message: the app's version, and the picklable callable that builds the backend over there."""

    version: int
    make: Callable[[], Backend]


@dataclass(frozen=True)
class StartJob:
    key: int
    method: str
    args: tuple[Any, ...]
    reload: bool  # the model loads again first: the process before this one died


@dataclass(frozen=True)
class Call:
    key: int
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Cancel:
    key: int


@dataclass(frozen=True)
class FollowParams:
    """A live setting changed on the app's side (a slider mid-reply): the engine's mirror of it follows."""

    live: int  # LiveParams.key
    version: int
    params: SamplingParams


@dataclass(frozen=True)
class Close:
    pass


# engine → app
@dataclass(frozen=True)
class Hello:
    """The engine process's first words: its version."""

    version: int


@dataclass(frozen=True)
class Refused:
    """The engine process would not open: the app's version is not its own, or the first message was unreadable."""

    reason: str


@dataclass(frozen=True)
class Events:
    """A job's events since its last batch: one unit from the engine's worker to the screen."""

    key: int
    events: list[Event]


@dataclass(frozen=True)
class Answer:
    """A call's value, or (`ok` false) the exception to raise on the app's side."""

    key: int
    ok: bool
    value: Any


@dataclass(frozen=True)
class ModelLoaded:
    """The model loaded again in a new engine process (the job that asked for it goes on)."""

    info: ModelInfo


@dataclass(frozen=True)
class Alive:
    """The heartbeat: the app's watchdog hears a live process however long a read or a load takes."""


def unsendable(message: object, error: Exception) -> object | None:
    """What goes instead of an engine message that could not be pickled (a bug): the same key answered with an
    error, so the job or call waiting for it ends in one line instead of waiting for good. None: nothing waits."""
    said = f"internal error (the engine's answer could not be sent: {error})"
    if isinstance(message, Events):
        return Events(message.key, [Error(said)])
    if isinstance(message, Answer):
        return Answer(message.key, False, EngineError(said))
    return None


def sendable_error(error: Exception) -> Exception:
    """An exception raised by a call over there, as it can cross: itself, or its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure means: send its text instead
        return EngineError(str(error))
    return error


def lives_in(args: Iterable[Any]) -> list[LiveParams]:
    """The live settings a job's arguments carry (a request's, a lab's columns): mirrored while it runs."""
    found: list[LiveParams] = []
    for arg in args:
        if isinstance(arg, LiveParams):
            found.append(arg)
        elif isinstance(arg, Request):
            found.append(arg.params)
        elif isinstance(arg, (list, tuple)):
            found.extend(lives_in(arg))
    return found


class RemoteProxy(Protocol):
    """The app's side of an engine process: runs a capability over there."""

    def _remote(self, capability: Capability, *args: Any) -> Any: ...


P = ParamSpec("P")
R = TypeVar("R")


class Remote(Generic[P, R]):
    """A Protocol method run in the engine process, declared on the app's proxy as `remote(Backend.generate)`:
    its signature is the Protocol's, and calling it hands the capability and the arguments to the proxy's
    `_remote` (a job or a call, by the table)."""

    def __init__(self, method: Callable[Concatenate[Any, P], R]) -> None:
        self.capability = CAPABILITIES[method.__name__]

    @overload
    def __get__(self, proxy: None, owner: type) -> Remote[P, R]: ...

    @overload
    def __get__(self, proxy: RemoteProxy, owner: type) -> Callable[P, R]: ...

    def __get__(self, proxy: RemoteProxy | None, owner: type) -> Remote[P, R] | Callable[P, R]:
        if proxy is None:
            return self
        return partial(proxy._remote, self.capability)


def remote(method: Callable[Concatenate[Any, P], R]) -> Remote[P, R]:
    return Remote(method)

