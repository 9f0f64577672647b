"""Chat templates render as transformers' `apply_chat_template` renders them, the reference model authors
write and test their templates against: every template llama.cpp ships (tests/templates/), then one small
template per feature of transformers' Jinja environment. The same text, or both refuse."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import transformers.utils.chat_template_utils as transformers_templates
from gguf import GGUFReader
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from conftest import ask, open_backend
from tiny_model import write_tiny_model
from tui_chat.engine import prompts
from tui_chat.engine.base import Message
from tui_chat.engine.prompts import PromptError, choose_format

TEMPLATES = sorted((Path(__file__).parent / "templates").glob("*.jinja"))
BOS, EOS = "<s>", "</s>"
REFUSED = "<refused>"

SYSTEM = Message("system", "Be brief.")
QUESTION = Message("user", "What does \"<b>café</b>\" mean? It's 5 & 6.")  # what HTML-safe JSON would escape
ANSWER = Message("assistant", "Coffee.")
FOLLOW_UP = Message("user", "And thé?")
CHATS = {
    "system+user": [SYSTEM, QUESTION],
    "user": [QUESTION],
    "multi-turn": [QUESTION, ANSWER, FOLLOW_UP],
    "system+multi-turn": [SYSTEM, QUESTION, ANSWER, FOLLOW_UP],
}
THINKING = ({"enable_thinking": False}, {"enable_thinking": True})

# The templates: refused at load for `{% break %}`, `{% continue %}` or `{% generation %}`.
ONCE_REFUSED = {
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Cohere2MoE", "Kimi-K3", "Reka-Edge",
    "LFM2.5-8B-A1B", "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2",
}
# transformers passes `tools=None`, and these loop over tools (or `functions`) whatever the chat.
NEED_TOOLS = {
    "CohereForAI-c4ai-command-r-plus-tool_use", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "fireworks-ai-llama-3-firefunction-v2",
}
NO_SYSTEM_ROLE = {"google-gemma-2-2b-it"}


class _FrozenClock(dt.datetime):
    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> _FrozenClock:
        return cls(2026, 2, 3, 4, 5, 6, tzinfo=tz)


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Templates that print today's date print the same one on both sides, midnight or not."""
    for module in (prompts, transformers_templates):
        monkeypatch.setattr(module, "datetime", _FrozenClock)


@pytest.fixture(scope="module")
def reference():
    """transformers' own `apply_chat_template`, on a tokenizer whose only special tokens are BOS and EOS,
    as in a GGUF: transformers passes the special tokens a tokenizer has, no others."""
    vocabulary = Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocabulary, bos_token=BOS, eos_token=EOS)

    def render(source: str, chat: list[Message], extra: dict) -> str:
        conversation = [{"role": m.role, "content": m.content} for m in chat]
        try:
            return tokenizer.apply_chat_template(
                conversation, chat_template=source, tokenize=False, add_generation_prompt=True, **extra
            )
        except Exception:  # noqa: BLE001 - any refusal is the refusal ours must match
            return REFUSED

    return render


def ours(source: str, chat: list[Message], extra: dict) -> str:
    try:
        return choose_format("auto", source).render(chat, BOS, EOS, extra)
    except PromptError:
        return REFUSED


def test_every_template_llama_cpp_ships_is_here():
    names = {path.stem for path in TEMPLATES}
    assert len(names) == 70 and ONCE_REFUSED | NEED_TOOLS | NO_SYSTEM_ROLE <= names


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda path: path.stem)
def test_a_template_llama_cpp_ships_renders_as_in_transformers(path, reference):
    source = path.read_text(encoding="utf-8")
    extras = ({}, *THINKING) if "enable_thinking" in source else ({},)
    for name, chat in CHATS.items():
        for extra in extras:
            expected = reference(source, chat, extra)
            assert ours(source, chat, extra) == expected, (name, extra)
            refusal_expected = path.stem in NEED_TOOLS or (path.stem in NO_SYSTEM_ROLE and chat[0] is SYSTEM)
            assert (expected == REFUSED) == refusal_expected, (name, extra)


FEATURES = {
    "break": "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.content }}|{% endfor %}",
    "continue": "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.role }} {% endfor %}",
    "break from an inner loop": (
        "{% for m in messages %}{% for c in m.content %}{% if c == ' ' %}{% break %}{% endif %}{{ c }}{% endfor %}"
        "{% if loop.last %}{% break %}{% endif %}/{% endfor %}"
    ),
    "loop facts": "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '.' if loop.last }} {% endfor %}",
    "generation": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{% set seen = m.content %}"
        "[{{ m.content }}]{{ loop.index }}{% endgeneration %}{% endif %}{% endfor %}{{ seen is defined }}"
    ),
    "tojson": "{{ messages | tojson }}",
    "tojson indent, sort_keys": "{{ {'b': [1, 'é<&'], 'a': none} | tojson(indent=2, sort_keys=true) }}",
    "tojson separators, ensure_ascii": "{{ messages[1] | tojson(separators=(',', ':'), ensure_ascii=true) }}",
    "variables": (
        "{{ tools is defined }} {{ tools is none }} {{ documents is defined }} {{ documents is none }} "
        "{{ add_generation_prompt }} {{ bos_token }} {{ eos_token }} {{ unk_token is defined }} "
        "{{ enable_thinking is defined and enable_thinking }} {{ messages[0].keys() | list }}"
    ),
    "strftime_now": "{{ strftime_now('%Y-%m-%d %H:%M:%S %A') }}",
    "raise_exception": "{{ raise_exception('System role not supported') }}",
    "dict": "{{ dict(a=1, n=messages | length) }} {{ dict.fromkeys(['x'], 0) }} {{ dict.update is defined }}",
    "dict mutating a message": "{{ dict.update(messages[0], {'content': 'changed'}) }}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "namespace, underscore name set": "{% set ns = namespace() %}{% set ns._n = 1 %}",
    "namespace, underscore name made": "{% set ns = namespace(_n=1) %}",
    "unknown tag": "{% frobnicate %}",
}
REFUSING_FEATURES = {
    "raise_exception", "dict mutating a message", "namespace, underscore name set", "namespace, underscore name made",
    "unknown tag",
}


@pytest.mark.parametrize("source", FEATURES.values(), ids=FEATURES.keys())
@pytest.mark.parametrize("extra", [{}, {**THINKING[0], "bos_token": "<|begin|>"}], ids=["plain", "extra"])
def test_each_feature_of_the_transformers_environment_renders_as_there(source, extra, reference):
    chat = CHATS["system+multi-turn"]
    expected = reference(source, chat, extra)
    assert ours(source, chat, extra) == expected
    assert (expected == REFUSED) == (source in {FEATURES[name] for name in REFUSING_FEATURES})


def test_of_several_named_templates_the_default_is_used(tmp_path):
    """llama.cpp's `llama_model_chat_template(model, NULL)` reads `tokenizer.chat_template`, the default, as
    transformers' `get_chat_template` picks "default" for a chat without tools."""
    path = write_tiny_model(tmp_path / "named.gguf", chat_template=[
        {"name": "default", "template": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"},
        {"name": "tool_use", "template": "{{ raise_exception('the tool_use template was used') }}"},
    ])
    assert GGUFReader(path).get_field("tokenizer.chat_template.tool_use") is not None
    backend = open_backend(path, n_ctx=512)
    try:
        assert backend.info.chat_format == "model"
        prompt_tokens = ask(backend, "Hello").metrics.prompt_tokens
        assert prompt_tokens == 1 + backend.count_tokens("user: Hello\n")  # BOS, then the default's text
    finally:
        backend.close()
