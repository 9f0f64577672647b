"""Issue 44, item 2: Esc before the first token gave the sent message back to the box over the draft typed
meanwhile, which was lost. The message comes back in front of the draft, and the typing goes on in the draft; so
does a message that waited for a load that failed."""

from __future__ import annotations

import threading

from test_ui import SIZE, loaded, make_app, send, wait_for
from test_workspace import gated_app, saved_chat
from tui_chat.engine.base import Stream
from tui_chat.ui.widgets.prompt import PromptInput

SENT = "Hello there, tell me a story."


def read_slowly(generate):
    """The tiny model behind a prompt read that takes until Esc: the real reply starts only once the stream is
    cancelled, so it ends as stopped with no token, as a long prompt's does."""

    def reading(request) -> Stream:
        held = Stream()

        def relay() -> None:
            held.cancelled.wait()
            real = generate(request)
            real.cancel()
            for event in real:
                held.put(event)

        threading.Thread(target=relay, name="slow-read", daemon=True).start()
        return held

    return reading


async def sent_and_reading(pilot):
    """The chat screen with SENT sent and its prompt still being read (no token yet)."""
    screen = await loaded(pilot)
    backend = screen.workspace.backend
    backend.generate = read_slowly(backend.generate)
    await send(pilot, SENT)
    await wait_for(pilot, lambda: screen.reply is not None)
    return screen


async def test_esc_before_the_first_token_puts_the_message_back_in_front_of_the_draft(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=SIZE) as pilot:
        screen = await sent_and_reading(pilot)
        await pilot.press(*"my draft words")
        await pilot.press("escape")
        prompt = screen.query_one(PromptInput)
        await wait_for(pilot, lambda: screen.reply is None and SENT in prompt.text)
        assert prompt.text == f"{SENT}\n\nmy draft words"
        await pilot.press(*" go on")
        assert prompt.text == f"{SENT}\n\nmy draft words go on", "the typing goes on where it was"
        assert [turn.question for turn in screen.session.turns] == []


async def test_with_nothing_typed_the_message_comes_back_alone(tiny_model):
    async with make_app(str(tiny_model)).run_test(size=SIZE) as pilot:
        screen = await sent_and_reading(pilot)
        await pilot.press("escape")
        prompt = screen.query_one(PromptInput)
        await wait_for(pilot, lambda: screen.reply is None and prompt.text == SENT)
        await pilot.press("!")
        assert prompt.text == f"{SENT}!"


async def test_a_message_held_for_a_load_that_fails_comes_back_in_front_of_the_draft(tiny_model, tmp_path):
    missing = str(tmp_path / "gone.gguf")
    gate = threading.Event()
    async with gated_app(tiny_model, missing, gate).run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        await screen.rooms["chats"].open_conversation(saved_chat(missing))
        await send(pilot, SENT)
        prompt = screen.query_one(PromptInput)
        await wait_for(pilot, lambda: prompt.text == "")
        await pilot.press(*"my draft words")
        gate.set()
        await wait_for(pilot, lambda: SENT in prompt.text)
        assert prompt.text == f"{SENT}\n\nmy draft words"
