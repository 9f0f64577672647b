"""Damaged and random model files: each one loads (and answers) or fails with one line; none takes
the process down or hangs it. llama.cpp aborted on some of these before check_gguf refused them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_corruption import KNOWN_CRASHES, corruptions, duplicate_token
from tui_chat.engine.base import EngineError
from tui_chat.engine.models import check_gguf

FILES = 40
LOADER = Path(__file__).with_name("load_models.py")


def _write(directory: Path, made: list[tuple[str, bytes]]) -> dict[str, str]:
    directory.mkdir()
    described = {}
    for index, (what, data) in enumerate(made):
        path = directory / f"damaged-{index:03d}.gguf"
        path.write_bytes(data)
        described[str(path)] = what
    return described


def _load_in_child(described: dict[str, str], log_dir: Path) -> dict[str, dict]:
    """Each file's final event, from a child process; fails naming the file that crashed or hung it."""
    try:
        child = subprocess.run([sys.executable, str(LOADER), str(log_dir), *described], capture_output=True,
                               text=True, timeout=180, check=False)
        output, crashed = child.stdout, child.returncode != 0
    except subprocess.TimeoutExpired as timeout:
        output, crashed = (timeout.stdout or b"").decode(), True
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    if crashed:
        last = lines[-1].get("start") if lines else None
        pytest.fail(f"loading {last} ({described.get(last)}) crashed or hung the process")
    return {line["path"]: line for line in lines if "path" in line}


def test_damaged_models_load_or_fail_in_one_line(tiny_model, tmp_path):
    made = corruptions(tiny_model, seed=2026, count=FILES - 1) + [("a token listed twice", duplicate_token(tiny_model))]
    described = _write(tmp_path / "models", made)
    results = _load_in_child(described, tmp_path / "logs")
    assert sorted(results) == sorted(described)
    for path, result in results.items():
        what = described[path]
        assert result["event"] in ("Done", "Error"), (what, result)
        if result["event"] == "Error":
            assert result["message"] and "\n" not in result["message"], (what, result)
    refused = [described[path] for path, result in results.items() if "is damaged" in result["message"]]
    for name, _fmt, value in KNOWN_CRASHES:
        assert f"{name} = {value}" in refused
    assert "a token listed twice" in refused


@pytest.mark.parametrize(("index", "reason"), [
    (0, "llama.block_count is 0 (a model has 1 to 512 layers)"),
    (2, "llama.attention.layer_norm_rms_epsilon is -1.0 (it must be a small positive number)"),
])
def test_check_gguf_names_the_value_that_would_crash_llama_cpp(tiny_model, tmp_path, index, reason):
    path = tmp_path / "bad.gguf"
    path.write_bytes(corruptions(tiny_model, seed=0, count=len(KNOWN_CRASHES))[index][1])
    with pytest.raises(EngineError, match=re.escape(f"bad.gguf is damaged: {reason}")):
        check_gguf(path)


def test_check_gguf_refuses_a_repeated_token_and_a_cut_file(tiny_model, tmp_path):
    path = tmp_path / "twice.gguf"
    path.write_bytes(duplicate_token(tiny_model))
    with pytest.raises(EngineError, match=r"twice.gguf is damaged: its vocabulary \(tokenizer.ggml.tokens\) lists"):
        check_gguf(path)
    path.write_bytes(tiny_model.read_bytes()[:5000])
    with pytest.raises(EngineError, match="tokenizer.ggml.tokens runs past the end of the file"):
        check_gguf(path)
    check_gguf(tiny_model)
