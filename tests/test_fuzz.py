"""Property tests (hypothesis) for every parser of untrusted or hand-written input: each either gives its
result or raises its own one-line error, never another exception. Derandomized, so CI runs the same cases."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from tui_chat.cli import main
from tui_chat.config import Config, ConfigError, load_config
from tui_chat.engine.base import EngineError
from tui_chat.engine.models import check_gguf
from tui_chat.engine.openai.sse import SseDecoder
from tui_chat.engine.openai.wire import Chunk, MalformedEvent, parse_chunk
from tui_chat.engine.params import SPECS, InvalidParameter, SamplingParams
from tui_chat.hub import HubError
from tui_chat.hub.local import hub_path, resolve_local
from tui_chat.hub.names import parse_ref

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
scalars = st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | text
toml_values = st.recursive(scalars,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                           max_leaves=8)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | text,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                           max_leaves=10)


def _one_line(message: str) -> bool:
    return bool(message) and "\n" not in message and "Traceback" not in message


# --- config ------------------------------------------------------------------------------------


def _toml(value) -> str:
    """A value written as TOML (inline tables and arrays), so any generated document goes through the real
    file reader."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return "{" + ", ".join(f"{_toml(key)} = {_toml(item)}" for key, item in value.items()) + "}"


_SETTINGS = {  # each with values it may take, and any value at all
    "default_model": text, "chat_template": st.sampled_from(["auto", "plain", "chatml", "alpaca"]),
    "n_ctx": st.integers(0, 2**21), "gpu_layers": st.integers(-3, 99), "theme": text, "price": text,
    "inspector_top": st.integers(-1, 30), "system_prompt": text,
    "prices": st.dictionaries(text, st.dictionaries(st.sampled_from(["input", "output"]) | text, scalars, max_size=3),
                              max_size=2),
}
sampling_tables = st.dictionaries(st.sampled_from([*SPECS, "stop"]) | text, toml_values, max_size=4)
remote_tables = st.dictionaries(text, st.dictionaries(
    st.sampled_from(["base_url", "model", "api_key_env", "api_key", "timeout_s"]) | text,
    st.sampled_from(["http://127.0.0.1:8080/v1", "https://x"]) | toml_values, max_size=4), max_size=2)
config_documents = st.fixed_dictionaries({}, optional={
    **{name: valid | toml_values for name, valid in _SETTINGS.items()}, "sampling": sampling_tables | toml_values,
    "remotes": remote_tables | toml_values, "keys": st.dictionaries(text, text | toml_values, max_size=3),
}) | st.dictionaries(text, toml_values, max_size=3)


def _load(path: Path, content: str) -> Config | None:
    path.write_text(content, encoding="utf-8")
    try:
        return load_config(path)
    except ConfigError as error:
        assert str(error).startswith(("config ", "cannot read config ")), str(error)
        return None


@FUZZ
@given(config_documents)
def test_config_from_any_toml_document_loads_or_is_a_config_error(tmp_path, document):
    content = "".join(f"{_toml(key)} = {_toml(value)}\n" for key, value in document.items())
    config = _load(tmp_path / "config.toml", content)
    assert config is None or isinstance(config, Config)


@FUZZ
@given(st.text(max_size=200) | st.sampled_from(["[sampling]\ntemperature = 9", "[remotes.x]\nbase_url = 1", "n_ctx ="]))
def test_config_from_any_text_loads_or_is_a_config_error(tmp_path, content):
    _load(tmp_path / "config.toml", content)


# --- sampling parameters -------------------------------------------------------------------------


@FUZZ
@given(st.dictionaries(st.sampled_from([*SPECS, "stop"]) | text, json_values | st.decimals() | st.fractions(),
                       max_size=4))
def test_sampling_changes_are_applied_within_range_or_refused(changes):
    try:
        params = SamplingParams().with_changes(**changes)
    except InvalidParameter as error:
        assert _one_line(str(error))
        return
    for name, spec in SPECS.items():
        value = getattr(params, name)
        assert type(value) is spec.kind and spec.minimum <= value <= spec.maximum
    assert all(isinstance(stop, str) and stop for stop in params.stop)


# --- command line ------------------------------------------------------------------------------

_OPTIONS = ["--help", "-p", "--prompt", "--system", "--temperature", "--top-k", "--seed", "--max-tokens", "--stop",
            "--top-logprobs", "--json", "--save", "--continue", "clear", "--n-ctx", "--gpu-layers", "--backend",
            "--base-url", "--api-key-env", "--remote", "--text", "--file", "--input-tokens", "--output-tokens",
            "--output-words", "--calls", "--price", "--search", "--format", "--output", "--sort", "--limit",
            "local", "openai", "md", "json", "-1", "0", "1e309", "nan", "http://127.0.0.1:9/v1", "\x00", "a\nb", "../x",
            "1" * 30]
_COMMANDS = [["run"], ["estimate"], ["history"], ["export"], ["import"], ["models"], ["models", "list"],
             ["models", "rm"], ["models", "files"], ["models", "pull"], ["models", "search"], ["cache"]]


@FUZZ
@given(st.sampled_from(_COMMANDS), st.lists(st.sampled_from(_OPTIONS) | text, max_size=6))
def test_any_command_line_exits_0_1_or_2_with_at_most_one_error_line(tmp_path, capsys, command, tokens):
    argv = [*command, *tokens]
    if command[0] in ("run", "estimate"):
        argv += ["-m", str(tmp_path / "missing.gguf")]  # never loads a model: the fuzzed part is parsing
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code:
        assert err.count("\n") == 1 and err.endswith("\n"), (argv, err)


# --- server-sent events and chunks -----------------------------------------------------------------

sse_lines = st.lists(st.text(max_size=20).map(lambda line: line.replace("\n", "").replace("\r", ""))
                     | st.sampled_from(["", ":", ": ping", "data", "data:", "data: [DONE]", "event: x", "id: 1"]),
                     max_size=20)


@FUZZ
@given(sse_lines)
def test_sse_decoder_takes_any_lines(lines):
    decoder = SseDecoder()
    events = [decoder.feed(line) for line in lines] + [decoder.flush()]
    assert all(event is None or isinstance(event, str) for event in events)
    assert decoder.flush() is None


@FUZZ
@given(st.lists(st.lists(st.text(max_size=12).map(lambda data: data.replace("\n", "").replace("\r", "")),
                         min_size=1, max_size=3), max_size=5),
       st.lists(st.sampled_from([": keep-alive", "event: message", "id: 7", "retry: 10"]), max_size=3))
def test_sse_decoder_gives_back_each_event_whatever_lies_between(events, noise):
    lines = []
    for data_lines in events:
        lines += noise + [f"data: {data}" for data in data_lines] + [""]
    decoder = SseDecoder()
    decoded = [event for event in (decoder.feed(line) for line in lines) if event is not None]
    assert decoded == ["\n".join(data_lines) for data_lines in events]


chunk_like = st.fixed_dictionaries({}, optional={
    "choices": st.lists(st.fixed_dictionaries({}, optional={
        "delta": st.fixed_dictionaries({}, optional={"content": json_values}) | json_values,
        "finish_reason": json_values,
        "logprobs": st.fixed_dictionaries({"content": st.lists(st.fixed_dictionaries({}, optional={
            "token": json_values, "logprob": json_values | st.integers(),
            "top_logprobs": st.lists(st.fixed_dictionaries({"token": json_values, "logprob": json_values}), max_size=2)
            | json_values}), max_size=2) | json_values}) | json_values,
    }) | json_values, max_size=2) | json_values,
    "usage": json_values, "timings": st.dictionaries(text, json_values | st.integers()) | json_values,
    "error": json_values,
})


@FUZZ
@given(chunk_like.map(json.dumps) | json_values.map(json.dumps) | st.text(max_size=50)
       | st.sampled_from(["1" * 5000, "[" * 5000, '{"choices": [{"logprobs": {"content": [{"logprob": -1' + "0" * 400
                                                   + "}]}}]}"]))
def test_parse_chunk_gives_a_chunk_or_a_malformed_event(data):
    try:
        chunk = parse_chunk(data)
    except MalformedEvent as error:
        assert _one_line(str(error))
        return
    assert isinstance(chunk, Chunk) and isinstance(chunk.content, str)
    assert all(0.0 <= token.prob <= 1.0 for token in chunk.tokens)


# --- model files and hub names ---------------------------------------------------------------------

gguf_like = st.builds(lambda version, tensors, entries, rest: b"GGUF" + struct.pack("<IQQ", version, tensors, entries)
                      + rest, st.sampled_from([2, 3]) | st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
                      | st.integers(0, 5), st.integers(0, 2**64 - 1) | st.integers(0, 5), st.binary(max_size=200))


@FUZZ
@given(st.binary(max_size=64) | gguf_like)
def test_check_gguf_accepts_or_refuses_any_bytes_in_one_line(tmp_path, data):
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    try:
        check_gguf(path)
    except EngineError as error:
        assert _one_line(str(error))


path_parts = st.sampled_from(["..", ".", "", "a", "x.gguf", "%2e%2e", "..\\..", "\x00", "/", "~", "C:"]) | text
names = st.lists(path_parts, min_size=1, max_size=4).map("/".join)


@FUZZ
@given(names, names, names)
def test_a_hub_name_never_leads_outside_the_models_dir(tmp_path, owner, repo, file):
    models = tmp_path / "models"
    name = f"{owner}/{repo}:{file}"
    try:
        ref = parse_ref(name)
        found = resolve_local(name, models)
    except HubError as error:
        assert _one_line(str(error))
        return
    if ref is not None:
        target = os.path.normpath(hub_path(models, ref))
        assert target.startswith(str(models / "hub") + os.sep), (name, target)
    assert found is None or os.path.normpath(found).startswith(str(models) + os.sep)
