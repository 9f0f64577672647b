"""A model's chat template is code from a stranger: reaching Python's internals, running forever or
building huge values fails in one line naming the template, and the backend keeps serving."""

from __future__ import annotations

import time

import pytest

from conftest import GREEDY, run_cli
from tiny_model import write_tiny_model
from tui_chat.engine.base import Error, Loaded, Message, Request
from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
from tui_chat.engine.params import LiveParams
from tui_chat.engine.prompts import PromptError, choose_format

HOSTILE = {
    "mro": "{{ ''.__class__.__mro__ }}",
    "globals": "{{ cycler.__init__.__globals__ }}",
    "template context": "{{ self._TemplateReference__context }}",
    "lipsum": "{{ lipsum.__globals__ }}",
    "huge range": "{% for x in range(10**9) %}x{% endfor %}",
    "nested loops": "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
    "nested loops, continued": (
        "{% for a in range(99999) %}{% for b in range(99999) %}{% if b < 0 %}{% break %}{% endif %}{% continue %}"
        "{% endfor %}{% endfor %}"
    ),
    "nested loops in a generation block": (
        "{% for a in range(99999) %}{% generation %}{% for b in range(99999) %}{% endfor %}{% endgeneration %}"
        "{% endfor %}"
    ),
    "recursive loop": "{% for a in range(99999) recursive %}{{ loop(range(99999)) }}{% endfor %}",
    "macro fan-out": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "huge string": "{{ 'x' * 10**10 }}",
    "huge power": "{{ 7 ** (10 ** 9) }}",
    "mutation": "{{ messages.append(messages) }}",
    "mutation through dict": "{{ dict.update(messages[0], {'content': 'x'}) }}",
    "division": "{{ 1 / 0 }}",
}
USER = [Message("user", "Hello")]


@pytest.mark.parametrize("template", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_template_fails_fast_in_one_line(template):
    started = time.perf_counter()
    with pytest.raises(PromptError, match="^the model's chat template failed: ") as raised:
        choose_format("auto", template).render(USER)
    assert "\n" not in str(raised.value)
    assert time.perf_counter() - started < 3


def test_a_template_that_only_looks_for_flask_config_renders_nothing_of_ours():
    assert choose_format("auto", "[{{ config }}]").render(USER) == "[]"


def test_a_template_that_does_not_compile_fails_the_load_not_the_turn(tmp_path):
    backend = LlamaBackend(LlamaSettings(write_tiny_model(tmp_path / "broken.gguf", chat_template="{% for %}")))
    try:
        result = backend.load().result()
    finally:
        backend.close()
    assert isinstance(result, Error)
    assert result.message.startswith("the model's chat template cannot be used: ")


def test_the_first_turn_fails_cleanly_and_the_backend_keeps_serving(tmp_path):
    path = write_tiny_model(tmp_path / "hostile.gguf", chat_template=HOSTILE["nested loops"])
    backend = LlamaBackend(LlamaSettings(path, n_ctx=512))
    try:
        assert isinstance(backend.load().result(), Loaded)
        for _ in range(2):
            result = backend.generate(Request(USER, LiveParams(GREEDY))).result()
            assert isinstance(result, Error) and "the model's chat template failed: it ran too long" in result.message
        assert backend.count_tokens("still here") > 0
    finally:
        backend.close()


def test_the_cli_says_so_in_one_line(tmp_path):
    path = write_tiny_model(tmp_path / "hostile.gguf", chat_template=HOSTILE["globals"])
    done = run_cli("run", "-m", str(path), "-p", "Hello", "--temperature", "0")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "the model's chat template failed: access to '__init__'" in done.stderr
