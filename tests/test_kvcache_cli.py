"""The KV cache on disk from the command line, as real processes: `run --save` then `run --continue ID` in a
new process restores the chat's cache; `tui-chat cache` lists what is saved and `cache clear` deletes it;
`models rm` deletes a removed model's caches."""

from __future__ import annotations

import json
import shutil

from conftest import run_cli
from test_kvcache import NOTES
from tui_chat.config import history_path, kv_cache_dir
from tui_chat.engine.local.kvstore import KvStore
from tui_chat.history import History
from tui_chat.wording import stored_footer

FIRST = ("run", "--save", "--temperature", "0", "--max-tokens", "24", "--system", NOTES)


def test_a_saved_chat_goes_on_in_a_new_process_from_its_cache_on_disk(tiny_model):
    first = run_cli(*FIRST, "-m", str(tiny_model), "-p", "What is the capital of France?")
    assert first.returncode == 0 and first.stderr == "tui-chat: saving as conversation 1\n"
    [entry] = KvStore(kv_cache_dir()).list_entries()
    assert entry.notes.conversation == "1" and entry.model_name == "tiny.gguf"
    second = run_cli("run", "--continue", "1", "--max-tokens", "8", "-p", "And of Germany?", "--json")
    assert second.returncode == 0, second.stderr
    assert second.stderr == "tui-chat: continuing conversation 1\n"
    report = json.loads(second.stdout)
    [turn] = report["turns"]
    assert turn["restored_tokens"] > 0 and turn["cached_tokens"] == turn["restored_tokens"] >= entry.n_tokens - 1
    assert turn["restore_s"] > 0 and turn["completion_tokens"] <= 8
    assert "greedy reply can part from a cold run's" in turn["restore_note"], "said where a restore may change text"
    assert "restore_note" not in json.loads(run_cli("run", "-m", str(tiny_model), "-p", "Hi", "--max-tokens", "4",
                                                    "--json").stdout)["turns"][0], "only where one was restored"
    assert report["params"]["temperature"] == 0, "the saved chat's settings, with the flags laid over them"
    with History(history_path()) as history:
        chat = history.load(1)
    assert [m.content for m in chat.path if m.role == "user"] == ["What is the capital of France?", "And of Germany?"]
    assert chat.system_prompt == NOTES and chat.model == str(tiny_model) and chat.sampling.max_tokens == 8
    assert chat.path[-1].metrics["restored_tokens"] == turn["restored_tokens"]


def test_the_cache_command_lists_and_clears_and_a_chat_that_is_not_there_is_one_line(tiny_model):
    assert run_cli("cache").stderr.startswith("no KV caches saved in ")
    run_cli(*FIRST, "-m", str(tiny_model), "-p", "Hello")
    listing = run_cli("cache")
    header, row, total = listing.stdout.splitlines()
    assert header.split() == ["MODEL", "TOKENS", "SIZE", "LAST", "USED", "CHAT"]
    assert row.startswith("tiny.gguf") and row.endswith("  1")
    assert total.startswith("1 saved, ") and "of the 4.0 GiB budget" in total
    [entry] = json.loads(run_cli("cache", "--json").stdout)
    assert entry["model"] == "tiny.gguf" and entry["conversation"] == "1" and entry["tokens"] > 32
    cleared = run_cli("cache", "clear")
    assert cleared.returncode == 0 and cleared.stdout.startswith("deleted 1 saved KV cache (")
    assert KvStore(kv_cache_dir()).list_entries() == []
    missing = run_cli("run", "--continue", "99", "-p", "Hi")
    assert missing.returncode == 2 and missing.stderr == "tui-chat: error: no conversation 99\n"


def test_removing_a_model_deletes_its_caches(tiny_model, models):
    copy = models / "tiny-copy.gguf"
    models.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_model, copy)
    run_cli(*FIRST, "-m", str(tiny_model), "-p", "Hello")
    run_cli(*FIRST, "-m", "tiny-copy.gguf", "-p", "Hello")
    cached = sorted(entry.model_name for entry in KvStore(kv_cache_dir()).list_entries())
    assert cached == ["tiny-copy.gguf", "tiny.gguf"]
    removed = run_cli("models", "rm", "tiny-copy.gguf")
    assert removed.returncode == 0 and removed.stdout.endswith(" and its 1 saved KV cache\n"), removed
    assert [entry.model_name for entry in KvStore(kv_cache_dir()).list_entries()] == ["tiny.gguf"]


def test_a_continued_chat_keeps_its_format_unless_a_flag_names_another(tiny_model):
    """`--format text` is a choice too: it takes a JSON chat back to free text; no flag keeps the chat's own."""
    run_cli("run", "--save", "--max-tokens", "8", "--format", "json", "-m", str(tiny_model), "-p", "Hi")

    def format_of_next_turn(*flags: str) -> str | None:
        done = run_cli("run", "--continue", "1", "--max-tokens", "4", "--json", *flags, "-p", "More")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["turns"][0].get("format")

    assert format_of_next_turn() == "json"
    assert format_of_next_turn("--format", "text") is None  # free text: no format in the report
    assert format_of_next_turn() is None, "the chat now goes on as free text"


def test_a_restore_says_what_it_spared_even_after_only_short_prompt_reads(tiny_model):
    """A chat of short messages never reads a long prompt, so no reading rate was measured to price what a
    restore spared (issue 25, item 14: `restore_avoided_s` was null, the note never said it): the restore
    measures it once, reading one batch of what it restored, and the footer says it."""
    first = run_cli("run", "--save", "--temperature", "0", "--max-tokens", "96", "-m", str(tiny_model),
                    "-p", "Hello there, what is the capital of France?", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["turns"][0]["prompt_tokens"] < 64, "no read long enough to measure a rate"
    second = run_cli("run", "--continue", "1", "--max-tokens", "8", "-p", "And of Germany?", "--json")
    assert second.returncode == 0, second.stderr
    [turn] = json.loads(second.stdout)["turns"]
    assert turn["restored_tokens"] >= 64
    assert turn["restore_avoided_s"] is not None and 0 < turn["restore_avoided_s"] < 60
    with History(history_path()) as history:
        footer = stored_footer(history.load(1).path[-1])
    assert f"restored {turn['restored_tokens']:,} tokens from disk in " in footer
    assert "(reading them would take ~" in footer
