"""Reasoning models on tiny scripted models with real templates and vocabularies: the thinking split from
the answer, its figures, the switch and the budget applied mid-thought, and `tui-chat run` reporting them."""

from __future__ import annotations

import ctypes
import json

import llama_cpp
import pytest

from conftest import GREEDY, collect, open_backend, run_cli
from thinking_model import DEEPSEEK_SPECIALS, template, write_scripted_model
from tui_chat.engine.base import Message, Request, Token
from tui_chat.engine.local.llamacpp import builtin_template_names
from tui_chat.engine.params import LiveParams
from tui_chat.engine.prompts import BUILTIN_EQUIVALENTS, PromptFormat

LOOP = ["\n", "<think>", "Hmm", ",", "Hmm"]  # thinks until it is stopped ...
ANSWER = ["</think>", "Hello", " world"]  # ... and answers once its thinking is ended


@pytest.fixture(scope="module")
def qwen3(thinker_model):
    backend = open_backend(thinker_model, n_ctx=512)
    yield backend
    backend.close()


def reply(backend, params=GREEDY, messages=None, **request):
    messages = messages or [Message("user", "Hi")]
    return collect(backend.generate(Request(messages, LiveParams(params), **request)))


def test_the_thinking_is_split_from_the_answer_with_its_figures(qwen3):
    assert qwen3.info.thinking == "<think>…</think>" and qwen3.info.thinking_switch
    tokens, done = reply(qwen3, top_logprobs=2)
    assert done.stop_reason == "eos"
    assert done.reasoning == "Hmm, let me" and done.text == "Hello world "
    assert "".join(t.reasoning for t in tokens) == done.reasoning
    assert "".join(t.text for t in tokens) == done.text
    assert done.answer_from == 6 and [t.thinking for t in tokens] == [True] * 6 + [False] * 4
    assert "".join(t.piece for t in tokens[: done.answer_from]) == "<think>Hmm, let me</think>"
    assert done.metrics.reasoning_tokens == 6 and done.metrics.answer_tokens == 4
    assert 0 < done.metrics.thinking_s < done.metrics.decode_s + 1
    assert all(t.prob is not None and t.prob > 0.99 for t in tokens)


def test_the_budget_ends_the_thinking_mid_thought_and_the_model_answers(qwen3):
    tokens, done = reply(qwen3, GREEDY.with_changes(thinking_budget=3), top_logprobs=2)
    assert [t.piece for t in tokens] == ["<think>", "Hmm", ",", "</think>", "Hello", " world", " ", ""]
    assert [t.inserted for t in tokens] == [False] * 3 + [True] + [False] * 4
    assert tokens[3].prob is not None and tokens[3].prob < 0.01  # the model would not have ended it there
    assert done.reasoning == "Hmm," and done.text == "Hello world " and done.stop_reason == "eos"
    assert done.metrics.reasoning_tokens == 3 and done.metrics.completion_tokens == 7  # drawn: not the engine's


def test_a_budget_set_mid_thought_applies_from_the_next_token(tmp_path):
    """The model would think forever; lowering the budget while it does ends the thinking at once."""
    path = write_scripted_model(tmp_path / "loop.gguf", template("Qwen-Qwen3-0.6B"), LOOP, also=[ANSWER],
                                words=["Hi"])
    backend = open_backend(path, n_ctx=2048)
    live = LiveParams(GREEDY.with_changes(max_tokens=1500))
    try:
        stream = backend.generate(Request([Message("user", "Hi")], live))
        tokens, done = [], None
        for event in stream:
            if isinstance(event, Token):
                tokens.append(event)
                if len(tokens) == 20:
                    version = live.update(thinking_budget=0) and live.version
            done = event
    finally:
        backend.close()
    assert done.stop_reason == "eos" and done.text == "Hello world"
    assert done.reasoning.startswith("Hmm,Hmm,") and done.metrics.reasoning_tokens >= 20
    ended = next(t for t in tokens if t.inserted)
    assert ended.params_version == version
    assert sum(t.params_version != version and t.at > tokens[19].at for t in tokens) <= 1


def test_thinking_off_goes_to_the_template_and_ends_a_thinking_the_model_opens(qwen3):
    tokens, done = reply(qwen3, thinking=False)
    assert "<think>\n\n</think>" in qwen3.transcript.last_prompt[0]  # Qwen3's template writes an empty thinking
    assert done.reasoning == "" and done.text == "Hello world "
    assert tokens[1].inserted and done.metrics.reasoning_tokens == 1


def test_stop_sequences_and_max_tokens_inside_the_thinking(qwen3):
    _, stopped = reply(qwen3, GREEDY.with_changes(stop=["let"]))
    assert stopped.reasoning == "Hmm, let me" and stopped.text == "Hello world "  # stops apply to the answer
    _, cut = reply(qwen3, GREEDY.with_changes(max_tokens=3))
    assert cut.stop_reason == "length" and cut.reasoning == "Hmm," and cut.text == ""
    assert cut.answer_from == 3 and cut.metrics.reasoning_tokens == 3


def test_the_next_turn_drops_the_thinking_and_reuses_what_it_can(qwen3):
    _, first = reply(qwen3)
    history = [Message("user", "Hi"), Message("assistant", first.text, first.reasoning), Message("user", "Again")]
    _, second = reply(qwen3, messages=history)
    prompt = qwen3.transcript.last_prompt[0]
    assert "Hmm" not in prompt and "Hello world" in prompt  # Qwen3 leaves earlier thinking out
    assert 0 < second.metrics.cached_tokens < second.metrics.prompt_tokens
    assert second.text == "Hello world "


def test_a_prompt_that_opens_the_thinking_starts_the_reply_inside_it(tmp_path):
    path = write_scripted_model(tmp_path / "r1.gguf", template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"),
                                ["\n", "Hmm", "</think>", "Hello"], words=["Hi"], specials=DEEPSEEK_SPECIALS,
                                bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", add_bos=True)
    backend = open_backend(path, n_ctx=512)
    try:
        tokens, done = reply(backend)
        assert backend.transcript.last_prompt[0].endswith("<｜Assistant｜><think>\n")
    finally:
        backend.close()
    assert done.reasoning == "Hmm" and done.text == "Hello" and done.answer_from == 2
    assert [t.thinking for t in tokens] == [True, True, False, False]


def test_run_json_reports_reasoning_and_the_reply_as_the_conversation_holds_it(thinker_model):
    common = ("run", "-m", str(thinker_model), "-p", "Hi", "--temperature", "0", "--n-ctx", "512", "--json")
    full = json.loads(run_cli(*common).stdout)["turns"][0]
    assert full["text"] == "Hello world " and full["reasoning"] == "Hmm, let me"
    assert full["reasoning_tokens"] == 6 and full["completion_tokens"] == 10
    budget = json.loads(run_cli(*common, "--thinking-budget", "2").stdout)["turns"][0]
    assert budget["reasoning"] == "Hmm" and budget["reasoning_tokens"] == 2 and budget["text"] == "Hello world "
    off = json.loads(run_cli(*common, "--thinking", "off").stdout)["turns"][0]
    assert off["reasoning"] == "" and off["text"] == "Hello world "
    plain = run_cli(*common[:-1])
    assert plain.stdout == "Hello world\n"  # the answer only, without the whitespace around it


def test_a_built_in_template_name_is_never_rendered_as_a_template(tmp_path):
    """llama.cpp names its C++ "mistral-v7-tekken" format for a file with no template, a tekken vocabulary and
    40 layers (Mistral-Small-2503); the name is replaced by that format as Jinja, which renders as llama.cpp does."""
    path = write_scripted_model(tmp_path / "tekken.gguf", None, ["Hi", "Hello"], pre="tekken", n_layer=40,
                                specials={"<s>": 3, "</s>": 3}, bos="<s>", eos="</s>", add_bos=True)
    assert "mistral-v7-tekken" in builtin_template_names()
    backend = open_backend(path, n_ctx=512)
    try:
        assert backend.session.chat_template() == BUILTIN_EQUIVALENTS["mistral-v7-tekken"]
        assert backend.info.chat_format == "model"
    finally:
        backend.close()
    chat = [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello"),
            Message("user", "Again")]
    ours = PromptFormat("model", BUILTIN_EQUIVALENTS["mistral-v7-tekken"]).render(chat, "<s>", "</s>")
    assert ours == _llama_cpp_rendering("mistral-v7-tekken", chat)


def _llama_cpp_rendering(name: str, chat: list[Message]) -> str:
    messages = (llama_cpp.llama_chat_message * len(chat))(
        *[llama_cpp.llama_chat_message(m.role.encode(), m.content.encode()) for m in chat])
    buffer = ctypes.create_string_buffer(4096)
    size = llama_cpp.llama_chat_apply_template(name.encode(), messages, len(chat), True, buffer, len(buffer))
    return buffer.raw[:size].decode()


# --- remote servers: the thinking sent apart (fake_openai "thinking") ------------------------------------------


@pytest.mark.parametrize("family", ["llama-server", "vllm"])
def test_a_servers_reasoning_content_lands_in_the_thinking_and_its_budget_is_sent(family):
    from fake_openai import REPLY, fake_server
    from test_remote import connect

    with fake_server(family=family) as server:
        backend = connect(server.base_url, "thinking")
        try:
            assert "thinking_budget" not in backend.info.ignored_params  # both take a budget: not greyed
            tokens, done = reply(backend, top_logprobs=1)
            _, cut = reply(backend, GREEDY.with_changes(thinking_budget=2))
            _, off = reply(backend, thinking=False)
        finally:
            backend.close()
    assert done.reasoning == "Hmm, let me see" and done.text == REPLY and done.answer_from == 5
    assert [t.thinking for t in tokens[:6]] == [True] * 5 + [False]
    assert "".join(t.reasoning for t in tokens) == done.reasoning and tokens[0].piece == "Hmm"
    assert done.metrics.reasoning_tokens == 5 and done.metrics.thinking_s is not None
    field = "thinking_budget_tokens" if family == "llama-server" else "thinking_token_budget"
    first, budgeted, switched = server.requests
    assert field not in first and "chat_template_kwargs" not in first  # no limit, thinking on: the server's defaults
    assert budgeted[field] == 2 and cut.reasoning == "Hmm," and cut.metrics.reasoning_tokens == 2
    assert switched["chat_template_kwargs"] == {"enable_thinking": False} and off.reasoning == ""


def test_a_server_that_takes_no_budget_has_it_greyed_and_not_sent():
    from fake_openai import fake_server
    from test_remote import connect

    with fake_server(family="openai") as server:
        backend = connect(server.base_url, "thinking")
        try:
            assert "thinking_budget" in backend.info.ignored_params
            _, done = reply(backend, GREEDY.with_changes(thinking_budget=2), thinking=False)
        finally:
            backend.close()
    assert "thinking_budget_tokens" not in server.requests[-1] and "chat_template_kwargs" not in server.requests[-1]
    assert done.reasoning == "Hmm, let me see"  # the server thought as it does


# --- bad input ------------------------------------------------------------------------------------------------


def test_bad_thinking_settings_are_one_line(tmp_path, thinker_model):
    from tui_chat.config import ConfigError, load_config
    from tui_chat.engine.openai.wire import MalformedEvent, parse_chunk

    config = tmp_path / "config.toml"
    config.write_text('thinking = "yes"\n')
    with pytest.raises(ConfigError, match=r"thinking must be true or false \(got 'yes'\)"):
        load_config(config)
    refused = run_cli("run", "-m", str(thinker_model), "-p", "Hi", "--thinking", "maybe")
    assert refused.returncode == 2 and "argument --thinking: invalid choice: 'maybe'" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) <= 2  # argparse's usage line, then the one-line error
    with pytest.raises(MalformedEvent, match="'reasoning_content' is not text"):
        parse_chunk('{"choices": [{"delta": {"reasoning_content": 5}}]}')
