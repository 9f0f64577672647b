"""`tui-chat info` and `--version`: what a bug report needs, from the real build."""

from __future__ import annotations

import json
import os
import platform

import llama_cpp

from conftest import run_cli
from tui_chat.config import config_path, history_path, log_dir
from tui_chat.engine.local.cpu import read_topology


def test_version_names_tui_chat_llama_cpp_python_textual_and_python():
    done = run_cli("--version")
    assert done.returncode == 0 and done.stderr == ""
    line = done.stdout.strip()
    assert line.startswith("tui-chat 0.") and f"llama-cpp-python {llama_cpp.__version__}" in line
    assert f"python {platform.python_version()}" in line and "textual 8." in line


def test_info_as_json_has_versions_cpu_gpu_and_every_path():
    done = run_cli("info", "--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["versions"]["llama-cpp-python"] == llama_cpp.__version__
    cpu = facts["cpu"]
    assert cpu["logical"] == len(os.sched_getaffinity(0)) and cpu["cores"] == read_topology().physical
    assert cpu["build_features"].startswith("CPU :") and cpu["threads"]["decode"] >= 1
    assert cpu["extra_buffers"].startswith(("all", "no-amx", "none", "not tested"))
    assert facts["gpu"]["offload"] == bool(llama_cpp.llama_supports_gpu_offload())
    assert facts["paths"]["config"] == str(config_path()) and facts["paths"]["history"] == str(history_path())
    assert facts["paths"]["log"] == str(log_dir() / "llama.log")


def test_info_as_text_shows_the_threads_set_in_the_config():
    config_path().parent.mkdir(parents=True)
    config_path().write_text('threads = 3\nthreads_batch = 5\nextra_buffers = "none"\n')
    done = run_cli("info")
    assert done.returncode == 0, done.stderr
    assert "threads     3 decoding, 5 reading prompts (set)" in done.stdout
    assert "CPU path    none (set in the config or by a flag)" in done.stdout
    assert f"history     {history_path()}" in done.stdout


def test_bad_thread_and_cpu_path_settings_are_one_line_errors():
    assert run_cli("run", "-p", "x", "--threads", "0").stderr.strip() == (
        "tui-chat: error: --threads must be a whole number between 1 and 1024 (got 0)")
    config_path().parent.mkdir(parents=True)
    config_path().write_text('extra_buffers = "amx"\n')
    error = run_cli("info").stderr.strip()
    assert error.startswith("tui-chat: error: config ")
    assert "extra_buffers must be one of auto, all, no-amx, none" in error
