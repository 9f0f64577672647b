"""The chat templates a config or a flag names (`chat_template`): their names and text only, so that
reading the config does not load Jinja; prompts.py compiles and renders them."""

from __future__ import annotations

PLAIN = "plain"
AUTO = "auto"  # the model's own template, else PLAIN

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
