"""`tui-chat run` as a script would call it: a real process, real exit codes, real stdout/stderr."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import run_cli as run


def test_json_report_for_a_two_turn_conversation(tiny_model):
    result = run("run", "--model", str(tiny_model), "-p", "Hello there", "-p", "And then?",
                 "--temperature", "0", "--max-tokens", "12", "--n-ctx", "512", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert report["model"] == "tiny" and report["backend"] == "llama"
    first, second = report["turns"]
    assert first["prompt"] == "Hello there" and first["text"]
    for turn in report["turns"]:
        assert turn["stop_reason"] == "length" and turn["completion_tokens"] == 12
        assert turn["n_ctx"] == 512
        assert turn["ttft_s"] > 0 and turn["decode_tok_s"] > 0 and turn["prefill_tok_s"] > 0
    assert first["cached_tokens"] == 0
    assert second["cached_tokens"] >= first["prompt_tokens"]
    assert second["context_tokens"] > first["context_tokens"]


def test_streamed_text_matches_the_json_text(tiny_model):
    common = ("run", "--model", str(tiny_model), "-p", "Hello there", "--temperature", "0", "--max-tokens", "20")
    streamed = run(*common)
    reported = json.loads(run(*common, "--json").stdout)
    assert streamed.returncode == 0
    assert streamed.stdout == reported["turns"][0]["text"].strip() + "\n"


def test_stop_sequence_from_the_command_line(tiny_model):
    common = ("run", "-m", str(tiny_model), "-p", "Hello", "--temperature", "0", "--max-tokens", "40", "--json")
    full = json.loads(run(*common).stdout)
    word = full["turns"][0]["text"].split()[2]
    cut = json.loads(run(*common, "--stop", word).stdout)
    assert cut["turns"][0]["stop_reason"] == "stop"
    assert word not in cut["turns"][0]["text"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "temperature must be between 0 and 2 (got -1)"),
        (["--top-p", "2"], "top_p must be between 0 and 1 (got 2)"),
        (["--top-k", "many"], "argument --top-k: invalid int value: 'many'"),
        (["--model", "/no/such/model.gguf"], "model file not found: /no/such/model.gguf"),
        (["--model", "llama-9000"], "unknown model 'llama-9000'"),
        (["--n-ctx", "10"], "n_ctx must be a whole number between 256"),
        (["--gpu-layers", "-3"], "gpu-layers must be -1 (all), 0 (CPU) or a layer count"),
        (["-p", ""], "--prompt must not be empty"),
        (["-p", " \n "], "--prompt must not be empty"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = run("run", "-p", "hi", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_not_gguf_and_truncated_files(tmp_path, tiny_model):
    text = tmp_path / "notes.txt"
    text.write_text("just words")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny_model.read_bytes()[:100_000])
    for path, message in [(text, "is not a GGUF model file"), (truncated, "cannot load cut.gguf: ")]:
        result = run("run", "-p", "hi", "--model", str(path))
        assert result.returncode == 2
        assert message in result.stderr and result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr


def test_broken_config_is_reported_not_raised(isolated_dirs):
    config = isolated_dirs / "config" / "tui-chat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("n_ctx = 'lots'")
    result = run("run", "-p", "hi")
    assert result.returncode == 2
    assert f"config {config}: n_ctx must be a whole number" in result.stderr


@pytest.mark.starter
def test_starter_answers_by_default():
    result = run("run", "-p", "What is the capital of France?", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "The capital of France is Paris.\n"


TINY_RUN = ("run", "-p", "Hello there", "--temperature", "0", "--n-ctx", "512")


def test_logit_bias_and_sampler_order_flags_reach_the_chain(tiny_model):
    common = (*TINY_RUN, "-m", str(tiny_model), "--max-tokens", "24", "--json")
    first = json.loads(run(*common, "--top-logprobs", "1").stdout)["turns"][0]["tokens"]
    counts = {}
    for token in first:
        counts[token["id"]] = counts.get(token["id"], 0) + 1
    banned = max(counts, key=counts.get)
    piece = next(t["token"] for t in first if t["id"] == banned)
    result = run(*common, "--logit-bias", f"{piece}=-inf", "--logit-bias", "zzz=2", "--xray",
                 "--sampler-order", "temperature,min_p", "--min-p", "0.05", "--temperature", "1.5", "--seed", "3")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["params"]["sampler_order"] == ["temperature", "min_p"]
    assert report["params"]["logit_bias"] == [[piece, float("-inf")], ["zzz", 2.0]]
    tokens = report["turns"][0]["tokens"]
    assert banned not in [t["id"] for t in tokens]
    assert [s["name"] for s in tokens[0]["stages"]] == ["logit_bias", "temperature", "min_p"]
    assert all({"name", "kept", "mass", "rank", "prob"} <= set(s) for t in tokens for s in t["stages"])


def test_output_format_flags(tiny_model, tmp_path):
    common = (*TINY_RUN, "-m", str(tiny_model), "--json")
    schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], ' \
             '"additionalProperties": false}'
    report = json.loads(run(*common, "--max-tokens", "100", "--json-schema", schema).stdout)["turns"][0]
    assert report["format"] == "json_schema" and report["incomplete"] is False
    assert isinstance(json.loads(report["text"])["ok"], bool)
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    report = json.loads(run(*common, "--grammar", str(grammar), "--top-logprobs", "3").stdout)["turns"][0]
    assert report["text"] in ("yes", "no") and report["tokens"][0]["grammar"]["removed"] > 0
    assert all("allowed" in c for c in report["tokens"][0]["top"])
    endless = run(*TINY_RUN, "-m", str(tiny_model), "--max-tokens", "5", "--grammar", 'root ::= "a"{30}')
    assert endless.returncode == 0 and endless.stdout == "aaaaa\n"
    assert "before its grammar was complete: the output is incomplete" in endless.stderr


def test_no_stream_holds_the_reply_and_compares_the_wait(tiny_model):
    result = run(*TINY_RUN, "-m", str(tiny_model), "--max-tokens", "20", "--no-stream")
    streamed = run(*TINY_RUN, "-m", str(tiny_model), "--max-tokens", "20")
    assert result.returncode == 0 and result.stdout == streamed.stdout
    [line] = result.stderr.splitlines()
    assert line.startswith("tui-chat: first word after ") and " s when streaming; you waited " in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--logit-bias", "Paris"], "logit bias must be TEXT=BIAS, e.g. Paris=-inf (got 'Paris')"),
        (["--logit-bias", "Paris=lots"], "the logit bias of 'Paris' must be between -100 and 100, or -inf"),
        (["--sampler-order", "top_k,fast"], "sampler_order takes names from penalties, dry"),
        (["--xray"], "--xray needs --json"),
        (["--json-schema", "{not json"], "the JSON schema is not valid JSON"),
        (["--json-schema", '{"type": "strin"}'], "the JSON schema is not valid at #/type: 'strin' is not valid under"),
        (["--json-schema", '{"items": {"$ref": "#/$defs/x"}}'], "$[*]: \"$ref\" '#/$defs/x' points to nothing"),
        (["--grammar", "/no/such.gbnf"], "cannot read the grammar file /no/such.gbnf"),
        (["--format", "json", "--grammar", "x.gbnf"], "argument --grammar: not allowed with argument --format"),
    ],
)
def test_bad_sampling_and_format_flags_are_one_line_and_exit_2(args, message):
    result = run("run", "-p", "hi", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flag", "given", "message"),
    [
        ("--grammar", 'root ::= "yes" | foo', "the grammar does not parse: Rule 'foo' not found"),
        ("--grammar", 'answer ::= "yes"', "the grammar does not parse: No 'root' rule found"),
        ("--json-schema", '{"pattern": "(?<=a)b"}', "the JSON schema cannot be enforced: $: pattern '(?<=a)b': "),
        ("--json-schema", '{"$ref": "#"}', "the output format allows no text at all: does a rule or a $ref only"),
    ],
)
def test_a_grammar_that_does_not_parse_is_the_users_input_one_line_and_exit_2(tiny_model, flag, given, message):
    result = run("run", "-m", str(tiny_model), "-p", "hi", flag, given)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(f"tui-chat: error: {message}") and result.stderr.count("\n") == 1


def test_xray_on_a_server_is_refused_in_one_line():
    from fake_openai import fake_server

    with fake_server() as server:
        result = run("run", "--base-url", server.base_url, "-p", "hi", "--xray", "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "tui-chat: error: --xray needs a local model: a server does not show its sampler chain's stages\n")


def test_output_into_a_pipe_whose_reader_stopped_ends_quietly(tiny_model):
    """`tui-chat … | head`: head is gone before the command writes. Every command ends without a word,
    with the status of a program ended by SIGPIPE."""
    commands = [("info", "--json"), ("info",), ("--version",), ("estimate", "--output-tokens", "5"),
                ("run", "-m", str(tiny_model), "-p", "Hello", "--max-tokens", "4")]
    for args in commands:
        reader, writer = os.pipe()
        os.close(reader)
        try:
            result = subprocess.run([sys.executable, "-m", "tui_chat", *args], stdout=writer, stderr=subprocess.PIPE,
                                    text=True, timeout=120, check=False)
        finally:
            os.close(writer)
        assert (result.returncode, result.stderr) == (128 + signal.SIGPIPE, ""), args
