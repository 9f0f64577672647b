"""`tui-chat models ...` as scripts call it: real processes against the fake hub, real exit codes."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import run_cli
from fake_hub import FILE, REF, REPO


@pytest.fixture
def hub(fake_hub, tiny_model):
    fake_hub.add_repo(REPO, {FILE: tiny_model.read_bytes(), "tiny-Q8_0.gguf": tiny_model.read_bytes()[::-1]},
                      downloads=1234, likes=5)
    return fake_hub


def local_file(models: Path) -> Path:
    return models / "hub" / "tiny-org" / "tiny-GGUF" / FILE


def test_search_files_pull_run_list_and_rm(hub, models, tiny_model):
    found = run_cli("models", "search", "tiny")
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == ["REPO                DOWNLOADS  LIKES", f"{REPO}  1,234      5"]
    files = run_cli("models", "files", REPO)
    assert files.returncode == 0
    header, q4, q8 = files.stdout.splitlines()
    assert header.split() == ["FILE", "QUANT", "SIZE", "FITS"]
    assert q4.split()[:4] == [FILE, "Q4_K_M", "389.6", "KiB"] and "RAM ✓" in q4
    pulled = run_cli("models", "pull", REF)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout == f"{REF}\t{local_file(models)}\n"
    assert "[########################] 100% 389.6 KiB / 389.6 KiB" in pulled.stderr
    common = ("run", "-p", "Hello", "--temperature", "0", "--max-tokens", "8", "--n-ctx", "512")
    by_name = run_cli(*common, "-m", REF)
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == run_cli(*common, "-m", str(tiny_model)).stdout
    listed = run_cli("models", "list").stdout.splitlines()
    assert listed[1].split()[:4] == [REF, "Q4_K_M", "389.6", "KiB"] and "never" not in listed[1]
    removed = run_cli("models", "rm", REF)
    assert removed.returncode == 0 and removed.stdout == f"removed {REF} (389.6 KiB)\n"
    assert run_cli("models", "list", "--json").stdout.strip() == "[]"
    gone = run_cli("run", "-p", "hi", "-m", REF)
    assert gone.returncode == 2 and gone.stderr == (
        f"tui-chat: error: {REF} is not downloaded: get it with tui-chat models pull {REF}\n")


@pytest.mark.parametrize(("args", "status", "message"), [
    (["files", "no/such"], 2, "repository no/such: not found on the hub (404)"),
    (["pull", f"{REPO}:../../x.gguf"], 2, "'../../x.gguf' is not a usable file name"),
    (["pull", f"{REPO}:nope.gguf"], 2, f"{REPO} has no GGUF file 'nope.gguf'"),
    (["files", "not-a-repo"], 2, "'not-a-repo' is not a hub repository name"),
    (["rm", "nothing.gguf"], 2, "no local model named 'nothing.gguf'"),
    (["search", "x", "--limit", "0"], 2, "--limit must be between 1 and 1000"),
])
def test_bad_input_is_one_line_and_exit_2(hub, models, args, status, message):
    result = run_cli("models", *args)
    assert (result.returncode, result.stdout) == (status, "")
    assert result.stderr == f"tui-chat: error: {message}" + result.stderr.split(message, 1)[1]
    assert result.stderr.count("\n") == 1


def test_hub_faults_are_one_line_and_exit_1(hub, models, monkeypatch):
    hub.faults.status = 500
    failed = run_cli("models", "search", "tiny")
    assert failed.returncode == 1 and failed.stderr == "tui-chat: error: search: the hub answered with HTTP 500\n"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    unreachable = run_cli("models", "files", REPO)
    assert unreachable.returncode == 1 and "cannot reach the hub at http://127.0.0.1:9" in unreachable.stderr


def test_private_repo_with_the_token_hf_auth_login_saved(hub, models, tmp_path, monkeypatch):
    hub.repos[REPO].private = True
    refused = run_cli("models", "pull", REF)
    assert refused.returncode == 2 and "(401): set HF_TOKEN or run hf auth login" in refused.stderr
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text("hf_test_token")
    monkeypatch.setenv("HF_HOME", str(home))
    pulled = run_cli("models", "pull", REF)
    assert pulled.returncode == 0, pulled.stderr
    assert local_file(models).read_bytes() == hub.repos[REPO].files[FILE].data


def test_a_download_killed_midway_resumes_in_the_next_process(hub, models):
    hub.faults.stall_after[FILE] = 150_000
    process = subprocess.Popen([sys.executable, "-m", "tui_chat", "models", "pull", REF],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    part = local_file(models).with_name(FILE + ".part")
    deadline = time.monotonic() + 30
    while not (part.exists() and part.stat().st_size == 150_000):
        assert time.monotonic() < deadline and process.poll() is None, "the download did not start"
        time.sleep(0.02)
    process.kill()
    process.wait()
    del hub.faults.stall_after[FILE]
    hub.faults.release.set()
    resumed = run_cli("models", "pull", REF)
    assert resumed.returncode == 0, resumed.stderr
    assert local_file(models).read_bytes() == hub.repos[REPO].files[FILE].data
    assert hub.requests("/cdn/")[-1].headers["Range"] == "bytes=150000-"


def _small_file_limit() -> None:
    """A disk that fills after 100 kB: writes past it fail with EFBIG as they would with ENOSPC."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


def test_a_full_disk_stops_cleanly_and_the_download_resumes_later(hub, models):
    full = run_cli("models", "pull", REF, preexec_fn=_small_file_limit)
    assert full.returncode == 1
    assert full.stderr.splitlines()[-1] == (
        f"tui-chat: error: the disk is full ({local_file(models).parent}): {FILE} stopped; what arrived is kept — "
        "free some space and pull again to resume")
    assert not local_file(models).exists()
    assert local_file(models).with_name(FILE + ".part").stat().st_size == 100_000
    resumed = run_cli("models", "pull", REF)
    assert resumed.returncode == 0, resumed.stderr
    assert hub.requests("/cdn/")[-1].headers["Range"] == "bytes=100000-"
    assert local_file(models).read_bytes() == hub.repos[REPO].files[FILE].data


OFFLINE_START = textwrap.dedent("""
    import asyncio
    import sys

    connects = []
    sys.addaudithook(lambda event, args: connects.append(args) if event == "socket.connect" else None)

    from dataclasses import replace

    from tui_chat.cli import main
    from tui_chat.commands.common import opener_for
    from tui_chat.config import load_config
    from tui_chat.ui.app import ChatApp

    assert main(["models", "list"]) == 0
    assert main(["run", "-m", sys.argv[1], "-p", "Hello", "--max-tokens", "4", "--n-ctx", "512"]) == 0


    async def start_the_app():
        config = load_config()
        app = ChatApp(config, opener_for(replace(config, n_ctx=512))[0], sys.argv[1])
        async with app.run_test() as pilot:
            for _ in range(1000):
                if app.screen.workspace.backend is not None:
                    break
                await pilot.pause(0.02)
            await pilot.press("f5")
            await pilot.pause()
            print("loaded", app.screen.local[sys.argv[1]].path.name)


    asyncio.run(start_the_app())
    print("connects", connects, "hub imported", "huggingface_hub" in sys.modules)
""")


def test_offline_start_lists_and_loads_local_models_without_a_socket(hub, models):
    assert run_cli("models", "pull", REF).returncode == 0
    script = subprocess.run([sys.executable, "-c", OFFLINE_START, REF], capture_output=True, text=True, timeout=120)
    assert script.returncode == 0, script.stderr
    assert script.stdout.splitlines()[1].split()[:4] == [REF, "Q4_K_M", "389.6", "KiB"]
    assert script.stdout.splitlines()[-2:] == [f"loaded {FILE}", "connects [] hub imported False"]


def test_models_list_marks_the_starter_as_the_default_when_none_is_configured(starter_model):
    listing = run_cli("models", "list")
    assert listing.returncode == 0, listing.stderr
    [line] = [line for line in listing.stdout.splitlines() if starter_model.stem in line]
    assert line.split()[0] == f"{starter_model.name}" and line.split()[1] == "*" and "Q4_K_M" in line
