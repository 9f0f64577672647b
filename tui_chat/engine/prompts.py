"""Chat prompts: the model's own template, a named one from the config, or a plain transcript.

A GGUF with no `tokenizer.chat_template` is most likely a base model. Its family's instruct template
makes it babble; a plain `User:` / `Assistant:` transcript gets sensible answers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .base import Message

PLAIN = "plain"
AUTO = "auto"

_PLAIN_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{ m.content | trim }}{{ '\n\n' }}"
    "{%- elif m.role == 'user' -%}User: {{ m.content | trim }}{{ '\n' }}"
    "{%- else -%}Assistant: {{ m.content | trim }}{{ '\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)

_CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "<|im_start|>{{ m.role }}{{ '\n' }}{{ m.content }}<|im_end|>{{ '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\n' }}{%- endif -%}"
)

_GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set system = messages[0].content + '\n\n' if messages and messages[0].role == 'system' else '' -%}"
    "{%- for m in messages if m.role != 'system' -%}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}{{ '\n' }}"
    "{{ system if loop.first else '' }}{{ m.content | trim }}<end_of_turn>{{ '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model{{ '\n' }}{%- endif -%}"
)

_LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "<|start_header_id|>{{ m.role }}<|end_header_id|>{{ '\n\n' }}{{ m.content | trim }}<|eot_id|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start_header_id|>assistant<|end_header_id|>{{ '\n\n' }}{%- endif -%}"
)

NAMED_TEMPLATES: dict[str, str] = {
    PLAIN: _PLAIN_TEMPLATE,
    "chatml": _CHATML_TEMPLATE,
    "gemma": _GEMMA_TEMPLATE,
    "llama3": _LLAMA3_TEMPLATE,
}

_IMPLICIT_STOPS: dict[str, tuple[str, ...]] = {PLAIN: ("\nUser:",)}


class PromptError(ValueError):
    """A chat template that cannot be rendered; the message is user-facing."""


@dataclass(frozen=True, slots=True)
class PromptFormat:
    name: str
    source: str
    implicit_stops: tuple[str, ...] = ()

    def render(self, messages: list[Message], bos_token: str = "", eos_token: str = "") -> str:
        try:
            return _compile(self.source).render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        except TemplateError as error:
            raise PromptError(f"chat template {self.name!r} failed: {error}") from None


def choose_format(choice: str, model_template: str | None) -> PromptFormat:
    """`choice` is "auto" (the model's own template, else the plain transcript) or a named template."""
    if choice == AUTO:
        if model_template:
            return PromptFormat("model", model_template)
        choice = PLAIN
    if choice not in NAMED_TEMPLATES:
        known = ", ".join([AUTO, *NAMED_TEMPLATES])
        raise PromptError(f"unknown chat template {choice!r}: choose one of {known}")
    return PromptFormat(choice, NAMED_TEMPLATES[choice], _IMPLICIT_STOPS.get(choice, ()))


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> Template:
    """Compiling costs ~2 ms, more than rendering: once per template, not once per turn."""
    return _ENV.from_string(source)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_ENV.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
