"""A reasoning model's thinking in the chat, driven through Pilot on a scripted Qwen3 model: folded above the
answer with its figures, unfolded by Enter, drawn as a heatmap and inspected, saved, and switched off by F7."""

from __future__ import annotations

from textual.widgets import Static

from test_ui import SIZE, loaded, make_app, reply_done, screen_open, send, wait_for
from tui_chat.config import history_path
from tui_chat.history import History
from tui_chat.ui.screens.inspector import InspectorScreen
from tui_chat.ui.widgets.messages import ReplyMessage
from tui_chat.ui.widgets.thinking import ThinkingBlock


def shown(widget: Static) -> str:
    return "\n".join("".join(s.text for s in widget.render_line(y)).rstrip() for y in range(widget.size.height))


def token_indexes(widget: Static) -> set[int]:
    return {s.style.meta["token"] for y in range(widget.size.height) for s in widget.render_line(y)
            if s.style and s.style.meta.get("token") is not None and s.text.strip()}


async def answered(pilot, text: str = "Hi") -> ReplyMessage:
    """The model loaded, `text` sent, its reply finished."""
    await loaded(pilot)
    await send(pilot, text)
    return await reply_done(pilot)


def token_x(widget: Static, y: int, index: int) -> int:
    """Where token `index` starts on line `y` of a heatmap."""
    x = 0
    for segment in widget.render_line(y):
        if segment.style and segment.style.meta.get("token") == index:
            return x
        x += segment.cell_length
    raise AssertionError(f"token {index} is not on line {y}")


async def test_the_thinking_folds_above_the_answer_and_enter_unfolds_it(thinker_model):
    app = make_app(str(thinker_model), n_ctx=512)
    async with app.run_test(size=SIZE) as pilot:
        screen = pilot.app.screen
        reply = await answered(pilot)
        assert "Thinking on · F7" in shown(screen.query_one("#model-facts", Static))
        block = reply.query_one(ThinkingBlock)
        assert list(reply.children).index(block) == 0 and reply.text == "Hello world "
        folded = shown(block)
        assert folded.startswith("▸ thought for ") and folded.endswith(" s · 6 tokens") and "Hmm" not in folded
        assert shown(reply.query_one(".last", Static)).startswith("Hello world")
        assert "out 10\n         6 thinking · 4 answer" in shown(screen.query_one("#tokens", Static))
        block.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert shown(block).splitlines()[1:] == ["Hmm, let me"] and shown(block).startswith("▾ thought for")
        await pilot.press("enter")
        await pilot.pause()
        assert shown(block) == folded

        with History(history_path()) as history:
            saved = history.load(screen.session.conversation_id).path[-1]
        assert saved.content == "Hello world " and saved.reasoning == "Hmm, let me"
        assert saved.metrics["reasoning_tokens"] == 6

        await pilot.press("f7")
        await pilot.pause()
        assert not screen.session.thinking
        assert "Thinking off" in shown(screen.query_one("#model-facts", Static))
        await send(pilot, "Again")
        await wait_for(pilot, lambda: len(screen.query(ReplyMessage)) == 2 and screen.reply is None)
        second = screen.query(ReplyMessage).last()
        assert second.text == "Hello world " and not second.query(ThinkingBlock)
        assert second.reply.tokens[1].inserted  # it opened a thinking anyway: the engine ended it at once


async def test_the_heatmap_and_the_inspector_work_inside_the_thinking(thinker_model):
    app = make_app(str(thinker_model), n_ctx=512)
    async with app.run_test(size=SIZE) as pilot:
        reply = await answered(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()
        block = reply.query_one(ThinkingBlock)
        assert token_indexes(block) == set()  # folded: only the answer is drawn
        assert token_indexes(reply.query_one(".heatmap")) == {6, 7}
        reply.focus()
        await pilot.press("tab")  # from the reply to its thinking: the redraws on focus keep the block
        await pilot.pause()
        assert pilot.app.focused is block
        await pilot.press("enter")
        await pilot.pause()
        assert token_indexes(block) == {0, 1, 2, 3, 4, 5}  # the markers are tokens too
        await pilot.click(block, offset=(token_x(block, 1, 1), 1))
        inspector = await screen_open(pilot, InspectorScreen)
        assert inspector.index == 1 and inspector.tokens[1].piece == "Hmm"


def test_a_long_thinking_unfolded_while_it_streams_draws_only_its_end():
    from tui_chat.ui.widgets.thinking import THINKING_TAIL_CHARS, thinking_tail

    short = "a short thought\nstill short"
    assert thinking_tail(short) == short
    long = "".join(f"line {n} of the thought\n" for n in range(2000))
    shown = thinking_tail(long)
    head, _, rest = shown.partition("\n")
    assert len(rest) <= THINKING_TAIL_CHARS and long.endswith(rest) and rest.startswith("line ")
    assert head == f"… {len(long) - len(rest):,} characters above, shown when the reply ends"
