"""What outlives one chat: the model in use, the loader, the operations across stores; on the real tiny model
and real SQLite."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from conftest import GREEDY
from test_ui import SIZE, loaded, reply_done, send, wait_for
from tui_chat.commands.common import opener_for
from tui_chat.config import Config, history_path
from tui_chat.history import History
from tui_chat.ui.app import ChatApp
from tui_chat.ui.widgets.prompt import PromptInput


def gated_app(first: Path, gated: str, gate: threading.Event) -> ChatApp:
    """The app on `first`; opening `gated` waits for `gate` (a slow load) and then goes on as usual."""
    config = Config(sampling=GREEDY.with_changes(max_tokens=4), n_ctx=1024)
    opener = opener_for(config)[0]

    def open_backend(name):
        if name == gated:
            gate.wait(30)
        return opener(name)

    return ChatApp(config, open_backend, str(first))


def saved_chat(model: str) -> int:
    """A chat saved earlier with `model`: one question, no reply yet."""
    history = History(history_path())
    try:
        conversation = history.create(model=model, sampling=GREEDY.with_changes(max_tokens=4))
        history.add_user_message(conversation, "An earlier question", None)
        return conversation
    finally:
        history.close()


def saved_model(conversation: int) -> str:
    """The model the chat's row names: the one its next reply is written by when it is opened again."""
    history = History(history_path())
    try:
        return history.load(conversation).model
    finally:
        history.close()


async def test_a_message_sent_while_a_reopened_chat_loads_its_model_waits_for_that_model(tiny_model, tmp_path):
    """The old model kept answering while the chat's own one loaded: its reply was saved under the new name."""
    other = tmp_path / "other.gguf"
    shutil.copy(tiny_model, other)
    gate = threading.Event()
    app = gated_app(tiny_model, str(other), gate)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        chat = saved_chat(str(other))
        await screen.rooms["chats"].open_conversation(chat)
        await send(pilot, "Hello there")
        await pilot.pause(0.3)
        status = str(screen.query_one("#status").render())
        assert "your message is sent as soon as it is ready" in status
        assert screen.reply is None and screen.session.turns[-1].question == "An earlier question"
        gate.set()
        reply = await reply_done(pilot)
        assert reply.text and screen.session.turns[-1].question == "Hello there"
        assert screen.session.turns[-1].reply.model == str(other)
        assert screen.workspace.backend.info.path == str(other)
    assert saved_model(chat) == str(other)


async def test_a_failed_load_leaves_the_chat_on_the_model_that_answers(tiny_model, tmp_path):
    """A reopened chat whose model is gone goes on with the model in use, under that model's name; a message
    that waited for the load comes back to the box."""
    missing = str(tmp_path / "gone.gguf")
    gate = threading.Event()
    app = gated_app(tiny_model, missing, gate)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        chat = saved_chat(missing)
        await screen.rooms["chats"].open_conversation(chat)
        await send(pilot, "Hello there")
        await pilot.pause(0.3)
        assert screen.reply is None
        gate.set()
        box = screen.query_one(PromptInput)
        await wait_for(pilot, lambda: box.text == "Hello there")
        assert screen.session.model == str(tiny_model)
        await send(pilot, "Hello there")
        await reply_done(pilot)
        assert screen.session.turns[-1].reply.model == str(tiny_model)
        assert screen.workspace.backend.info.path == str(tiny_model)
    assert saved_model(chat) == str(tiny_model)


def test_removing_the_default_model_resets_it_wherever_it_is_removed(models, tiny_model):
    """`models rm` once only said so, while F5 reset the config: both go through the workspace now."""
    from tui_chat.cli import main
    from tui_chat.config import load_config, save_setting
    from tui_chat.hub.local import import_model, list_local
    from tui_chat.workspace import Workspace

    model = import_model(models, tiny_model)
    save_setting("default_model", model.name)
    assert load_config().default_model == model.name
    removed = Workspace(load_config()).remove_model(model.name)
    assert removed.was_default and not removed.model.path.exists() and load_config().default_model is None
    model = import_model(models, tiny_model)
    save_setting("default_model", model.name)
    assert main(["models", "rm", model.name]) == 0
    assert list_local(models) == [] and load_config().default_model is None


def test_the_model_in_use_changes_only_when_a_load_succeeds(tiny_model, tmp_path):
    """Without the UI: a load that fails leaves the model, and the chat's model name, as they were."""
    from tui_chat.engine.base import EngineError
    from tui_chat.engine.params import LiveParams
    from tui_chat.workspace import Workspace

    config = Config(sampling=GREEDY, n_ctx=1024)
    workspace = Workspace(config, opener_for(config)[0])
    session = workspace.new_chat(LiveParams(GREEDY))
    backend = workspace.load_now(str(tiny_model))
    try:
        assert workspace.model_name == session.model == str(tiny_model) and workspace.backend is backend
        job = workspace.start_load(str(tmp_path / "gone.gguf"))
        with pytest.raises(EngineError, match="not found"):
            workspace.open(job)
        workspace.failed(job)
        assert workspace.loading is None and workspace.backend is backend and session.model == str(tiny_model)
    finally:
        backend.close()
        workspace.close()


HOLD_AND_DIE = """
import os, signal, sys
from tui_chat.config import Config, history_path
from tui_chat.history import History
from tui_chat.workspace import Workspace
workspace = Workspace(Config(), None, History(history_path()))
workspace.start_load("a model that takes long")
assert workspace.hold(sys.argv[1])
os.kill(os.getpid(), signal.SIGKILL)  # the load dies, and the app with it
"""


def test_a_message_held_for_a_load_survives_the_process():
    """Issue 44 item 3: a message sent while the model loads was held in memory only, and a kill -9 during the
    load lost it. It is written beside the history when held, and the next start gives it back, once."""
    import subprocess
    import sys

    from tui_chat.workspace import Workspace

    died = subprocess.run([sys.executable, "-c", HOLD_AND_DIE, "my message, sent during the load"], check=False)
    assert died.returncode == -9
    workspace = Workspace(Config(), None, History(history_path()))
    try:
        assert workspace.unsent() == "my message, sent during the load"
        assert workspace.unsent() is None  # given back once: it is the box's now
        workspace.start_load("another")
        assert workspace.hold("sent and answered") and workspace.release() == "sent and answered"
        assert workspace.unsent() is None  # a message sent is no longer kept aside
    finally:
        workspace.close()


async def test_the_next_start_puts_an_unanswered_message_back_in_the_box(tiny_model):
    """Issue 44 item 3, in the app: what the load's death left beside the history is back in the box, said once."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", HOLD_AND_DIE, "asked while it loaded"], check=False)
    config = Config(sampling=GREEDY.with_changes(max_tokens=4), n_ctx=1024)
    app = ChatApp(config, opener_for(config)[0], str(tiny_model))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await loaded(pilot)
        assert screen.query_one(PromptInput).text == "asked while it loaded"
        await wait_for(pilot, lambda: any("never answered" in str(n.message) for n in app._notifications))


def test_the_one_starter_holds_waits_refuses_and_starts_on_the_model_in_use(tiny_model: Path):
    """`Workspace.start_reply`: what each entry point of the chat and `run` asks (the layer test checks none goes
    round it). A message waits for a load on its way, anything else is refused until it is done; with the model
    loaded, the reply is written by it and the chat records it."""
    from tui_chat.engine.base import Loaded, Request
    from tui_chat.engine.params import LiveParams
    from tui_chat.replies import Again, Ask, Held, Refused, SideBySide, Started
    from tui_chat.workspace import Workspace

    config = Config(sampling=GREEDY.with_changes(max_tokens=4), n_ctx=1024)
    with History(history_path()) as history:
        workspace = Workspace(config, opener_for(config)[0], history)
        workspace.new_chat(LiveParams(config.sampling))
        assert workspace.start_reply(Ask("hello")) == Refused("No model is loaded: Ctrl+O opens one.")
        job = workspace.start_load(str(tiny_model))
        assert workspace.start_reply(Ask("hello")) == Held(str(tiny_model))
        assert workspace.start_reply(Ask("another")) == Refused("A message is already waiting for the model.")
        assert workspace.start_reply(Again("regenerate")) == Refused(
            f"Loading {tiny_model}: try again once it is loaded.")
        loaded = workspace.open(job).load().result()
        assert isinstance(loaded, Loaded)
        workspace.loaded(job, loaded.info)
        started = workspace.start_reply(Ask(workspace.release() or ""))
        assert isinstance(started, Started) and started.turn is not None
        assert workspace.start_reply(Again("regenerate")) == Refused("A reply is still being written: Esc stops it.")
        final = started.stream.result()
        workspace.session.take([final])
        assert started.turn.reply.model == str(tiny_model) and started.turn.question == "hello"
        request = Request(workspace.session.lab_messages("again"), LiveParams(GREEDY))
        lab = workspace.start_reply(SideBySide(request, [LiveParams(GREEDY)]))
        assert isinstance(lab, Started) and lab.turn is None and lab.stream.result() is not None
        workspace.close()
