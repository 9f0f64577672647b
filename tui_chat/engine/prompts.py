"""Chat prompts: the model's own template, a named one from the config, or a plain transcript.

A GGUF with no `tokenizer.chat_template` is most likely a base model. Its family's instruct template
makes it babble; a plain `User:` / `Assistant:` transcript gets sensible answers.

A reasoning model thinks before it answers, between markers its template knows (`THINKING_SYNTAXES`):
the format says which, whether the template takes a thinking switch (`enable_thinking`), and whether a
rendered prompt already opens the thinking (Qwen3 and DeepSeek-R1 distills end it with `<think>\n`).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import Template, TemplateError, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from .base import Message
from .templates import AUTO, NAMED_TEMPLATES, PLAIN

MODEL = "model"  # the format name of a model's own template
MAX_RENDER_STEPS = 200_000  # loop turns and calls in one render; a long chat takes a few thousand
MAX_RENDER_SECONDS = 5.0
MAX_PROMPT_CHARS = 16_000_000  # about 4M tokens, past the largest context
MAX_REPEAT_ITEMS = 1_000_000  # what `'x' * n` and `[..] * n` may build
MAX_POWER_BITS = 100_000  # what `n ** m` may build

_IMPLICIT_STOPS: dict[str, tuple[str, ...]] = {PLAIN: ("\nUser:",)}

# llama.cpp's `llama_model_chat_template` names one of its own C++ formats, not a Jinja template, for a
# few popular models whose files carry none (Mistral-Small-2503: tekken vocabulary, 40 layers). Its
# output as Jinja, as llama.cpp's `llm_chat_apply_template` writes it (the tokenizer adds the BOS).
BUILTIN_EQUIVALENTS: dict[str, str] = {
    "mistral-v7-tekken": (
        "{%- for m in messages -%}"
        "{%- if m.role == 'system' -%}[SYSTEM_PROMPT]{{ m.content }}[/SYSTEM_PROMPT]"
        "{%- elif m.role == 'user' -%}[INST]{{ m.content }}[/INST]"
        "{%- else -%}{{ m.content }}</s>"
        "{%- endif -%}"
        "{%- endfor -%}"
    ),
}


@dataclass(frozen=True, slots=True)
class ThinkingSyntax:
    """How a template family marks a reply's thinking. `close` is also what the engine writes to end the
    thinking when its budget is spent: the text that takes the model from thinking to answering."""

    family: str
    open: str
    close: str
    detect: str = ""  # what in a template's source names the family (default: `close`)

    @property
    def label(self) -> str:
        return f"{self.open.strip()}…{self.close.strip()}"


THINK = ThinkingSyntax("think tags", "<think>", "</think>")
# Most specific first: a template is matched by the first whose `detect` text (or `close`) it contains.
THINKING_SYNTAXES: tuple[ThinkingSyntax, ...] = (
    ThinkingSyntax("Seed-OSS", "<seed:think>", "</seed:think>"),
    ThinkingSyntax("MiniMax-M3", "<mm:think>", "</mm:think>"),
    ThinkingSyntax("Hunyuan", "<think:opensource>", "</think:opensource>", detect="'<think{}>'.format(HYTK)"),
    ThinkingSyntax("Command R / Command A", "<|START_THINKING|>", "<|END_THINKING|>"),
    ThinkingSyntax("Magistral / Ministral reasoning", "[THINK]", "[/THINK]"),
    ThinkingSyntax("gpt-oss", "<|channel|>analysis<|message|>",
                   "<|end|><|start|>assistant<|channel|>final<|message|>", detect="<|channel|>analysis"),
    ThinkingSyntax("Gemma 4", "<|channel>thought", "<channel|>", detect="<|channel>thought"),
    ThinkingSyntax("Kimi K3", "<|open|>think<|sep|>", "<|close|>think<|sep|><|open|>response<|sep|>",
                   detect="open_tag('think'"),
    ThinkingSyntax("Solar Open", "<|think|>", "<|end|><|begin|>assistant<|content|>",
                   detect="assistant<|think|>"),
    ThinkingSyntax("Apertus", "<|inner_prefix|>", "<|inner_suffix|>"),
    ThinkingSyntax("Apriel", "Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"),
    THINK,  # Qwen3, QwQ, DeepSeek-R1 and V3.1+, GLM, Kimi K2, MiniMax-M2, Nemotron, SmolLM3, Granite, ...
)


@dataclass(frozen=True, slots=True)
class CallSyntax:
    """How a template family writes a tool call the model makes: `head`, then `{"name": NAME, ARGUMENTS: {…}}`,
    then `tail` (the template renders earlier calls the same way). `markers`: the parts of `head` and `tail`
    that may be one token of the family's vocabulary, the one that opens a call first."""

    family: str
    detect: str  # what in a template's source says it writes calls this way
    head: str
    tail: str
    arguments: str = "arguments"
    markers: tuple[str, ...] = ()


# A template that takes tools in another form (Qwen3-Coder's XML, Mistral's `[ARGS]`, GLM's `<arg_key>`) gets
# none of these: its model is told of the tools in the generic form (tools/calls.py).
CALL_SYNTAXES: tuple[CallSyntax, ...] = (
    CallSyntax("hermes", '<tool_call>\\n{"name": ', "<tool_call>\n", "\n</tool_call>",
               markers=("<tool_call>", "</tool_call>")),
    CallSyntax("llama3", '"parameters": dictionary of argument name', "", "", "parameters",
               markers=("<|python_tag|>",)),  # a bare call, which the model may open with <|python_tag|>
    CallSyntax("mistral", "[TOOL_CALLS][", "[TOOL_CALLS][", "]", markers=("[TOOL_CALLS]",)),
)


def call_syntax(source: str) -> CallSyntax | None:
    """How a template's model writes tool calls; None where the template takes no tools it can be given."""
    return next((syntax for syntax in CALL_SYNTAXES if syntax.detect in source), None)


def thinking_syntax(source: str) -> ThinkingSyntax:
    """The thinking markers a template's family uses; `<think>` tags where it names none (a model under
    another template may still open them: they are only looked for at the start of a reply)."""
    return next((syntax for syntax in THINKING_SYNTAXES if (syntax.detect or syntax.close) in source), THINK)


def opens_thinking(prompt: str, syntax: ThinkingSyntax) -> bool:
    """Whether the prompt ends inside an open thinking block, so the reply starts as thinking."""
    return prompt.rstrip().endswith(syntax.open.rstrip())


class PromptError(ValueError):
    """A chat template that cannot be rendered; the message is user-facing."""


@dataclass(frozen=True, slots=True)
class PromptFormat:
    name: str
    source: str
    implicit_stops: tuple[str, ...] = ()
    thinking: ThinkingSyntax = THINK

    @property
    def thinking_switch(self) -> bool:
        """Whether the template takes `enable_thinking` (transformers' and llama.cpp's name for it)."""
        return "enable_thinking" in self.source

    @property
    def calls(self) -> CallSyntax | None:
        """How the model writes tool calls, where its own template takes tools."""
        return call_syntax(self.source) if self.name == MODEL else None

    def options(self, thinking: bool, tools: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
        """The template variables a request adds, as `apply_chat_template`'s keyword arguments: the thinking
        switch where the template takes one, the tools where there are some."""
        extra: dict[str, Any] = {"enable_thinking": thinking} if self.thinking_switch else {}
        if tools:
            extra["tools"] = list(tools)
        return extra or None

    @property
    def names_thinking(self) -> bool:
        """Whether the template itself knows its thinking markers (else `<think>` is only a guess)."""
        return (self.thinking.detect or self.thinking.close) in self.source

    def render(
        self,
        messages: list[Message],
        bos_token: str = "",
        eos_token: str = "",
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text. `extra` holds more template variables (`enable_thinking`), as the keyword arguments
        of transformers' `apply_chat_template` do. A model's template is untrusted code: whatever it raises,
        or a run past the render budget, is a PromptError naming the template."""
        try:
            return _bounded_render(_compile(self.source), _variables(messages, bos_token, eos_token, extra))
        except Exception as error:  # noqa: BLE001 - see the docstring
            raise PromptError(f"{self.description} failed: {_reason(error)}") from None

    @property
    def description(self) -> str:
        return "the model's chat template" if self.name == MODEL else f"chat template {self.name!r}"


def choose_format(choice: str, model_template: str | None) -> PromptFormat:
    """`choice` is "auto" (the model's own template, else the plain transcript) or a named template.
    A model's template is compiled here, so one that does not compile fails the load, not the first turn."""
    if choice == AUTO:
        if model_template:
            prompt_format = PromptFormat(MODEL, model_template, thinking=thinking_syntax(model_template))
            try:
                _compile(model_template)
            except Exception as error:  # noqa: BLE001 - untrusted source: Jinja's parser can raise more than TemplateError
                raise PromptError(f"{prompt_format.description} cannot be used: {_reason(error)}") from None
            return prompt_format
        choice = PLAIN
    if choice not in NAMED_TEMPLATES:
        known = ", ".join([AUTO, *NAMED_TEMPLATES])
        raise PromptError(f"unknown chat template {choice!r}: choose one of {known}")
    return PromptFormat(choice, NAMED_TEMPLATES[choice], _IMPLICIT_STOPS.get(choice, ()))


def _variables(
    messages: list[Message], bos_token: str, eos_token: str, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What transformers' `apply_chat_template` passes for a chat without tools, so templates branch as they
    do there: `tools` and `documents` are None (defined, so `tools is defined` holds and `tools is none` too),
    the special tokens, then its keyword arguments, which may replace them. A model without a BOS or EOS gets
    an empty string where transformers would leave the name undefined: `bos_token + '[INST]'` still renders."""
    return {
        "tools": None,
        "documents": None,
        "bos_token": bos_token,
        "eos_token": eos_token,
        **(extra or {}),
        "messages": [_message(m) for m in messages],
        "add_generation_prompt": True,
    }


def _message(message: Message) -> dict[str, Any]:
    """A message as a template reads it; a reply's thinking as `reasoning_content`, a step's calls as
    `tool_calls`, a result's call as `tool_call_id` (each only where there is one: templates test `is defined`)."""
    fields: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning:
        fields["reasoning_content"] = message.reasoning
    if message.tool_calls:
        fields["tool_calls"] = list(message.tool_calls)
    if message.tool_call_id:
        fields["tool_call_id"] = message.tool_call_id
    return fields


def _bounded_render(template: Template, variables: dict[str, Any]) -> str:
    """Rendering within the budget, the text checked piece by piece so a huge prompt stops as it grows."""
    with _Budget():
        parts = []
        size = 0
        for part in template.generate(variables):
            size += len(part)
            if size > MAX_PROMPT_CHARS:
                raise SecurityError(f"the prompt grew past {MAX_PROMPT_CHARS:,} characters")
            parts.append(part)
        return "".join(parts)


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> Template:
    """Compiling costs ~2 ms, more than rendering: once per template, not once per turn."""
    return _ENV.from_string(source)


def _reason(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text if isinstance(error, TemplateError) and text else f"{type(error).__name__}: {text}".rstrip(": ")


class _Budget:
    """The steps and time one render may take; the sandbox keeps templates from Python's internals,
    this keeps them from running forever (`{% for a in range(99999) %}{% for b in range(99999) %}`)."""

    _active = threading.local()

    def __enter__(self) -> None:
        self.steps = MAX_RENDER_STEPS
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        _Budget._active.budget = self

    def __exit__(self, *_exc: object) -> None:
        _Budget._active.budget = None

    @classmethod
    def spend(cls) -> None:
        budget = getattr(cls._active, "budget", None)
        if budget is None:
            return
        budget.steps -= 1
        if budget.steps < 0 or time.monotonic() > budget.deadline:
            raise SecurityError(f"it ran too long (over {MAX_RENDER_STEPS:,} steps or {MAX_RENDER_SECONDS:g} s)")


def _counted(iterable: Iterable[Any]) -> Iterator[Any]:
    """What every template loop iterates over (see _BoundedCodeGenerator)."""
    for item in iterable:
        _Budget.spend()
        yield item


class _BoundedCodeGenerator(CodeGenerator):
    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in list(node.find_all(nodes.For)):
            loop.iter = nodes.Call(nodes.ImportedName(f"{__name__}._counted"), [loop.iter], [], None, None,
                                   lineno=loop.lineno)
        super().visit_Template(node, frame)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Every loop turn and call spends from the render's budget; `*` and `**` cannot build huge values;
    reaching for an unsafe attribute (`__globals__`, `_TemplateReference__context`) fails at once
    instead of quietly rendering as nothing."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**"})

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's spelling
        _Budget.spend()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (_counted(args[0]), *args[1:])
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
        elif isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left).bit_length() * right > MAX_POWER_BITS:
                raise SecurityError(f"{left} ** {right} is too large")
        return super().call_binop(context, operator, left, right)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to {attribute!r} of a {type(obj).__name__} is not allowed")


def _check_repeat(sequence: Any, times: Any) -> None:
    if isinstance(sequence, (str, list, tuple)) and isinstance(times, int) and len(sequence) * times > MAX_REPEAT_ITEMS:
        raise SecurityError(f"repeating {len(sequence):,} items {times:,} times is too large")


class _GenerationTag(Extension):
    """transformers' `{% generation %}…{% endgeneration %}` marks an assistant reply for a training mask;
    in a prompt it is its body. Built as transformers builds it, a call block, so a `set` inside stays inside."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Macro) -> str:
        return caller()


class _TemplateDict:
    """transformers' `dict`: a call and `fromkeys`, without the type's other attributes, so
    `dict.update(messages[0], …)` cannot mutate what the immutable sandbox guards."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """transformers' `namespace`: storing an underscore name fails at once, as there (its guard against
    reaching Python's internals through one), not when the sandbox refuses to read it back."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's spelling: `namespace(self=1)` works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"a template cannot store {name!r} on a namespace")


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' filter: plain `json.dumps`, where Jinja's own escapes `<>&'` for HTML and sorts keys."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# transformers' environment (utils/chat_template_utils.py, `_cached_compile_jinja_template`, 5.23), bounded
_ENV = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
_ENV.filters["tojson"] = _tojson
_ENV.globals.update(
    raise_exception=_raise_exception,
    strftime_now=_strftime_now,
    dict=_TemplateDict(),
    namespace=_TemplateNamespace,
)
