"""Bad input for the KV cache on disk, on real files and real llama.cpp: a truncated, damaged or foreign
state file, one from another llama.cpp build, a model file changed in place, a full disk while saving, a
`kill -9` mid-save. Each is skipped with one log line and the turn reads its prompt instead: never a
crash, and the reply is the one a cold cache reading the same tokens gives. docs/faults.md lists them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ask, kv_lines, open_backend
from test_kvcache import NOTES, chat, with_reply
from tiny_model import write_tiny_model
from tui_chat.engine.base import Done, Message
from tui_chat.engine.local import model as loaded_model
from tui_chat.engine.local.kvstore import KvStore

TESTS = Path(__file__).parent


def take_turn(model: Path, kv: Path, messages: list[Message]) -> tuple[Done, tuple[str, list[int]]]:
    """A turn in a backend of its own (as a new process would take it); also the prompt it read."""
    backend = open_backend(model, n_ctx=1024, kv_dir=kv)
    try:
        return ask(backend, messages, conversation="7"), backend.transcript.last_prompt
    finally:
        backend.close()


def cold_read(model: Path, prompt: tuple[str, list[int]], messages: list[Message]) -> Done:
    """The reply of a backend with no cache at all, reading the very tokens `prompt` holds."""
    backend = open_backend(model, n_ctx=1024)
    try:
        backend.transcript.text, backend.transcript.tokens = prompt[0], list(prompt[1])
        done = ask(backend, messages)
    finally:
        backend.close()
    assert done.metrics.cached_tokens == 0
    return done


def saved_chat(model: Path, kv: Path) -> tuple[list[Message], Path]:
    """A chat whose first turn is saved; returns its next turn's messages and the state file."""
    first = chat(NOTES, "What is the capital of France?")
    reply, _ = take_turn(model, kv, first)
    [entry] = KvStore(kv).list_entries()
    return with_reply(first, reply, "And of Germany?"), entry.path


def assert_read_afresh(model: Path, kv: Path, messages: list[Message]) -> Done:
    done, prompt = take_turn(model, kv, messages)
    assert done.metrics.restored_tokens == done.metrics.cached_tokens == 0
    assert done.text == cold_read(model, prompt, messages).text
    return done


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def truncate(path: Path, size: int) -> None:
    with path.open("r+b") as handle:
        handle.truncate(size)


DAMAGE = {
    "truncated to half": (lambda path, entry: truncate(path, entry.size_bytes // 2),
                          "it is not a tui-chat KV state, or its end is missing (truncated?)"),
    "its last bytes cut": (lambda path, entry: truncate(path, entry.size_bytes - 3),
                           "it is not a tui-chat KV state, or its end is missing (truncated?)"),
    "a flipped bit in the KV data": (lambda path, entry: flip_byte(path, entry.body_bytes // 2),
                                     "its contents do not match their checksum"),
    "a flipped bit in the token list": (lambda path, entry: flip_byte(path, entry.body_bytes + 5),
                                        "its trailer does not match its checksum"),
    "random bytes": (lambda path, entry: path.write_bytes(os.urandom(entry.size_bytes)),
                     "it is not a tui-chat KV state, or its end is missing (truncated?)"),
    "empty": (lambda path, entry: path.write_bytes(b""), "it is too short to be a saved state"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_state_file_is_skipped_in_one_line_and_the_turn_reads_its_prompt(damage, tiny_model, tmp_path,
                                                                                    kv_log):
    kv = tmp_path / "kv"
    messages, path = saved_chat(tiny_model, kv)
    [entry] = KvStore(kv).list_entries()
    spoil, reason = DAMAGE[damage]
    spoil(path, entry)
    kv_log.new_lines()
    assert_read_afresh(tiny_model, kv, messages)
    assert kv_log.new_lines() == [f"tui-chat: kv cache: {path.name} skipped and deleted: {reason}"]
    assert not path.exists()


def test_another_models_state_under_this_models_name_is_foreign(tiny_model, tmp_path, kv_log):
    kv, other_kv = tmp_path / "kv", tmp_path / "other"
    messages, path = saved_chat(tiny_model, kv)
    other_model = write_tiny_model(tmp_path / "other.gguf", seed=1)
    _, foreign = saved_chat(other_model, other_kv)
    shutil.copyfile(foreign, path)
    kv_log.new_lines()
    assert_read_afresh(tiny_model, kv, messages)
    assert kv_log.new_lines() == [
        f"tui-chat: kv cache: {path.name} skipped and deleted: its name does not match what it holds"]


def test_a_state_from_another_llama_cpp_build_is_skipped(tiny_model, tmp_path, kv_log, monkeypatch):
    kv = tmp_path / "kv"
    messages, path = saved_chat(tiny_model, kv)
    [entry] = KvStore(kv).list_entries()
    monkeypatch.setattr(loaded_model, "build_version", lambda: "0.0.1 (upgraded)")
    kv_log.new_lines()
    assert_read_afresh(tiny_model, kv, messages)
    assert kv_log.new_lines()[0] == (
        f"tui-chat: kv cache: {path.name} skipped and deleted: it was saved by another llama.cpp build "
        f"({entry.key.build}; this one is 0.0.1 (upgraded))")
    assert [entry.key.build for entry in KvStore(kv).list_entries()] == ["0.0.1 (upgraded)"], "saved anew"


def test_a_model_file_changed_in_place_skips_its_states(tmp_path, kv_log):
    kv, model = tmp_path / "kv", tmp_path / "model.gguf"
    write_tiny_model(model)
    messages, path = saved_chat(model, kv)
    write_tiny_model(model, seed=1)  # same name, same size and settings, other weights: a new download
    kv_log.new_lines()
    assert_read_afresh(model, kv, messages)
    assert kv_log.new_lines()[0] == (
        f"tui-chat: kv cache: {path.name} skipped and deleted: model.gguf changed since it was saved")


def test_another_context_size_is_another_cache_and_nothing_is_deleted(tiny_model, tmp_path, kv_log):
    kv = tmp_path / "kv"
    messages, path = saved_chat(tiny_model, kv)
    kv_log.new_lines()
    backend = open_backend(tiny_model, n_ctx=2048, kv_dir=kv)
    try:
        assert ask(backend, messages).metrics.restored_tokens == 0
    finally:
        backend.close()
    assert path.exists() and kv_log.new_lines() == []


CHAT_ON_A_FULL_DISK = textwrap.dedent("""
    import json
    import resource
    import signal
    import sys
    from pathlib import Path

    from tui_chat.engine.base import Message, Request
    from tui_chat.engine.local import logs
    from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
    from tui_chat.engine.params import LiveParams, SamplingParams

    model, kv, log_dir, notes = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    backend = LlamaBackend(LlamaSettings(model, n_ctx=1024, kv_dir=kv))
    backend.load().result()
    logs.install(log_dir)  # a fresh log, which stays under the limit
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail (EFBIG) as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    params = LiveParams(SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=16))
    messages = [Message("system", notes), Message("user", "What is the capital of France?")]
    replies = []
    for question in ("And of Germany?", "And of Italy?"):
        done = backend.generate(Request(messages, params, conversation="7")).result()
        replies.append([done.text, done.metrics.cached_tokens])
        messages += [Message("assistant", done.text), Message("user", question)]
    backend.close()
    print(json.dumps(replies))
""")


def test_a_full_disk_while_saving_leaves_no_file_and_the_chat_goes_on(tiny_model, tmp_path):
    """Every file of the process may grow to 64 KB only; each state (~120 KB) fails to save, in one line."""
    kv, log_dir = tmp_path / "kv", tmp_path / "logs"
    process = subprocess.run([sys.executable, "-c", CHAT_ON_A_FULL_DISK, str(tiny_model), str(kv), str(log_dir),
                              NOTES * 4], capture_output=True, text=True, timeout=120, cwd=TESTS)
    assert process.returncode == 0, process.stderr
    assert "Traceback" not in process.stderr
    replies = json.loads(process.stdout)
    assert all(text for text, _ in replies) and replies[1][1] > 0, "answered, the second from memory"
    assert list(kv.iterdir()) == [], "no state, and no unfinished write left behind"
    lines = kv_lines(log_dir / "llama.log")
    assert len(lines) == 2 and all(" tokens was not saved: " in line and "File too large" in line for line in lines)


KILLED_MID_SAVE = textwrap.dedent("""
    import json
    import os
    import signal
    import sys
    import threading
    from pathlib import Path

    from tui_chat.engine.base import Message, Request
    from tui_chat.engine.local.llama import LlamaBackend, LlamaSettings
    from tui_chat.engine.params import LiveParams, SamplingParams

    model, kv, notes = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    backend = LlamaBackend(LlamaSettings(model, n_ctx=1024, kv_dir=kv))
    backend.load().result()
    printed = threading.Event()

    def killed(*args, **kwargs):  # the last moment before the rename, once the reply is out
        printed.wait(30)
        os.kill(os.getpid(), signal.SIGKILL)

    os.replace = killed
    params = LiveParams(SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=16))
    messages = [Message("system", notes), Message("user", "What is the capital of France?")]
    print(json.dumps(backend.generate(Request(messages, params, conversation="7")).result().text), flush=True)
    printed.set()
    backend.close()
""")


def test_kill_9_mid_save_leaves_nothing_that_loads(tiny_model, tmp_path, kv_log):
    """Killed with the state written, trailer and all, and fsynced, but not yet renamed: the worst moment."""
    kv = tmp_path / "kv"
    process = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(tiny_model), str(kv), NOTES],
                             capture_output=True, text=True, timeout=120, cwd=TESTS)
    assert process.returncode == -signal.SIGKILL
    reply = json.loads(process.stdout)
    [partial] = kv.iterdir()
    assert partial.name.endswith(".partial") and partial.stat().st_size > 10_000
    messages = [*chat(NOTES, "What is the capital of France?"), Message("assistant", reply),
                Message("user", "And then?")]
    kv_log.new_lines()
    assert_read_afresh(tiny_model, kv, messages)
    assert kv_log.new_lines() == []


def test_a_state_llama_cpp_refuses_leaves_an_empty_cache_that_still_reads(tiny_model, tmp_path):
    """A state with more cells than the context has (impossible through the store: n_ctx is in the key) is
    refused by llama.cpp itself; the file closes, the cache is empty and the next read works."""
    from tui_chat.engine.local.cpu import Threads
    from tui_chat.engine.local.llamacpp import LlamaSession, StateRefused

    kv = tmp_path / "kv"
    take_turn(tiny_model, kv, chat(NOTES * 3, "What is the capital of France?"))
    [entry] = KvStore(kv).list_entries()
    assert entry.n_tokens > 256
    small = LlamaSession(tiny_model, n_ctx=256, gpu_layers=0, n_batch=256, threads=Threads(1, 1))
    try:
        with pytest.raises(StateRefused, match="failed to restore kv cache"), KvStore(kv).open(entry) as body:
            small.load_state(body, entry.tokens)  # the refusal passes through the file's closing
        assert small.tokens == []
        small.prefill(entry.tokens[:100].tolist(), lambda done: None, lambda: False)
        assert len(small.tokens) == 100
    finally:
        small.close()


def test_a_kv_folder_that_cannot_be_made_saves_nothing_and_the_chat_goes_on(tiny_model, tmp_path, kv_log):
    in_the_way = tmp_path / "kv"
    in_the_way.write_text("a file where the folder should be")
    first = chat(NOTES, "What is the capital of France?")
    reply, _ = take_turn(tiny_model, in_the_way, first)
    again, _ = take_turn(tiny_model, in_the_way, with_reply(first, reply, "And of Germany?"))
    assert reply.text and again.text and again.metrics.restored_tokens == 0
    lines = kv_log.new_lines()
    assert len(lines) == 2 and all(" tokens was not saved: File exists" in line for line in lines)
