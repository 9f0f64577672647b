"""The KV cache on disk through real llama.cpp: a chat reopened in a fresh backend (as in a new process)
continues exactly as it would have in memory, on the full-attention tiny model and on the starter's
sliding-window one; a new chat starts from a saved shared prefix; the metrics say what came from disk.

Equality is asserted where both sides read the same tokens in the same batch shapes: the reference is a
backend taking the same turns in memory, restoring nothing (the saved state holds the KV such a backend
computed, byte for byte, and the rest of the prompt is read in the same chunks). Against a cold read of the
whole prompt, the tiny f16 model agrees exactly too (tests/test_engine.py shows the same for in-memory reuse).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from conftest import GREEDY, ask, open_backend
from tui_chat.engine.base import Done, Message, Request
from tui_chat.engine.local import kvstore
from tui_chat.engine.local.kvcache import DiskCache
from tui_chat.engine.local.kvstore import KvStore
from tui_chat.engine.params import LiveParams
from tui_chat.wording import restore_note

NOTES = "Hello the capital of France is Paris and the capital of Germany is Berlin. " * 6
STARTER_NOTES = "Notes on European capitals. " + "Paris is on the Seine and Berlin is on the Spree. " * 45
DIARY = "My travel diary: on Monday we walked along the river, on Tuesday we visited a museum and ate cake. " * 14


def chat(system: str, *turns: str) -> list[Message]:
    return [Message("system", system), *(Message("user", turn) for turn in turns)]


def with_reply(messages: list[Message], reply: Done, question: str) -> list[Message]:
    return [*messages, Message("assistant", reply.text), Message("user", question)]


def run_closed(model: Path, kv: Path, messages: list[Message], conversation: str, **settings) -> Done:
    """One turn in a backend of its own, closed afterwards (its state saved): as one run of the app."""
    backend = open_backend(model, kv_dir=kv, **settings)
    try:
        return ask(backend, messages, conversation=conversation)
    finally:
        backend.close()


def test_a_reopened_chat_continues_as_if_it_had_stayed_in_memory(tiny, tiny_model, tmp_path):
    kv = tmp_path / "kv"
    first = chat(NOTES, "What is the capital of France?")
    in_memory_first = ask(tiny, first)
    second = with_reply(first, in_memory_first, "And of Germany?")
    in_memory = ask(tiny, second)
    assert run_closed(tiny_model, kv, first, "7", n_ctx=1024).text == in_memory_first.text
    reopened = run_closed(tiny_model, kv, second, "7", n_ctx=1024)
    assert reopened.prompt_ids == in_memory.prompt_ids, "the saved transcript tokenizes the chat as before"
    assert reopened.metrics.restored_tokens == reopened.metrics.cached_tokens == in_memory.metrics.cached_tokens
    assert reopened.metrics.restored_tokens > len(in_memory_first.prompt_ids)
    assert reopened.text == in_memory.text


def test_a_restored_turn_replies_as_a_cold_read_of_the_same_tokens(tiny_model, tmp_path):
    kv = tmp_path / "kv"
    first = chat(NOTES, "What is the capital of France?")
    second = with_reply(first, run_closed(tiny_model, kv, first, "7", n_ctx=1024), "Tell me more.")
    restored = open_backend(tiny_model, n_ctx=1024, kv_dir=kv)
    cold = open_backend(tiny_model, n_ctx=1024)
    try:
        from_disk = ask(restored, second)
        read_text, read_tokens = restored.transcript.last_prompt
        cold.transcript.text, cold.transcript.tokens = read_text, list(read_tokens)
        fresh = ask(cold, second)
    finally:
        restored.close()
        cold.close()
    assert from_disk.metrics.restored_tokens > 0 and fresh.metrics.cached_tokens == 0
    assert fresh.prompt_ids == from_disk.prompt_ids
    assert fresh.text == from_disk.text


def test_the_metrics_say_what_came_from_disk_and_what_it_spared(tiny_model, tmp_path):
    kv = tmp_path / "kv"
    first = chat(NOTES, "What is the capital of France?")
    saved = run_closed(tiny_model, kv, first, "7", n_ctx=1024)
    reopened = run_closed(tiny_model, kv, with_reply(first, saved, "And of Germany?"), "7", n_ctx=1024)
    m = reopened.metrics
    [entry] = KvStore(kv).list_entries()
    assert 0 < m.restored_tokens == m.cached_tokens < m.prompt_tokens
    assert 0 < m.restore_s < reopened.metrics.ttft_s
    rate = entry.notes.prefill_tok_s or 0.0
    assert rate > 0 and m.restore_avoided_s == pytest.approx(m.restored_tokens / rate)
    assert restore_note(m.as_dict()).startswith(f"restored {m.restored_tokens:,} tokens from disk in ")
    regenerated = run_closed(tiny_model, kv, with_reply(first, saved, "And of Germany?"), "7", n_ctx=1024)
    assert regenerated.metrics.restored_tokens == m.prompt_tokens - 1, "from the state the reopened turn saved"
    assert regenerated.text == reopened.text


def test_a_turn_that_reuses_its_own_memory_touches_no_disk_state(tiny_model, tmp_path):
    backend = open_backend(tiny_model, n_ctx=1024, kv_dir=tmp_path / "kv")
    try:
        first = chat(NOTES, "What is the capital of France?")
        reply = ask(backend, first, conversation="7")
        second = ask(backend, with_reply(first, reply, "And of Germany?"), conversation="7")
    finally:
        backend.close()
    assert second.metrics.restored_tokens == 0 and second.metrics.cached_tokens > len(reply.prompt_ids)
    [entry] = KvStore(tmp_path / "kv").list_entries()
    assert entry.notes.conversation == "7" and entry.n_tokens == second.metrics.context_tokens


def test_a_new_chat_with_the_same_system_prompt_starts_from_the_saved_prefix(tiny, tiny_model, tmp_path):
    kv = tmp_path / "kv"
    run_closed(tiny_model, kv, chat(NOTES, "What is the capital of France?"), "1", n_ctx=1024)
    ask(tiny, chat(NOTES, "What is the capital of France?"))
    in_memory = ask(tiny, chat(NOTES, "Where is Berlin?"))
    new_chat = run_closed(tiny_model, kv, chat(NOTES, "Where is Berlin?"), "2", n_ctx=1024)
    assert new_chat.metrics.restored_tokens == in_memory.metrics.cached_tokens >= 90
    assert new_chat.prompt_ids == in_memory.prompt_ids and new_chat.text == in_memory.text
    assert sorted(entry.notes.conversation for entry in KvStore(kv).list_entries()) == ["1", "2"]


def test_the_reply_is_never_kept_waiting_by_the_save(tiny_model, tmp_path, monkeypatch):
    """Done is on its way before the state is written: a slow disk delays the worker, not the reply."""
    release = threading.Event()
    save = DiskCache.save
    monkeypatch.setattr(DiskCache, "save", lambda *args: (release.wait(10), save(*args)))
    backend = open_backend(tiny_model, n_ctx=1024, kv_dir=tmp_path / "kv")
    try:
        done = backend.generate(Request(chat(NOTES, "Hi"), LiveParams(GREEDY), conversation="3")).result()
        assert isinstance(done, Done) and not (tmp_path / "kv").exists()
        release.set()
    finally:
        release.set()
        backend.close()
    assert len(KvStore(tmp_path / "kv").list_entries()) == 1


def test_a_turn_lists_the_folder_once_and_rereads_no_state_it_wrote(tiny_model, tmp_path, monkeypatch):
    """Reading the reopened chat's transcript, restoring its state and saving the next one work from one look at
    the folder a turn; a state this process wrote is known from what it wrote, not read back."""
    kv = tmp_path / "kv"
    first = chat(NOTES, "What is the capital of France?")
    reply = run_closed(tiny_model, kv, first, "7", n_ctx=1024)
    looks, reads = [], []
    scandir, read_entry = kvstore.os.scandir, kvstore.read_entry
    monkeypatch.setattr(kvstore.os, "scandir", lambda path: looks.append(path) or scandir(path))
    monkeypatch.setattr(kvstore, "read_entry", lambda *args: reads.append(args[0]) or read_entry(*args))
    backend = open_backend(tiny_model, n_ctx=1024, kv_dir=kv)
    try:
        second = with_reply(first, reply, "And of Germany?")
        reopened = ask(backend, second, conversation="7")
        ask(backend, with_reply(second, reopened, "And of Spain?"), conversation="7")
    finally:
        backend.close()  # after the last save
    assert reopened.metrics.restored_tokens > 0
    assert len(looks) == 2, "one look a turn"
    assert reads == [reads[0]], "the first process's state read once; those this one saved never read back"


def test_a_reply_no_chat_keeps_leaves_no_state(tiny_model, tmp_path):
    """`run` without --save: its state would only fill the disk and change a later cold run's reply (issue 38)."""
    run_closed(tiny_model, tmp_path / "kv", chat(NOTES, "What is the capital of France?"), "", n_ctx=1024)
    assert KvStore(tmp_path / "kv").list_entries() == []


def test_a_zero_budget_saves_nothing(tiny_model, tmp_path):
    run_closed(tiny_model, tmp_path / "kv", chat(NOTES, "Hi"), "1", n_ctx=1024, kv_budget_bytes=0)
    assert not (tmp_path / "kv").exists()


@pytest.mark.starter
def test_on_the_sliding_window_model_reopened_and_shared_prefix_chats_reply_as_in_memory(starter_model, tmp_path):
    """Past the 512-token sliding window: a chat reopened from disk, and a new chat cut back from a ~1,000-token
    state to the ~600-token system prompt, reply token for token as the same turns taken in memory.

    A sequence's state as llama.cpp saves it (llama_state_seq_*) leaves out the cells the window has passed:
    cut back the same way, the new chat's sliding-window layers would see ~100 positions instead of 512, and
    its reply differs (seen while building this: " Paris is on the Seine and ..." instead of " Paris")."""
    kv = tmp_path / "kv"
    params = GREEDY.with_changes(max_tokens=24)
    first = chat(STARTER_NOTES, DIARY + "Where did we walk on Monday?")
    other = chat(STARTER_NOTES, "Which of the two cities is larger?")
    in_memory = open_backend(starter_model, n_ctx=2048, kv_dir=kv)
    try:  # the first turn's state stays on disk, as a closed app leaves it; the rest happens in memory
        in_memory_first = ask(in_memory, first, params, conversation="A")
        second = with_reply(first, in_memory_first, "What river flows through Paris?")
        in_memory_second = ask(in_memory, second, params, conversation="memory")
        in_memory_other = ask(in_memory, other, params, conversation="memory")
    finally:
        in_memory.close()
    assert KvStore(kv).forget("memory") == 2
    assert in_memory_first.metrics.prompt_tokens > 900 and in_memory_other.metrics.cached_tokens > 512
    assert in_memory_second.metrics.restored_tokens == in_memory_other.metrics.restored_tokens == 0

    def reopen(messages: list[Message], conversation: str) -> Done:
        backend = open_backend(starter_model, n_ctx=2048, kv_dir=kv)
        try:
            return ask(backend, messages, params, conversation=conversation)
        finally:
            backend.close()

    reopened, new_chat = reopen(second, "A"), reopen(other, "B")
    for from_disk, in_memory in ((reopened, in_memory_second), (new_chat, in_memory_other)):
        assert from_disk.metrics.restored_tokens == in_memory.metrics.cached_tokens
        assert from_disk.prompt_ids == in_memory.prompt_ids
        assert from_disk.text == in_memory.text
    assert new_chat.metrics.restored_tokens < reopened.metrics.restored_tokens, "cut back to the shared prefix"
