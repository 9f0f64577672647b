"""The link between the app and its engine process (engine/link.py), with real processes and sockets: typed
messages, both ends' versions checked, an answer that cannot be pickled answered as an error on its own key, calls
with a timeout, and a batch of events kept one unit until it is drained."""

from __future__ import annotations

import socket
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from link_backends import Answering
from tui_chat.engine import host, process
from tui_chat.engine.base import EngineError, Error, Stream, Token
from tui_chat.engine.link import LINK_VERSION, Open, Refused
from tui_chat.engine.process import EngineProcess

TESTS = Path(__file__).parent


@pytest.fixture
def engine(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the engine process builds `Answering` from this folder
    backend = EngineProcess(Answering, tmp_path / "logs")
    final = backend.load().result()
    assert isinstance(final, Error) and final.message == "this backend has no model", final
    yield backend
    backend.close()


def test_a_call_is_answered_over_the_link(engine):
    assert engine.count_tokens("four") == 4


def test_a_call_whose_answer_cannot_be_pickled_raises_instead_of_hanging(engine):
    """The answer's key is a call's: the error goes back as that call's answer (it once went back as a job's
    events, for a job that did not exist, and the call waited for good)."""
    started = time.monotonic()
    with pytest.raises(EngineError, match="could not be sent"):
        engine.count_tokens("a lock")
    assert time.monotonic() - started < 5
    assert engine.count_tokens("after") == 5  # the process goes on


def test_a_call_never_answered_raises_after_its_timeout(engine, monkeypatch):
    monkeypatch.setattr(process, "CALL_TIMEOUT_S", 0.5)
    with pytest.raises(EngineError, match="did not answer count_tokens within 0.5 s"):
        engine.count_tokens("slowly")
    assert engine._link is not None and not engine._link.calls  # nothing left waiting


def test_an_app_of_another_version_is_refused_in_one_line(tmp_path: Path, monkeypatch):
    """The app checks the engine's version (an engine process started from a newer install than the app)."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setattr(process, "LINK_VERSION", LINK_VERSION + 1)
    backend = EngineProcess(Answering, tmp_path / "logs")
    final = backend.load().result()
    assert isinstance(final, Error), final
    assert final.message == (f"the engine process would not start: it speaks version {LINK_VERSION} of the engine "
                             f"link, this app {LINK_VERSION + 1}; restart tui-chat after an upgrade")
    backend.close()


def test_the_engine_refuses_an_app_of_another_version():
    """And the engine checks the app's, before it builds anything the app sent."""
    app, engine = (Connection(end.detach()) for end in socket.socketpair())
    app.send(Open(LINK_VERSION + 1, Answering))
    assert host._opened(engine) is None
    assert app.recv() == Refused(f"the app speaks version {LINK_VERSION + 1} of the engine link, "
                                 f"this engine {LINK_VERSION}")
    app.send(Open(LINK_VERSION, Answering))
    assert host._opened(engine) is Answering
    app.close()
    engine.close()



def test_a_batch_from_the_engine_is_drained_whole_and_in_order():
    stream = Stream()
    batch = [Token(n, f"t{n}", 0.5, 1) for n in range(3)]
    stream.put_batch(batch)
    stream.put(Token(3, "t3", 0.5, 1))
    stream.put_batch([Error("end")])
    assert stream.drain() == [*batch, Token(3, "t3", 0.5, 1), Error("end")]
    assert stream.finished
