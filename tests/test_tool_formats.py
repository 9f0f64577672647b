"""Tool calls in each family's own form, on tiny scripted models with the real Qwen 3, Llama 3.1 and Mistral
Nemo templates and vocabularies shaped like theirs (tests/thinking_model.py): the tools reach the template as
transformers passes them, the model's call is written under its family's grammar and recognised, the real
`mcp-server-time` runs it, and the next step's prompt holds the call and its result as the template renders
them. The starter, whose template takes no tools, keeps the generic form (tests/test_tools.py)."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from pathlib import Path

import pytest
from gguf import TokenType

from conftest import GREEDY, TIME, open_backend
from test_session import finish
from thinking_model import QWEN_SPECIALS, template, write_scripted_model
from tui_chat.commands.common import opener_for
from tui_chat.config import Config
from tui_chat.engine.base import Done, Message, Request, ToolCall
from tui_chat.engine.params import LiveParams
from tui_chat.engine.prompts import MODEL, PromptFormat, call_syntax
from tui_chat.export import from_json, to_json, to_markdown
from tui_chat.history import History, HistoryError, tool_calls_from
from tui_chat.pricing import PRESETS
from tui_chat.recording import Saving
from tui_chat.session import ChatSession, opened
from tui_chat.tools.calls import GENERIC, CallForm, call_form, step_messages, template_tools
from tui_chat.tools.loop import ToolUse, approve_listed, decided
from tui_chat.tools.mcp import Tool
from tui_chat.workspace import Workspace

QUESTION = "What time is it in Tokyo?"
# The call each model writes, token by token (each piece one token of its vocabulary, none twice).
ARGUMENTS = ['{"timezone": ', '"Asia/Tokyo"']
QWEN = ["\n", "<tool_call>", '\n{"name": ', '"get_current_time"', ', "arguments": ', *ARGUMENTS, "}}\n",
        "</tool_call>"]
LLAMA = ["\n\n", '{"name": ', '"get_current_time"', ', "parameters": ', *ARGUMENTS, "}}"]
MISTRAL = ["[/INST]", "[TOOL_CALLS]", '[{"name": ', '"get_current_time"', ', "arguments": ', *ARGUMENTS, "}}]"]
MISTRAL_ANSWER = ["[/TOOL_RESULTS]", "It", " is", " late"]  # after the result: its own answer
LLAMA_SPECIALS = {name: TokenType.CONTROL for name in (
    "<|begin_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>")}
MISTRAL_SPECIALS = {name: TokenType.CONTROL for name in (
    "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]")}
# Qwen's `<tool_call>` and `</tool_call>` are added tokens that print, as `<think>` is
QWEN_TOOL_SPECIALS = QWEN_SPECIALS | {"<tool_call>": TokenType.USER_DEFINED, "</tool_call>": TokenType.USER_DEFINED}
WORDS = ["What", " time", " is", " it", " in", " Tokyo", "?"]


def write_family(kind: str, path: Path) -> Path:
    if kind == "hermes":
        return write_scripted_model(path, template("Qwen-Qwen3-0.6B"), QWEN, specials=QWEN_TOOL_SPECIALS, words=WORDS)
    if kind == "llama3":
        return write_scripted_model(path, template("meta-llama-Llama-3.1-8B-Instruct"), LLAMA,
                                    specials=LLAMA_SPECIALS, bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
                                    pre="llama-bpe", words=WORDS)
    return write_scripted_model(path, template("mistralai-Mistral-Nemo-Instruct-2407"), MISTRAL,
                                specials=MISTRAL_SPECIALS, bos="<s>", eos="</s>", add_bos=True, pre="tekken",
                                words=WORDS, also=[MISTRAL_ANSWER])


@pytest.fixture(scope="module", params=["hermes", "llama3", "mistral"])
def family(request, tmp_path_factory: pytest.TempPathFactory):
    backend = open_backend(write_family(request.param, tmp_path_factory.mktemp(request.param) / "m.gguf"),
                           n_ctx=4096)
    yield request.param, backend
    backend.close()


def test_templates_that_take_tools_are_told_apart_by_how_they_write_calls():
    found = {name: (syntax.family if (syntax := call_syntax(template(name))) else None) for name in (
        "Qwen-Qwen3-0.6B", "Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407", "Qwen3-Coder",
        "Mistral-Small-3.2-24B-Instruct-2506", "google-gemma-2-2b-it")}
    assert found == {"Qwen-Qwen3-0.6B": "hermes", "Qwen-Qwen2.5-7B-Instruct": "hermes",
                     "meta-llama-Llama-3.1-8B-Instruct": "llama3", "meta-llama-Llama-3.2-3B-Instruct": "llama3",
                     "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
                     "Qwen3-Coder": None, "Mistral-Small-3.2-24B-Instruct-2506": None,  # other forms: generic
                     "google-gemma-2-2b-it": None}


def test_the_model_is_told_of_the_tools_through_its_template(family, servers):
    kind, backend = family
    tools = servers.start(TIME, 30)
    assert backend.info.tool_syntax == kind and call_form(backend.info).templated
    assert dict(backend.info.call_tokens).keys() == {"hermes": {"<tool_call>", "</tool_call>"},
                                                     "llama3": {"<|python_tag|>"},
                                                     "mistral": {"[TOOL_CALLS]"}}[kind]
    stream = backend.generate(Request([Message("user", QUESTION)], LiveParams(GREEDY), tools=template_tools(tools)))
    assert isinstance(stream.result(), Done)
    prompt = backend.transcript.last_prompt[0]
    listed = '{"type": "function", "function": {"name": "get_current_time", "description": '
    indented = '"function": {\n        "name": "get_current_time"'  # Llama's template indents them
    assert listed in prompt or indented in prompt
    assert {"hermes": "<tools>", "llama3": "Environment: ipython", "mistral": "[AVAILABLE_TOOLS]"}[kind] in prompt


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_a_call_in_the_familys_form_runs_and_its_result_is_rendered_as_the_template_expects(family, servers,
                                                                                             choice):
    kind, backend = family
    tools = servers.start(TIME, 30)
    use = ToolUse(servers, tools, approve_listed(["all"]), choice, call_limit=1, form=call_form(backend.info))
    stream = use.generate(backend.generate, Request([Message("user", QUESTION)], LiveParams(GREEDY)))
    done = stream.result()
    assert isinstance(done, Done), done
    call = done.tool_calls[0]
    assert (call.name, call.arguments, call.approved) == ("get_current_time", {"timezone": "Asia/Tokyo"}, True)
    assert json.loads(call.result)["timezone"] == "Asia/Tokyo"
    script = {"hermes": QWEN, "llama3": LLAMA, "mistral": MISTRAL}[kind]
    assert done.metrics.tool_call_tokens == len(script)  # the call's tokens after the prompt's last, and its end
    assert done.metrics.tool_result_tokens >= len(backend.session.tokenize(call.result, add_bos=False))
    prompt = backend.transcript.last_prompt[0]  # the step after the call: the call and its result, templated
    assert step_rendered(kind, call.result) in prompt
    if kind == "mistral":
        assert done.text == "It is late"


def test_a_later_turn_holds_the_earlier_calls_and_results_as_the_template_expects(family, servers):
    kind, backend = family
    session = ChatSession(LiveParams(GREEDY))
    session.tools = ToolUse(servers, servers.start(TIME, 30), approve_listed(["all"]), "required", call_limit=1,
                            form=call_form(backend.info))
    first = session.ask(QUESTION, backend.generate)
    assert finish(session).kind == "finished"
    session.ask("Again", backend.generate)
    assert finish(session).kind == "finished"
    prompt = backend.transcript.last_prompt[0]
    replayed = step_rendered(kind, first.reply.tool_calls[0].result)
    assert replayed in prompt and prompt.index(replayed) < prompt.index("Again")


def step_rendered(kind: str, result: str) -> str:
    """A call to get_current_time for Tokyo and its result, as each family's template renders them."""
    return {
        "hermes": '<|im_start|>assistant\n<tool_call>\n{"name": "get_current_time", "arguments": '
                  f'{{"timezone": "Asia/Tokyo"}}}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
                  f"{result}\n</tool_response><|im_end|>",
        "llama3": '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_current_time", "parameters": '
                  f'{{"timezone": "Asia/Tokyo"}}}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n'
                  f"{json.dumps(result)}<|eot_id|>",
        "mistral": '[TOOL_CALLS][{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}, "id": '
                   f'"call00001"}}]</s>[TOOL_RESULTS]{{"content": {result}, "call_id": "call00001"}}[/TOOL_RESULTS]',
    }[kind]


def test_a_llama_call_opened_with_its_python_tag_is_recognised(tmp_path, servers):
    path = write_scripted_model(tmp_path / "tagged.gguf", template("meta-llama-Llama-3.2-3B-Instruct"),
                                [LLAMA[0], "<|python_tag|>", *LLAMA[1:]], specials=LLAMA_SPECIALS,
                                bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True, pre="llama-bpe", words=WORDS)
    backend = open_backend(path, n_ctx=4096)
    try:
        use = ToolUse(servers, servers.start(TIME, 30), approve_listed(["all"]), "auto", call_limit=1,
                      form=call_form(backend.info))
        done = use.generate(backend.generate, Request([Message("user", QUESTION)], LiveParams(GREEDY))).result()
    finally:
        backend.close()
    assert isinstance(done, Done) and done.tool_calls[0].arguments == {"timezone": "Asia/Tokyo"}


def test_calls_are_saved_with_the_chat_exported_imported_and_replayed_when_it_reopens(family, servers, tmp_path):
    kind, backend = family
    with History(tmp_path / "history.sqlite3") as history:
        saving = Saving(history, PRESETS["GPT-4o"])
        session = ChatSession(LiveParams(GREEDY), saving=saving)
        use = ToolUse(servers, servers.start(TIME, 30), approve_listed(["all"]), "required", call_limit=1,
                      form=call_form(backend.info))
        session.tools = use
        turn = session.ask(QUESTION, backend.generate)
        assert finish(session).kind == "finished"
        made = tuple(turn.reply.tool_calls)
        stored = history.load(session.conversation_id)
        assert stored.path[-1].tool_calls == made and made[0].result is not None

        exported = json.loads(json.dumps(to_json(stored)))
        assert exported["messages"][-1]["tool_calls"] == [call.as_dict() for call in made]
        imported = history.load(history.add_conversation(from_json(exported)))
        assert imported.path[-1].tool_calls == made
        markdown = to_markdown(stored)
        assert "<details><summary>tool time/get_current_time · " in markdown and made[0].result in markdown

        again = opened(imported, LiveParams(GREEDY), saving)
        again.tools = use
        assert again.turns[0].reply.tool_calls == list(made)
        assert again.messages()[1:3] == use.replay(made)  # the next prompt holds them as the model saw them


def test_a_bad_tool_call_in_an_export_is_one_line():
    with pytest.raises(HistoryError, match=r"tool_calls\[0\] needs 'arguments'"):
        tool_calls_from([{"server": "s", "name": "n", "arguments": "{}", "approved": True, "result": None,
                          "error": None, "ms": None, "cut": 0}], "messages[1]")


def test_the_generic_form_is_kept_for_a_model_whose_template_takes_no_tools(tiny):
    assert tiny.info.tool_syntax == "" and call_form(tiny.info) is GENERIC
    assert call_form(None) is GENERIC


def test_each_family_renders_a_step_as_transformers_passes_it():
    """What the template is given for a call and its result, rendered without a model."""
    fmt = PromptFormat(MODEL, template("Qwen-Qwen3-0.6B"))
    syntax = fmt.calls
    assert syntax is not None
    form = CallForm(syntax.head, syntax.tail, syntax.markers[0], syntax.arguments, templated=True)
    call = ToolCall("time", "get_current_time", {"timezone": "UTC"}, before="Let me look.")
    steps = step_messages([(call, "12:00")], form, 7)
    assert steps[0].tool_calls == ({"id": "call00007", "type": "function",
                                    "function": {"name": "get_current_time", "arguments": {"timezone": "UTC"}}},)
    assert steps[1].role == "tool" and steps[1].tool_call_id == "call00007"
    rendered = fmt.render([Message("user", QUESTION), *steps], "", "", fmt.options(True, ()))
    assert ('Let me look.\n<tool_call>\n{"name": "get_current_time", "arguments": {"timezone": "UTC"}}\n'
            '</tool_call>' in rendered)
    generic = step_messages([(call, "12:00")], GENERIC, 7)
    assert [m.role for m in generic] == ["assistant", "user"] and generic[1].content.startswith("<tool_response>")


def test_a_chats_tools_follow_the_model_it_switches_to(tiny_model, tmp_path):
    """Switched on with the starter-like tiny model (generic form), then the chat goes on with a Qwen 3: its
    template's form from the next reply."""
    config = Config(sampling=GREEDY, n_ctx=4096)
    workspace = Workspace(config, opener_for(config)[0])
    try:
        workspace.load_now(str(tiny_model))
        workspace.new_chat(LiveParams(GREEDY))
        tool = Tool("time", "get_current_time", "", {"type": "object"})
        workspace.consent = lambda call: decided("deny")
        workspace.use_tools([tool], "auto")
        assert workspace.chat_tools is not None and workspace.chat_tools.form is GENERIC
        workspace.load_now(str(write_family("hermes", tmp_path / "qwen.gguf")))
        assert workspace.chat_tools.form.templated and workspace.chat_tools.form.head == "<tool_call>\n"
    finally:
        workspace.close()
        if workspace.backend is not None:
            workspace.backend.close()


def test_a_qwen3_that_thinks_before_its_call_thinks_free_and_the_next_step_shows_its_thinking(tmp_path, servers):
    """The grammar governs the answer only: the thinking is drawn free of it, then the call follows."""
    thinking = ["\n", "<think>", "Hmm", "</think>", "\n\n", *QWEN[1:]]
    path = write_scripted_model(tmp_path / "thinks.gguf", template("Qwen-Qwen3-0.6B"), thinking,
                                specials=QWEN_TOOL_SPECIALS, words=WORDS)
    backend = open_backend(path, n_ctx=4096)
    try:
        use = ToolUse(servers, servers.start(TIME, 30), approve_listed(["all"]), "required", call_limit=1,
                      form=call_form(backend.info))
        done = use.generate(backend.generate, Request([Message("user", QUESTION)], LiveParams(GREEDY))).result()
        prompt = backend.transcript.last_prompt[0]
    finally:
        backend.close()
    assert isinstance(done, Done) and done.tool_calls[0].arguments == {"timezone": "Asia/Tokyo"}
    assert '<|im_start|>assistant\n<think>\nHmm\n</think>\n\n<tool_call>\n{"name": "get_current_time"' in prompt


def test_a_calls_step_keeps_its_text_tokens_and_grammar_and_consent_is_not_model_time(tmp_path, servers):
    """A step that writes a sentence, then a call (auto): the sentence and the step's tokens stay with the call,
    the call's tokens carry the grammar's mask, and a later turn reads the sentence again before the call. The
    user takes 0.6 s to say yes: the wait is `consent_s`, in no model figure."""
    said = ["Let", " me", " look", "."]
    path = write_scripted_model(tmp_path / "says.gguf", template("Qwen-Qwen3-0.6B"), [QWEN[0], *said, *QWEN[1:]],
                                specials=QWEN_TOOL_SPECIALS, words=[*WORDS, "Again"])
    backend = open_backend(path, n_ctx=4096)

    def slow_yes(_call: ToolCall) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        threading.Timer(0.6, future.set_result, ("once",)).start()
        return future

    try:
        session = ChatSession(LiveParams(GREEDY), top_logprobs=5)
        session.tools = ToolUse(servers, servers.start(TIME, 30), slow_yes, "auto", call_limit=1,
                                form=call_form(backend.info))
        first = session.ask(QUESTION, backend.generate)
        ending = finish(session)
        call = first.reply.tool_calls[0]
        assert call.before == "Let me look." and call.result is not None
        assert "".join(token.text for token in call.tokens).startswith("Let me look.<tool_call>")
        assert all(token.prob is not None for token in call.tokens)
        opened_at = next(i for i, token in enumerate(call.tokens) if token.text == "<tool_call>")
        assert all(token.grammar is not None for token in call.tokens[opened_at + 1:])  # the mask, token by token
        m = ending.done.metrics
        assert m.consent_s >= 0.55 and m.ttft_s is not None and m.ttft_s < 0.5  # the first step's, no wait in it
        assert "waited 0.6 s for consent" in first.reply.footer
        session.ask("Again", backend.generate)
        finish(session)
    finally:
        backend.close()
    prompt = backend.transcript.last_prompt[0]
    assert 'Let me look.\n<tool_call>\n{"name": "get_current_time"' in prompt
    assert prompt.index("Let me look.") < prompt.index("Again")
