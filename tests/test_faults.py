"""Faults a user meets, each on real parts: a model too big for memory, a disk that fills up under the
history, a data dir that cannot be created, a config edited by hand, a terminal shrunk mid-reply.
docs/faults.md lists every fault with what the user sees, what is kept and the test that proves it."""

from __future__ import annotations

import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ask, open_backend, run_cli
from test_ui import loaded, make_app, reply_done, said, send, wait_for
from tui_chat.config import history_path, log_dir
from tui_chat.engine.params import SamplingParams
from tui_chat.ui.widgets.prompt import PromptInput

TESTS = Path(__file__).parent
MB = 2**20


# --- a model too big for memory ----------------------------------------------------------------------


def peak_address_space(*args: str, env: dict[str, str] | None = None) -> int:
    """Bytes of address space `tui-chat ARGS` reached, read from its own /proc status as it ends."""
    script = "import sys; from tui_chat.cli import main; main(sys.argv[1:]); print(open('/proc/self/status').read())"
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                            check=True, env=env)
    line = next(line for line in result.stdout.splitlines() if line.startswith("VmPeak:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak address space from /proc")
def test_a_model_too_big_for_memory_is_one_line_and_exit_2(tiny_model):
    """The process gets 150 MB more address space than a small context needs: that context still fits, a
    1M-token one (about 800 MB of KV cache and buffers) does not, and the user is told so in one line."""
    small = ("run", "-m", str(tiny_model), "-p", "Hello", "--max-tokens", "4", "--n-ctx", "512")
    limit = peak_address_space(*small) + 150 * MB

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    fits = run_cli(*small, preexec_fn=cap_memory)
    too_big = run_cli("run", "-m", str(tiny_model), "-p", "Hello", "--n-ctx", "1048576", preexec_fn=cap_memory)
    assert fits.returncode == 0 and fits.stdout.strip(), fits.stderr
    assert too_big.returncode == 2 and too_big.stdout == ""
    assert too_big.stderr.startswith(
        "tui-chat: error: cannot create a 1048576-token context for tiny.gguf: not enough memory (llama.cpp could "
        "not allocate ")
    assert too_big.stderr.endswith("); a smaller context (--n-ctx, n_ctx) needs less\n")
    assert too_big.stderr.count("\n") == 1


# One malloc arena and two threads: the peak a small run reaches is then close to what a load starts from,
# on any number of cores (each thread's arena reserves 64 MB of address space).
STEADY = {**os.environ, "MALLOC_ARENA_MAX": "1"}
TWO_THREADS = ("--threads", "2", "--threads-batch", "2")


@pytest.mark.starter
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak address space from /proc")
def test_weights_that_do_not_fit_in_memory_are_one_line(tiny_model, starter_model):
    """Room for the tiny model but not for the starter's 241 MB of weights: they cannot be mapped."""
    small = ("run", "-m", str(tiny_model), "-p", "Hello", "--max-tokens", "4", "--n-ctx", "512", *TWO_THREADS)
    limit = peak_address_space(*small, env=STEADY) + 32 * MB

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    result = run_cli("run", "-m", str(starter_model), "-p", "Hello", "--n-ctx", "512", *TWO_THREADS,
                     preexec_fn=cap_memory, env=STEADY)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"tui-chat: error: cannot load {starter_model.name}: not enough memory (")
    assert result.stderr.count("\n") == 1


LOAD_UNDER_A_LIMIT = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    from tui_chat.cli import main
    import tui_chat.engine.local.llamacpp

    model = Path(sys.argv[1])
    in_use = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    limit = in_use + model.stat().st_size + 32 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.exit(main(["run", "-m", str(model), "-p", "Hello", "--n-ctx", "512"]))
""")


@pytest.mark.starter
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the address space in use from /proc")
def test_room_to_map_the_weights_but_not_to_load_them_is_refused_before_llama_cpp_aborts(starter_model):
    """Room for the mapped file and 32 MB more: llama.cpp would map it and then abort on a small allocation
    (GGML_ASSERT); the load is refused first, naming the limit and what a load needs."""
    result = subprocess.run([sys.executable, "-c", LOAD_UNDER_A_LIMIT, str(starter_model)], capture_output=True,
                            text=True, timeout=120, check=False, env=STEADY)
    assert result.returncode == 2 and result.stdout == ""
    assert re.fullmatch(rf"tui-chat: error: cannot load {re.escape(starter_model.name)}: not enough memory \(the "
                        r"address-space limit, ulimit -v, leaves \d+ MB; loading needs about 305 MB\)\n",
                        result.stderr), result.stderr


# --- the disk fills up under the history -------------------------------------------------------------

CHAT_ON_A_FILLING_DISK = textwrap.dedent("""
    import asyncio
    import json
    import resource
    import signal
    import sys
    from pathlib import Path

    from test_ui import loaded, make_app, reply_done, send
    from tui_chat.config import history_path


    def fill_the_disk():
        \"\"\"From now on no file of this process may grow: writes past a file's end fail (EFBIG) as on a
        full disk.\"\"\"
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        size = Path(f"{history_path()}-wal").stat().st_size
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


    async def chat(model, turns, full_after):
        app = make_app(model)
        show = app.notify

        def notify(message, **options):  # each notification as it is raised, before it can time out
            print(json.dumps(["note", options.get("severity", "information"), str(message)]), flush=True)
            show(message, **options)

        app.notify = notify
        async with app.run_test(size=(100, 32)) as pilot:
            screen = await loaded(pilot)
            for turn in range(turns):
                if turn == full_after:
                    fill_the_disk()
                await send(pilot, f"Question {turn}: tell me about the world")
                reply = await reply_done(pilot)
                saving = "saving" if screen.session.saved else "not saving"
                print(json.dumps(["turn", turn, saving, reply.text]), flush=True)

    asyncio.run(chat(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
""")


def test_a_full_disk_turns_saving_off_once_and_the_chat_goes_on(tiny_model):
    """The disk fills up after two turns: the history's next write fails, and so does llama.cpp's log."""
    log = log_dir() / "llama.log"
    log.parent.mkdir(parents=True)
    log.write_text("earlier lines\n" * 100_000)  # longer than the history's write-ahead log will be
    turns, saved_turns = 5, 2
    process = subprocess.run(
        [sys.executable, "-c", CHAT_ON_A_FILLING_DISK, str(tiny_model), str(turns), str(saved_turns)],
        capture_output=True, text=True, timeout=300, cwd=TESTS,
    )
    assert process.returncode == 0, process.stderr
    assert "Traceback" not in process.stderr and "Exception ignored" not in process.stderr
    rows = [json.loads(line) for line in process.stdout.splitlines()]
    replies = [row for row in rows if row[0] == "turn"]
    assert [row[2] for row in replies] == ["saving"] * saved_turns + ["not saving"] * (turns - saved_turns)
    assert all(row[3] for row in replies), "every turn got its reply"
    [(_, severity, message)] = [row for row in rows if row[0] == "note" and "not saved" in row[2]]
    assert severity == "error"
    assert message == f"the history {history_path()} failed: disk I/O error: the rest of this chat is not saved"
    with sqlite3.connect(history_path()) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = db.execute("SELECT role, content, state FROM messages ORDER BY id").fetchall()
    assert stored == [(role, text, "complete") for row in replies[:saved_turns] for role, text in
                      (("user", f"Question {row[1]}: tell me about the world"), ("assistant", row[3]))]


# --- the data dir cannot be created -------------------------------------------------------------------


@pytest.fixture(params=["a file in the way", "read-only"])
def unusable_data_dir(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_DATA_HOME where tui-chat cannot make its folder: a plain file, or a read-only directory."""
    if request.param == "a file in the way":
        place = tmp_path / "data"
        place.write_text("a file where the data dir should be")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory; 'a file in the way' fails the same mkdir")
        place = tmp_path / "read-only"
        place.mkdir(mode=0o500)
    monkeypatch.setenv("XDG_DATA_HOME", str(place))
    return place


async def test_without_a_data_dir_the_app_chats_unsaved_and_says_so(tiny_model, unusable_data_dir):
    app = make_app(str(tiny_model))
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        assert reply.text and screen.session.saved is None
        await pilot.press("ctrl+l")
        await pilot.pause()
        notes = [(note.severity, str(note.message)) for note in app._notifications]
    [(severity, message)] = [note for note in notes if note[1].startswith("cannot open the history")]
    assert severity == "warning" and message.endswith(": this session is not saved")
    assert str(history_path()) in message and "\n" not in message
    assert ("warning", "The history could not be opened: chats are not saved this session.") in notes


def test_without_a_data_dir_run_answers_and_history_commands_fail_in_one_line(tiny_model, unusable_data_dir):
    answered = run_cli("run", "-m", str(tiny_model), "-p", "Hello", "--max-tokens", "8")
    assert answered.returncode == 0 and answered.stdout.strip() and answered.stderr == ""
    for args in (("run", "--save", "-m", str(tiny_model), "-p", "Hello"), ("history",), ("export", "1")):
        failed = run_cli(*args)
        assert failed.returncode == 2 and failed.stdout == ""
        assert failed.stderr.startswith(f"tui-chat: error: cannot open the history {history_path()}: ")
        assert failed.stderr.count("\n") == 1
    no_starter = run_cli("run", "-p", "Hello")
    assert no_starter.returncode == 2 and no_starter.stderr.count("\n") == 1
    assert no_starter.stderr.startswith(f"tui-chat: error: cannot unpack the starter model into {unusable_data_dir}")


READ_ONLY_APP = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from test_ui import loaded, make_app, reply_done, send

async def chat():
    app = make_app("tiny.gguf")
    async with app.run_test(size=(100, 32)) as pilot:
        await loaded(pilot)
        await send(pilot, "Hello there")
        reply = await reply_done(pilot)
        notes = [str(note.message) for note in app._notifications]
    print(json.dumps({"reply": reply.text, "notes": notes}))

asyncio.run(chat())
"""


def read_only(folder: Path, *command: str) -> subprocess.CompletedProcess:
    """`command` with `folder` mounted read-only, as a read-only disk is (EROFS, which root meets too), in a
    mount namespace of its own; skips where this machine allows none."""
    mounted = (f'mount --bind "{folder}" "{folder}" && mount -o remount,ro,bind "{folder}" "{folder}" && '
               f'touch "{folder}/probe" 2>/dev/null && exit 99; exec "$@"')
    for unshare in (["unshare", "--map-root-user", "--mount"], ["unshare", "--mount"]):
        try:
            result = subprocess.run([*unshare, "sh", "-c", mounted, "sh", *command], capture_output=True,
                                    text=True, timeout=180, check=False)
        except FileNotFoundError:
            break
        if not result.stderr.startswith(("unshare:", "mount:")) and result.returncode != 99:
            return result
    pytest.skip("no mount namespace here to make a read-only folder in")


def test_a_read_only_data_dir_holding_its_model_starts_answers_and_says_once_nothing_is_saved(
        tiny_model, tmp_path, monkeypatch):
    """The data dir as the issue met it: the model already in it (a name from the models dir, so its
    last-use time would be written), the whole folder on a read-only file system."""
    data = tmp_path / "read-only-data"
    (data / "tui-chat" / "models").mkdir(parents=True)
    (data / "tui-chat" / "models" / "tiny.gguf").write_bytes(tiny_model.read_bytes())
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    answered = read_only(data, sys.executable, "-m", "tui_chat", "run", "-m", "tiny.gguf", "-p", "Hello",
                         "--max-tokens", "8")
    assert answered.returncode == 0 and answered.stdout.strip() and answered.stderr == "", answered.stderr
    chatted = read_only(data, sys.executable, "-c", READ_ONLY_APP, str(Path(__file__).parent))
    assert chatted.returncode == 0, chatted.stderr[-2000:]
    shown = json.loads(chatted.stdout.splitlines()[-1])
    assert shown["reply"]
    [note] = [note for note in shown["notes"] if "saved" in note]
    assert note == (f"cannot open the history {data / 'tui-chat' / 'history.sqlite3'}: {data / 'tui-chat'} is "
                    "read-only (unable to open database file): this session is not saved")
    assert list((data / "tui-chat" / "models").iterdir()) == [data / "tui-chat" / "models" / "tiny.gguf"]


# --- a config edited by hand --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 'red'", "unknown setting 'colour'"),
        ("n_ctx = '4k'", "n_ctx must be a whole number"),
        ("[sampling]\nstop = 3", "stop sequences must be non-empty text"),
        ("[sampling\ntemperature = 0.2", "Expected ']' at the end of a table declaration (at line 1, column 10)"),
        ("[remotes.lab]\nbase_url = 'gpu-box:8080'", "[remotes.lab]: base_url must be an http:// or https:// URL"),
    ],
)
def test_a_hand_edited_config_stops_the_chat_before_it_draws(isolated_dirs, text, message):
    """`tui-chat` (the chat UI) reads the config before touching the terminal: one line naming file and key."""
    config = isolated_dirs / "config" / "tui-chat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(text, encoding="utf-8")
    result = run_cli(timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("tui-chat: error: ") and result.stderr.count("\n") == 1
    assert str(config) in result.stderr and message in result.stderr


# --- the terminal shrinks mid-reply -------------------------------------------------------------------

LONG = SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=300)
COUNTING = "Count from 1 to 100, separated by commas."  # the starter runs on until max tokens


async def reply_at_100x30(model, shrink_mid_reply: bool) -> tuple[str, str, dict]:
    """One long greedy reply; with `shrink_mid_reply` the terminal goes to 20x10 while it streams, then back.
    On the starter: the tiny model writes its thousands of tokens a second before the terminal shrinks."""
    app = make_app(str(model), LONG, n_ctx=1024)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await loaded(pilot)
        await send(pilot, COUNTING)
        if shrink_mid_reply:
            await wait_for(pilot, lambda: screen.reply is not None and screen.reply.visible)
            await pilot.resize_terminal(20, 10)
            await pilot.pause(0.1)
            assert screen.reply is not None, "the reply was still streaming when the terminal shrank"
            assert not screen.query_one("#side").display, "a narrow screen hides the side panel"
            await pilot.resize_terminal(100, 30)
        reply = await reply_done(pilot, timeout=180)
        await pilot.pause()
        assert said(screen)[-1].content == reply.text and screen.query_one(PromptInput).has_focus
        regions = {part: screen.query_one(part).region for part in ("#log", "#prompt", "#side")}
        return reply.text, reply.reply.footer, regions


@pytest.mark.starter
async def test_a_20x10_terminal_mid_reply_loses_nothing_and_the_layout_comes_back(starter_model):
    engine = open_backend(starter_model, n_ctx=1024)
    try:
        expected = ask(engine, COUNTING, LONG).text
    finally:
        engine.close()
    text, footer, layout = await reply_at_100x30(starter_model, shrink_mid_reply=True)
    assert text == expected and footer.startswith("max tokens · 300 tokens")
    assert layout == (await reply_at_100x30(starter_model, shrink_mid_reply=False))[2]


def test_every_test_named_in_faults_md_exists():
    """docs/faults.md names the test that proves each row: a renamed or removed test must not leave a row
    proved by nothing."""
    root = Path(__file__).parent.parent
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", (root / "docs" / "faults.md").read_text())
    assert len(named) > 50
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^(async )?def {name}\(", (root / path).read_text(), re.MULTILINE)]
    assert missing == []
