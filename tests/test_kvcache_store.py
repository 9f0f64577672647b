"""The on-disk KV store's own rules on real files: names, the budget and least-recently-used eviction, one
state per chat, listing and deleting. The bodies here are plain bytes (what llama.cpp writes is opaque to
the store); tests/test_kvcache.py restores real llama.cpp states."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tui_chat.config import DEFAULT_KV_CACHE_BUDGET_GB, ConfigError, load_config
from tui_chat.engine.base import TurnMetrics
from tui_chat.engine.local.kvcache import LOAD_BYTES_PER_S, MIN_GAIN_TOKENS, worth_restoring
from tui_chat.engine.local.kvstore import KvKey, KvStore, Notes
from tui_chat.wording import restore_note

BODY = 10_000


def key(model: str = "/models/a.gguf", build: str = "0.0.1 (abc)", n_ctx: int = 4096) -> KvKey:
    return KvKey(model, 1000, 1, "ab" * 32, n_ctx, 1, 1, build)


def writer(size: int = BODY):
    def write(path: Path) -> int:
        path.write_bytes(os.urandom(size))
        return size
    return write


def save(store: KvStore, tokens, conversation: str = "", size: int = BODY, the_key: KvKey | None = None):
    return store.save(the_key or key(), list(tokens), writer(size), size, Notes(conversation))


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_state_is_named_by_its_key_and_tokens_and_found_by_the_longest_prefix(tmp_path):
    store = KvStore(tmp_path / "kv")
    short = save(store, range(100), "1")
    long = save(store, [*range(50), *range(500, 700)], "2")
    assert short.path.name.startswith(key().prefix + "-") and short.path.suffix == ".kv"
    assert not list((tmp_path / "kv").glob("*.partial"))
    prompt = [*range(50), *range(500, 600), 9999]
    assert store.best_match(key(), prompt, len(prompt) - 1)[1:] == (150,)
    assert store.best_match(key(), prompt, len(prompt) - 1)[0].path == long.path
    assert store.best_match(key(), list(range(80)), 79)[0].path == short.path
    assert store.best_match(key(n_ctx=2048), prompt, len(prompt) - 1) is None, "another context shape"
    assert store.best_match(key(), [7777, 1, 2], 2) is None, "no shared token"


def test_each_chat_keeps_its_longest_state_and_a_state_already_held_is_not_written_again(tmp_path):
    store = KvStore(tmp_path / "kv")
    first = save(store, range(100), "1")
    second = save(store, range(150), "1")  # the chat's next turn holds all of the first
    other = save(store, [*range(50), *range(1000, 1070)], "2")  # shares a prefix: both are kept
    assert not first.path.exists() and second.path.exists() and other.path.exists()
    age(second.path, 100)
    held = save(store, range(90), "3")  # already inside a saved state: that one is only marked used
    assert held.path == second.path and time.time() - second.path.stat().st_mtime < 5
    assert sorted(entry.n_tokens for entry in store.list_entries()) == [120, 150]


def test_the_budget_evicts_the_least_recently_used_first(tmp_path, kv_log):
    store = KvStore(tmp_path / "kv", budget_bytes=int(3.5 * BODY))
    entries = [save(store, range(i * 1000, i * 1000 + 100), str(i)) for i in range(3)]
    for seconds, entry in zip((300, 200, 100), entries, strict=True):
        age(entry.path, seconds)
    store.touch(entries[0])  # restored just now: the most recently used
    newest = save(store, range(9000, 9100), "new")
    assert [entry.path for entry in store.list_entries()] == [newest.path, entries[0].path, entries[2].path]
    assert not entries[1].path.exists()
    assert kv_log.new_lines() == [
        f"tui-chat: kv cache: {entries[1].path.name} (100 tokens, least recently used) evicted"]


def test_a_state_larger_than_the_whole_budget_writes_nothing(tmp_path, kv_log):
    store = KvStore(tmp_path / "kv", budget_bytes=BODY // 2)
    assert save(store, range(100)) is None
    assert not (tmp_path / "kv").exists()
    [line] = kv_log.new_lines()
    assert line.startswith("tui-chat: kv cache: the state of 100 tokens was not saved: it needs 10.2 KiB, more than "
                           "the whole budget (4.9 KiB, kv_cache_budget_gb in the config)")


def test_listing_and_deleting_by_chat_by_model_and_all(tmp_path):
    store = KvStore(tmp_path / "kv")
    model_b = key("/models/b.gguf")
    saved = [save(store, range(100), "1"), save(store, range(200, 300), "2"),
             save(store, range(400, 460), "2", the_key=model_b)]
    for seconds, entry in zip((300, 200, 100), saved, strict=True):
        age(entry.path, seconds)
    listed = store.list_entries()
    assert [(entry.model_name, entry.n_tokens, entry.notes.conversation) for entry in listed] == [
        ("b.gguf", 60, "2"), ("a.gguf", 100, "2"), ("a.gguf", 100, "1")]
    assert all(entry.size_bytes > BODY for entry in listed)
    assert listed[0].last_used == pytest.approx(time.time() - 100, abs=5)
    assert store.total_bytes() == sum(entry.size_bytes for entry in listed)
    assert store.forget("2") == 2
    assert [entry.notes.conversation for entry in store.list_entries()] == ["1"]
    save(store, range(400, 460), "3", the_key=model_b)
    assert store.forget_model(Path("/models/b.gguf")) == 1
    assert store.clear() == 1 and store.list_entries() == []
    assert KvStore(tmp_path / "never made").list_entries() == []


def test_unfinished_writes_are_never_listed_and_old_ones_are_cleared(tmp_path):
    folder = tmp_path / "kv"
    store = KvStore(folder)
    entry = save(store, range(100))
    stale, fresh = folder / f"{entry.path.name}.123.partial", folder / f"{entry.path.name}.456.partial"
    stale.write_bytes(entry.path.read_bytes())  # even a whole state is not used without its final name
    fresh.write_bytes(b"being written")
    age(stale, 2 * 3600)
    entry.path.unlink()
    assert store.list_entries() == []
    save(store, range(200, 300))
    assert not stale.exists() and fresh.exists(), "a write in progress in another process is left alone"
    store.clear()
    assert list(folder.iterdir()) == []


def test_the_transcript_saved_with_a_state_gives_back_its_tokens(tmp_path):
    store = KvStore(tmp_path / "kv")
    tokens = list(range(100))
    transcript = (*tokens[:95], 5000)  # the reply's last token was sampled but never read back
    store.save(key(), tokens, writer(), BODY, Notes("1", "User: hi\nAssistant: hello", transcript, 9, 40, 250.0))
    assert store.reading(key(), "User: hi\nAssistant: hello\nUser: more") == ("User: hi\nAssistant: hello", transcript)
    assert store.reading(key(), "User: hi\nAssistant: bye") == ("User: hi\n", tuple(range(40)))
    assert store.reading(key(), "Something else") == ("", ())
    [entry] = store.list_entries()
    assert entry.notes.prefill_tok_s == 250.0


def test_restoring_is_chosen_only_when_it_beats_reading():
    assert not worth_restoring(MIN_GAIN_TOKENS - 1, 1, None)
    assert worth_restoring(MIN_GAIN_TOKENS, 10**9, None), "reading rate unknown: restore"
    assert worth_restoring(3000, 55 * 10**6, 700.0), "3,000 tokens at 700 tok/s vs 55 MB at disk speed"
    assert not worth_restoring(100, int(LOAD_BYTES_PER_S), 1000.0), "a second to load what reads in 0.1 s"


def test_the_footer_note_says_what_came_from_disk_and_what_it_spared():
    metrics = TurnMetrics(prompt_tokens=3900, cached_tokens=3812, restored_tokens=3812, restore_s=0.04,
                          restore_avoided_s=6.1)
    assert metrics.as_dict()["restored_tokens"] == 3812
    assert restore_note(metrics.as_dict()) == \
        "restored 3,812 tokens from disk in 40 ms (reading them would take ~6.1 s)"
    assert restore_note({"restored_tokens": 50, "restore_s": 1.5, "restore_avoided_s": None}) == \
        "restored 50 tokens from disk in 1.5 s"
    assert restore_note(TurnMetrics(cached_tokens=10).as_dict()) == restore_note({}) == ""


@pytest.mark.parametrize(("text", "budget"), [("", DEFAULT_KV_CACHE_BUDGET_GB), ("kv_cache_budget_gb = 0", 0.0),
                                              ("kv_cache_budget_gb = 0.5", 0.5)])
def test_the_budget_is_a_config_setting(tmp_path, text, budget):
    path = tmp_path / "config.toml"
    path.write_text(text)
    assert load_config(path).kv_cache_budget_gb == budget
    assert load_config(path).kv_cache_budget_bytes == int(budget * 2**30)


@pytest.mark.parametrize("value", ["-1", "'4GB'", "true", "nan", "inf"])
def test_a_bad_budget_is_one_line(tmp_path, value):
    path = tmp_path / "config.toml"
    path.write_text(f"kv_cache_budget_gb = {value}")
    with pytest.raises(ConfigError, match="kv_cache_budget_gb must be a number of gigabytes") as error:
        load_config(path)
    assert "\n" not in str(error.value)


def test_tokens_are_compared_as_numbers_not_text():
    from tui_chat.engine.local.kvstore import shared_prefix

    saved = np.array([1, 2, 3, 4], dtype="<i4")
    assert shared_prefix(saved, np.array([1, 2, 9]), 10) == 2
    assert shared_prefix(saved, np.array([1, 2, 3, 4, 5]), 3) == 3
    assert shared_prefix(saved, np.array([], dtype=int), 5) == 0


def test_a_model_file_is_known_by_its_size_date_and_header(tmp_path):
    """Cheap to take (no weights read) and different for a changed file, even one given its old date back."""
    from tiny_model import write_tiny_model
    from tui_chat.engine.local.kvstore import model_key
    from tui_chat.gguf import read_header

    path = write_tiny_model(tmp_path / "model.gguf")
    first = model_key(path, read_header(path).sha256, 1024, 1, 1, "b")
    assert model_key(path, read_header(path).sha256, 1024, 1, 1, "b") == first and first.mismatch(first) is None
    before = path.stat()
    write_tiny_model(path, chat_template="{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    changed = model_key(path, read_header(path).sha256, 1024, 1, 1, "b")
    assert changed.model_header_sha256 != first.model_header_sha256
    assert first.mismatch(changed) == "model.gguf changed since it was saved"


def test_listing_and_deleting_states_does_not_load_llama_cpp(tmp_path):
    """The app deletes a chat's states and `tui-chat cache` lists them without loading llama.cpp."""
    script = ("import sys; from pathlib import Path; from tui_chat.engine.local.kvstore import KvStore; "
              "store = KvStore(Path(sys.argv[1])); store.list_entries(); store.forget('1'); store.clear(); "
              "print('llama_cpp' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
