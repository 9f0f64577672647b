"""Tools through a server (issue 28 item 5): `tools`/`tool_choice` in the request, streamed `tool_calls` deltas
assembled, each call checked, consented to and run by the real `mcp-server-time`, results sent back as `tool`
messages. The fake server streams the deltas (arguments split across chunks, two calls in one reply) and
refuses tools as llama-server without `--jinja` does."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta

import jsonschema
import pytest

from conftest import GREEDY, TIME, run_cli
from fake_openai import NO_JINJA, ZONES
from tui_chat.engine.base import Done, Loaded, Message, Request, ToolActivity
from tui_chat.engine.openai import MalformedEvent, OpenAIBackend, RemoteSettings, parse_chunk
from tui_chat.engine.params import LiveParams
from tui_chat.tools.calls import SERVED, call_form
from tui_chat.tools.loop import ToolUse, approve_listed, call_line
from tui_chat.tools.mcp import ToolServers


def connect(url: str, model: str) -> OpenAIBackend:
    backend = OpenAIBackend(RemoteSettings(url, model))
    assert isinstance(backend.load().result(), Loaded)
    return backend


def use_for(backend: OpenAIBackend, servers: ToolServers, choice: str = "auto", approve: str = "all") -> ToolUse:
    tools = servers.start(TIME, 30)
    use = ToolUse(servers, tools, approve_listed([approve]), choice, form=call_form(backend.info))
    assert use.form is SERVED
    return use


def reply(backend: OpenAIBackend, use: ToolUse, prompt: str) -> tuple[Done, list[ToolActivity]]:
    events = list(use.generate(backend.generate, Request([Message("user", prompt)], LiveParams(GREEDY))))
    assert isinstance(events[-1], Done), events[-1]
    return events[-1], [event for event in events if isinstance(event, ToolActivity)]


def test_two_streamed_calls_are_assembled_run_and_answered_as_tool_messages(fake, servers):
    backend = connect(fake.base_url, "tools")
    use = use_for(backend, servers, "required")
    done, activity = reply(backend, use, "What time is it in Tokyo and Paris?")
    first, second = fake.requests
    schemas = {tool.name: tool.schema for tool in use.tools}
    assert [tool["function"]["parameters"] for tool in first["tools"]] == list(schemas.values())
    assert first["tool_choice"] == "required" and second["tool_choice"] == "auto"  # back to auto, as locally
    # the arguments came in 7-character pieces: assembled, they validate and ran on the real server
    assert [call.arguments for call in done.tool_calls] == [{"timezone": zone} for zone in ZONES]
    for call in done.tool_calls:
        jsonschema.validate(call.arguments, schemas[call.name])
        told = datetime.fromisoformat(json.loads(call.result)["datetime"])
        assert call.approved and told.tzinfo is not None
        assert abs(told - datetime.now(told.tzinfo)) < timedelta(minutes=2)
    assert [event.stage for event in activity] == ["asked", "running", "done"] * 2
    # one assistant message with both calls (the server's ids, the arguments as JSON text), then a result each
    assistant, *results = second["messages"][1:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Let me look ."
    assert [(call["id"], json.loads(call["function"]["arguments"])) for call in assistant["tool_calls"]] == [
        ("call_0_x", {"timezone": "Asia/Tokyo"}), ("call_1_x", {"timezone": "Europe/Paris"})]
    assert [(message["role"], message["tool_call_id"]) for message in results] == [("tool", "call_0_x"),
                                                                                  ("tool", "call_1_x")]
    assert json.loads(results[0]["content"])["timezone"] == "Asia/Tokyo"
    assert done.text == "I read 2 results ." and not done.note


def test_a_named_choice_is_sent_as_the_function_the_reply_must_call(fake, servers):
    backend = connect(fake.base_url, "tools")
    reply(backend, use_for(backend, servers, "get_current_time"), "Time in Tokyo?")
    assert fake.requests[0]["tool_choice"] == {"type": "function", "function": {"name": "get_current_time"}}


def test_arguments_the_schema_refuses_are_not_run_and_go_back_as_a_tool_error(fake, servers):
    backend = connect(fake.base_url, "tools")
    done, activity = reply(backend, use_for(backend, servers), "an invalid call, please")
    assert [event.stage for event in activity] == ["done", "done"]  # nobody asked, nothing ran
    for call in done.tool_calls:
        assert not call.approved and call.ms is None and "do not match the tool's schema" in call.error
        assert "\n" not in call_line(call) and call_line(call).endswith("(not run)")
    told = [message["content"] for message in fake.requests[1]["messages"] if message["role"] == "tool"]
    assert len(told) == 2 and all(text.startswith("error: the arguments do not match") for text in told)
    assert done.text == "I read 2 results ."


def test_without_consent_nothing_runs_and_the_model_is_told(fake, servers):
    backend = connect(fake.base_url, "tools")
    done, _ = reply(backend, use_for(backend, servers, approve="none"), "Time in Tokyo?")
    assert all(not call.approved and "not approved" in call.error for call in done.tool_calls)
    assert all("not approved" in message["content"] for message in fake.requests[1]["messages"]
               if message["role"] == "tool")


def test_a_server_that_refuses_tools_says_so_in_one_line_and_the_chat_goes_on_without(fake, servers):
    backend = connect(fake.base_url, "no-tools")
    use = use_for(backend, servers)
    done, _ = reply(backend, use, "Time in Tokyo?")
    assert "cannot take tools" in done.note and NO_JINJA in done.note and "\n" not in done.note
    assert done.text and not done.tool_calls  # written without tools, not pretending
    assert [bool(request.get("tools")) for request in fake.requests] == [True, False]
    done, _ = reply(backend, use, "And now?")  # the chat's tools are off: one request, no note
    assert not use.tools and len(fake.requests) == 3 and "tools" not in fake.requests[2] and not done.note


def test_malformed_tool_call_deltas_are_one_line():
    chunk = parse_chunk(json.dumps({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{\"x\""}}]}}]}))
    assert chunk.calls[0].arguments == '{"x"' and chunk.calls[0].ident == "a"
    for bad in ({"tool_calls": "f"}, {"tool_calls": [{"index": "0"}]}, {"tool_calls": [{"function": {"name": 3}}]}):
        with pytest.raises(MalformedEvent, match="tool_calls"):
            parse_chunk(json.dumps({"choices": [{"delta": bad}]}))


def _run(url: str, *more: str):
    return run_cli("run", "--backend", "openai", "--base-url", url, "--model", "tools", "-p", "Time in Tokyo?",
                   "--mcp", f"{sys.executable} -m mcp_server_time", "--tool-choice", "required", "--json", *more,
                   timeout=120)


def test_run_calls_a_servers_tools_with_the_same_json(fake):
    result = _run(fake.base_url, "--approve", "all")
    assert result.returncode == 0, result.stderr
    turn = json.loads(result.stdout)["turns"][0]
    assert [set(call) for call in turn["tool_calls"]] == [
        {"server", "name", "arguments", "approved", "result", "error", "ms", "cut", "before", "reasoning"}] * 2
    assert all(call["approved"] and call["result"] for call in turn["tool_calls"])
    assert turn["text"] == "I read 2 results ." and "tool: mcp_server_time/get_current_time" in result.stderr
    unapproved = _run(fake.base_url)
    assert unapproved.returncode == 0, unapproved.stderr
    calls = json.loads(unapproved.stdout)["turns"][0]["tool_calls"]
    assert calls and all(not call["approved"] and call["result"] is None for call in calls)
    assert "(not run)" in unapproved.stderr
