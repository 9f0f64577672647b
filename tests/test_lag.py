"""The lag monitor: a stall on the event loop is measured and attributed to what ran."""

from __future__ import annotations

import asyncio
import gc
import json
import time

from tui_chat.lag import ENV, LagMonitor, classify, monitor_from_env


def parse_markdown_slowly(seconds: float) -> None:
    """Stands in for a block's parse: Python code holding the loop."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


def in_the_package(function):
    """`function` as if defined in a module of tui_chat, where a stall's `where` looks."""
    namespace = {"time": time}
    exec(compile("def layout_the_reply(seconds):\n    parse(seconds)\n", "/x/tui_chat/ui/fake.py", "exec"),
         namespace)
    namespace["parse"] = function
    return namespace["layout_the_reply"]


async def test_a_stall_is_timed_and_names_the_function_that_held_the_loop():
    monitor = LagMonitor()
    monitor.start()
    await asyncio.sleep(0.05)
    in_the_package(parse_markdown_slowly)(0.08)
    await asyncio.sleep(0.05)
    monitor.stop()
    stall = max(monitor.stalls, key=lambda s: s.late_s)
    assert 0.06 <= stall.late_s < 0.2
    assert stall.samples >= 3
    assert stall.where == "fake.py:layout_the_reply"
    assert stall.cause == "other"
    assert not [s for s in monitor.stalls if s is not stall and s.late_s > 0.03]  # one stall, not many


async def test_a_stall_says_how_much_of_it_the_loop_spent_working_and_how_much_waiting():
    """On a busy machine a stall can be a wait for a core: its CPU time tells it from the UI's own work."""
    monitor = LagMonitor()
    monitor.start()
    await asyncio.sleep(0.05)
    start = time.thread_time()
    while time.thread_time() - start < 0.06:  # 60 ms of the loop's own CPU, however long a busy machine takes
        sum(range(200))
    worked_until = time.perf_counter()
    await asyncio.sleep(0.05)
    time.sleep(0.08)  # noqa: ASYNC251 - as when the OS runs another process: the loop is late, idle
    waited_until = time.perf_counter()
    await asyncio.sleep(0.05)
    monitor.stop()

    def first_after(moment: float):
        """The stall the loop ended as it ran again after `moment` (a busy machine may add others elsewhere;
        a tick due up to `tick_s` into a stall counts it that much shorter)."""
        return min((stall for stall in monitor.stalls if stall.at >= moment), key=lambda stall: stall.at)

    worked, waited = first_after(worked_until), first_after(waited_until)
    assert worked.late_s >= 0.05 and worked.cpu_s >= 0.05
    assert waited.late_s >= 0.07 and waited.cpu_s < 0.02


async def test_a_garbage_collection_is_named_as_such():
    gc.disable()
    try:
        junk = [[i, [i]] for i in range(1_000_000)]
        for pair in junk:
            pair.append(pair)  # cycles, so the collector has work
        del junk
        monitor = LagMonitor()
        monitor.start()
        await asyncio.sleep(0.02)
        gc.collect()
    finally:
        gc.enable()
    await asyncio.sleep(0.05)
    monitor.stop()
    assert any(s.cause == "gc" for s in monitor.stalls)


def test_a_stack_in_markdown_it_is_a_markdown_parse():
    from markdown_it import MarkdownIt

    captured = []

    def spy(state, *args):  # a block rule: runs inside markdown_it's parser
        import sys

        captured.append(classify(sys._getframe()))
        return False

    parser = MarkdownIt()
    parser.block.ruler.before("paragraph", "spy", spy)
    parser.parse("hello\n\nworld")
    assert captured and captured[0][0] == "markdown parse"
    assert captured[0][2].endswith("test_lag.py:test_a_stack_in_markdown_it_is_a_markdown_parse.<locals>.spy")


async def test_the_app_writes_its_stalls_where_the_environment_says(tmp_path, monkeypatch):
    log = tmp_path / "lag.jsonl"
    monkeypatch.setenv(ENV, str(log))
    monitor = monitor_from_env()
    monitor.start()
    await asyncio.sleep(0.02)
    parse_markdown_slowly(0.05)
    await asyncio.sleep(0.02)
    monitor.stop()
    stalls = [json.loads(line) for line in log.read_text().splitlines()]
    assert stalls and max(s["late_s"] for s in stalls) >= 0.04
    monkeypatch.delenv(ENV)
    assert monitor_from_env() is None
