"""Tools with real parts: the real starter model, the real `mcp-server-time` from PyPI, and a fault server
written with the MCP SDK (tests/mcp_faults.py). Greedy decoding, so each call the model makes is the same
every run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import jsonschema
import pytest

from conftest import GREEDY, TIME, run_cli
from tui_chat.engine.base import Done, Message, Request, ToolActivity
from tui_chat.engine.local.grammar import compile_format, new_matcher, tokenizer_for
from tui_chat.engine.params import InvalidParameter, LiveParams
from tui_chat.tools.calls import call_format, find_call
from tui_chat.tools.loop import ToolUse, approve_listed, decided
from tui_chat.tools.mcp import ToolError, ToolServers
from tui_chat.tools.settings import ServerSpec, parse_mcp
from tui_chat.tools.setup import tool_use

FAULTS = ServerSpec("faults", sys.executable, (str(Path(__file__).parent / "mcp_faults.py"),))
PARAMS = GREEDY.with_changes(max_tokens=48)


def reply(backend, use: ToolUse, prompt: str) -> tuple[Done, list[ToolActivity]]:
    stream = use.generate(backend.generate, Request([Message("user", prompt)], LiveParams(PARAMS)))
    events = list(stream)
    final = events[-1]
    assert isinstance(final, Done), final
    return final, [event for event in events if isinstance(event, ToolActivity)]


def faults(servers: ToolServers, choice: str, timeout_s: float = 60.0, **options) -> ToolUse:
    """The fault server's tools, one call a reply (then the model answers: it calls no other fault)."""
    tools = servers.start(FAULTS, 30)
    return ToolUse(servers, tools, approve_listed(["all"]), choice, call_limit=1, call_timeout_s=timeout_s,
                   **options)


# --- the Done-when, as a script runs it --------------------------------------------------------------------


def _run_time(starter_model: Path, *more: str):
    return run_cli("run", "--model", str(starter_model), "-p", "What time is it in Tokyo?",
                   "--mcp", f"{sys.executable} -m mcp_server_time", "--tool-choice", "required", "--json",
                   "--temperature", "0", "--max-tokens", "64", *more, timeout=240)


def test_the_time_server_is_called_from_the_starter_and_its_answer_is_the_time_now(starter_model, servers):
    schemas = {tool.name: tool.schema for tool in servers.start(TIME, 30)}
    result = _run_time(starter_model, "--approve", "all")
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    first = turn["tool_calls"][0]
    assert set(first) == {"server", "name", "arguments", "approved", "result", "error", "ms", "cut", "before",
                          "reasoning"}
    jsonschema.validate(first["arguments"], schemas[first["name"]])  # the grammar kept them valid
    assert first["name"] == "get_current_time" and first["approved"] and first["error"] is None
    told = datetime.fromisoformat(json.loads(first["result"])["datetime"])
    assert told.tzinfo is not None and abs(told - datetime.now(told.tzinfo)) < timedelta(minutes=2)
    assert isinstance(turn["text"], str)
    assert "tool: mcp_server_time/get_current_time" in result.stderr


def test_a_call_cut_by_max_tokens_is_an_unfinished_call_not_answer_text(starter_model):
    """Issue 38: the raw `<tool_call>{"name": …` was left as the answer, and the free text said incomplete."""
    result = _run_time(starter_model, "--approve", "all", "--max-tokens", "12")
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    assert turn["stop_reason"] == "length" and "<tool_call>" not in turn["text"], turn["text"]
    [call] = turn["tool_calls"]
    assert call["name"] == "get_current_time" and not call["approved"] and call["result"] is None
    assert call["error"] == "the required first call to get_current_time was cut short at the token limit before it " \
                            "was complete"
    assert "free text" not in result.stderr and "(not run)" in result.stderr


def test_without_approve_nothing_runs_and_the_output_says_so(starter_model):
    result = _run_time(starter_model)
    assert result.returncode == 0, result.stderr
    calls = json.loads(result.stdout)["turns"][0]["tool_calls"]
    assert calls and all(not call["approved"] and call["result"] is None and call["ms"] is None for call in calls)
    assert "not approved" in calls[0]["error"]
    assert "(not run)" in result.stderr


def test_a_tool_choice_that_names_no_tool_is_one_line_exit_2(starter_model):
    result = _run_time(starter_model, "--tool-choice", "get_weather")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "get_weather" in result.stderr and "get_current_time" in result.stderr


def test_a_server_that_does_not_start_is_one_line(starter_model):
    started = time.monotonic()
    result = run_cli("run", "--model", str(starter_model), "-p", "hi", "--mcp",
                     f"{sys.executable} {FAULTS.args[0]} --no-start", timeout=120)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "did not start" in result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - started < 60


# --- the call, the grammar and consent ---------------------------------------------------------------------


def test_required_writes_a_valid_call_from_the_first_token(starter, servers):
    tools = servers.start(TIME, 30)
    fmt = call_format(tools, "required")
    done = starter.generate(Request([Message("user", "Time in Paris?")], LiveParams(PARAMS), format=fmt)).result()
    assert isinstance(done, Done) and done.text.lstrip().startswith("<tool_call>")
    call = find_call(done.text, tools)
    assert call is not None and not call.problem


def test_a_denied_call_does_not_run_and_the_model_is_told(starter, servers):
    asked = []
    use = faults(servers, "echo")
    use.consent = lambda call: asked.append(call) or decided("deny")
    done, activity = reply(starter, use, "Echo hello")
    assert [call.name for call in asked] == ["echo"]
    assert done.tool_calls[0].approved is False and "not approved" in (done.tool_calls[0].error or "")
    assert [event.stage for event in activity[:2]] == ["asked", "done"]


def test_always_lets_the_tool_run_without_asking_again(starter, servers):
    asked = []
    use = faults(servers, "echo")
    use.consent = lambda call: asked.append(call) or decided("always")
    reply(starter, use, "Echo hello")
    reply(starter, use, "Echo again")
    assert len(asked) == 1 and use.always == {"echo"}


# --- faults ------------------------------------------------------------------------------------------------


def test_a_hung_call_times_out_and_the_reply_goes_on(starter, servers):
    started = time.monotonic()
    done, _ = reply(starter, faults(servers, "hang", timeout_s=1.5), "Wait")
    assert time.monotonic() - started < 30
    assert done.tool_calls[0].error == "hang did not answer within 1.5 s"


def test_a_huge_result_is_cut_for_the_model_and_the_cut_said(starter, servers):
    use = faults(servers, "huge", result_chars=2000)
    done, _ = reply(starter, use, "Go")
    call = done.tool_calls[0]
    assert len(call.result or "") == 10 << 20 and call.cut == (10 << 20) - 2000  # nothing lost
    assert "cut 10,483,760 characters of 10,485,760" in use._seen(call)


def test_terminal_escapes_in_a_result_are_made_visible(starter, servers):
    done, _ = reply(starter, faults(servers, "escapes"), "Go")
    result = done.tool_calls[0].result or ""
    assert "\x1b" not in result and "\x07" not in result and "\\x1b[31mRED" in result


def test_a_tool_error_goes_back_to_the_model(starter, servers):
    done, _ = reply(starter, faults(servers, "fails"), "Go")
    assert done.tool_calls[0].result is None and "fails" in (done.tool_calls[0].error or "")


def test_a_server_that_crashes_mid_call_is_one_line_and_the_reply_goes_on(starter, tmp_path):
    servers = ToolServers(tmp_path)
    try:
        done, _ = reply(starter, faults(servers, "crash"), "Go")
        error = done.tool_calls[0].error or ""
        assert error.startswith("crash failed") and "\n" not in error
        assert "crashing on purpose" in (tmp_path / "mcp.log").read_text()  # its stderr: the log, not the terminal
    finally:
        servers.close()


def test_a_server_that_hangs_at_start_is_bounded(tmp_path):
    servers = ToolServers(tmp_path)
    started = time.monotonic()
    with pytest.raises(ToolError, match="did not start within 1 s"):
        servers.start(ServerSpec("sleeper", sys.executable, ("-c", "import time; time.sleep(60)")), 1)
    servers.close()
    assert time.monotonic() - started < 10


def test_a_server_given_by_url_speaks_streamable_http(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "mcp_faults.py"), "--http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers = ToolServers(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as knock:
                if knock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        listed = servers.start(ServerSpec("http", url=f"http://127.0.0.1:{port}/mcp"), 30)
        echo = next(tool for tool in listed if tool.name == "echo")
        assert echo.server == "http" and "text" in echo.schema["properties"]
        outcome = servers.call(echo, {"text": "over HTTP"}, 30)
        assert outcome.text == "over HTTP" and not outcome.is_error
    finally:
        servers.close()
        process.terminate()
        process.wait(10)


def test_a_tool_with_an_invalid_schema_is_left_out_in_one_line_and_the_others_are_usable(starter_model):
    """Issue 38: one bad tool refused the whole server with a pydantic dump cut mid-word ("did not start")."""
    raw = Path(__file__).parent / "mcp_raw.py"
    result = run_cli("run", "--model", str(starter_model), "-p", "Say hello", "--mcp", f"{sys.executable} {raw}",
                     "--tool-choice", "echo", "--approve", "all", "--temperature", "0", "--max-tokens", "48",
                     "--json", timeout=240)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "left out" in line]
    assert len(notes) == 2 and "did not start" not in result.stderr and "type=" not in result.stderr
    assert "tool 'broken' left out: its input schema's properties.a.type" in notes[0]
    assert "a tool with no name left out: name" in notes[1]
    [call, *_] = json.loads(result.stdout)["turns"][0]["tool_calls"]
    assert call["name"] == "echo" and call["approved"] and call["result"] is not None, call


def test_tool_names_and_choices_are_checked(servers):
    with pytest.raises(InvalidParameter, match="nope"):
        tool_use(servers, servers.start(TIME, 30), parse_mcp({}), None, "nope", approve_listed([]))


def test_the_config_names_servers_and_limits():
    settings = parse_mcp({"call_limit": 3, "call_timeout_s": 5,
                          "servers": {"time": {"command": "python", "args": ["-m", "mcp_server_time"]}}})
    assert settings.call_limit == 3 and settings.call_timeout_s == 5.0
    assert settings.servers["time"].args == ("-m", "mcp_server_time")
    with pytest.raises(InvalidParameter, match=r"\[mcp.servers.x\]"):
        parse_mcp({"servers": {"x": {"command": "a", "url": "http://b"}}})


def test_a_call_marker_written_wrong_is_not_text(starter, servers):
    """Found in tmux: after a failed call the starter repeated it, and when made to answer (`none`) went on with
    `<tool_call}>{"name": …}</tool_call>`, a call gone wrong that nothing ran. Text is free but for the marker
    and its near misses: under `auto` only `<tool_call>` can follow `<tool_call`, and the grammar takes the call
    from there; under `none` neither can be written."""
    tools = servers.start(TIME, 30)
    tokenizer = tokenizer_for(starter.session)

    def writes(choice: str, text: str) -> bool:
        matcher = new_matcher(tokenizer, compile_format(tokenizer, call_format(tools, choice)).grammar)
        tokens = starter.session.tokenize(text, add_bos=False)
        return matcher.validate_tokens(tokens) == len(tokens)

    assert writes("auto", "It is 10 am.") and writes("auto", 'Let me check.\n<tool_call>{"name": "get_current_time"')
    assert not writes("auto", '<tool_call}>{"name": "convert_time"') and not writes("auto", "<tool_call {")
    assert writes("none", "It is 10 am.") and not writes("none", "<tool_call}>") and not writes("none", "<tool_call>")
