"""The history database on real SQLite files: round trips, branches, migrations, two writers, crashes."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, fields
from decimal import Decimal
from itertools import pairwise
from pathlib import Path

import pytest

from tui_chat import history as history_module
from tui_chat.config import history_path
from tui_chat.engine.base import TurnMetrics
from tui_chat.engine.formats import TEXT, choose, grammar, json_schema
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.export import from_json, to_json, to_markdown
from tui_chat.history import FLUSH_INTERVAL_S, History, HistoryError, title_from
from tui_chat.session import opened

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "history.sqlite3"


def two_turns(history: History) -> tuple[int, list[int]]:
    """A conversation: question, answer with metrics, follow-up, answer that was stopped."""
    conversation = history.create(model="tiny", system_prompt="Be brief.",
                                  sampling=SamplingParams(temperature=0.3, stop=("END",)))
    first = history.add_user_message(conversation, "What is the capital of France?\nAnswer in one word.", None)
    reply = history.start_reply(conversation, first)
    reply.append("Paris")
    reply.finish("Paris.", "eos", TurnMetrics(prompt_tokens=20, completion_tokens=3, ttft_s=0.25, decode_s=0.1),
                 Decimal("0.0000812"))
    second = history.add_user_message(conversation, "And Italy?", reply.id)
    stopped = history.start_reply(conversation, second)
    stopped.append("Ro")
    stopped.finish("Ro", "cancelled")
    return conversation, [first, reply.id, second, stopped.id]


def test_a_conversation_round_trips_through_the_file(db):
    with History(db) as history:
        conversation, ids = two_turns(history)
    with History(db) as history:
        loaded = history.load(conversation)
    assert loaded.title == "What is the capital of France?"
    assert loaded.model == "tiny" and loaded.system_prompt == "Be brief."
    assert loaded.sampling == SamplingParams(temperature=0.3, stop=("END",))
    assert [m.id for m in loaded.path] == ids
    assert [m.role for m in loaded.path] == ["user", "assistant", "user", "assistant"]
    answer = loaded.path[1]
    assert answer.content == "Paris." and answer.state == "complete" and answer.stop_reason == "eos"
    assert answer.metrics["ttft_s"] == 0.25 and answer.metrics["completion_tokens"] == 3
    assert answer.metrics["decode_tok_s"] == pytest.approx(20.0)
    assert Decimal(answer.metrics["cost_usd"]) == Decimal("0.0000812")
    assert loaded.path[3].state == "stopped" and loaded.path[3].stop_reason == "cancelled"
    assert [(m.role, m.content) for m in opened(loaded, LiveParams(), None).messages()] == [
        ("system", "Be brief."), ("user", "What is the capital of France?\nAnswer in one word."),
        ("assistant", "Paris."), ("user", "And Italy?"), ("assistant", "Ro"),
    ]
    assert loaded.last_id == ids[-1]


def test_a_replys_figures_round_trip_through_the_file_field_for_field(db):
    """`as_dict` and `from_dict` follow TurnMetrics' fields: each is stored and read back (with the rates the
    footer reads beside them), and a figure added later needs no line more (issue 26)."""
    every = TurnMetrics(**{f.name: True if f.type == "bool" else n + 0.5 if "float" in f.type else n
                           for n, f in enumerate(fields(TurnMetrics), start=2)})
    with History(db) as history:
        conversation = history.create(model="tiny")
        reply = history.start_reply(conversation, history.add_user_message(conversation, "Hi", None))
        reply.finish("Hello", "eos", every, Decimal("0.01"))
    with History(db) as history:
        record = history.load(conversation).path[1].metrics
    assert TurnMetrics.from_dict(record) == every
    assert record["decode_tok_s"] == every.decode_tok_s and record["prefill_tok_s"] == every.prefill_tok_s
    assert TurnMetrics.from_dict({}) == TurnMetrics(), "a reply stored before a figure was kept: its default"

    @dataclass(frozen=True, slots=True)
    class Later(TurnMetrics):
        added_figure: int = 0

    assert Later(added_figure=3).as_dict()["added_figure"] == 3
    later = Later(added_figure=3, completion_tokens=4)
    assert Later.from_dict(later.as_dict()) == later


def test_branches_keep_every_reply_and_the_chosen_one_is_active(db):
    with History(db) as history:
        conversation, (question, answer, follow_up, _) = two_turns(history)
        fork = history.start_reply(conversation, question, text="Par", fork_of=answer, fork_token=1)
        fork.finish("Paris, of course.", "eos")
        loaded = history.load(conversation)
        assert [m.content for m in loaded.path] == ["What is the capital of France?\nAnswer in one word.",
                                                    "Paris, of course."]
        siblings = loaded.siblings(loaded.path[1])
        assert [m.id for m in siblings] == [answer, fork.id]
        assert siblings[1].fork_of == answer and siblings[1].fork_token == 1
        history.set_active(answer)
        back = history.load(conversation)
        assert [m.id for m in back.path][:3] == [question, answer, follow_up] and len(back.path) == 4
        assert len(back.messages) == 5
        with pytest.raises(HistoryError, match="no message 999"):
            history.set_active(999)


def test_rename_settings_delete_and_clear_errors(db):
    with History(db) as history:
        conversation, _ = two_turns(history)
        other = history.create()
        history.update(conversation, title="  Capitals ", model="gemma", system_prompt="Answer in French.",
                       sampling=SamplingParams(seed=7))
        loaded = history.load(conversation)
        assert (loaded.title, loaded.model, loaded.system_prompt) == ("Capitals", "gemma", "Answer in French.")
        assert loaded.sampling.seed == 7
        assert [c.id for c in history.conversations()] == [conversation, other]
        with pytest.raises(HistoryError, match="a title cannot be empty"):
            history.update(conversation, title="  ")
        with pytest.raises(HistoryError, match="no conversation 42"):
            history.add_user_message(42, "hi", None)
        with pytest.raises(HistoryError, match="is not in conversation"):
            history.add_user_message(other, "hi", loaded.path[0].id)
        history.delete(conversation)
        assert [c.id for c in history.conversations()] == [other]
        assert history._db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
        with pytest.raises(HistoryError, match=f"no conversation {conversation}"):
            history.load(conversation)


def test_the_output_format_is_kept_with_the_conversation(db):
    """Free text by default; a chosen format comes back when the chat is reopened, through an export and an
    import too; a reply that stopped before its format was complete says so after reopening."""
    schema = json_schema('{"type": "object", "properties": {"city": {"type": "string"}}}')
    with History(db) as history:
        conversation, _ = two_turns(history)
        assert history.load(conversation).output_format == TEXT
        history.update(conversation, output_format=schema)
        question = history.add_user_message(conversation, "Where?", None)
        cut = history.start_reply(conversation, question)
        cut.finish('{"city": "Pa', "length", TurnMetrics(completion_tokens=5), incomplete=True)
        loaded = history.load(conversation)
        assert loaded.output_format == schema
        assert loaded.path[-1].metrics["incomplete"] is True
        assert "Output format: JSON schema" in to_markdown(loaded) and "incomplete" in to_markdown(loaded)
        document = json.loads(json.dumps(to_json(loaded)))
        assert document["output_format"] == {"kind": "json_schema", "source": schema.source}
        assert history.load(history.add_conversation(from_json(document))).output_format == schema
        history.update(conversation, output_format=grammar('root ::= "yes"'))
        assert history.load(conversation).output_format == choose("grammar", 'root ::= "yes"')
        history.update(conversation, output_format=TEXT)
        assert history.load(conversation).output_format == TEXT
        history._db.execute("UPDATE conversations SET output_format = ? WHERE id = ?",
                            ('{"kind": "json_schema", "source": "{nope"}', conversation))
        with pytest.raises(HistoryError, match="output format: the JSON schema is not valid JSON"):
            history.load(conversation)


def test_search_matches_titles_and_text_literally(db):
    with History(db) as history:
        capitals, _ = two_turns(history)
        percent = history.create(title="Budget")
        history.add_user_message(percent, "We spent 100% of it", None)
        plain = history.create(title="Other")
        history.add_user_message(plain, "nothing to see", None)
        found = lambda text: {c.id for c in history.conversations(text)}  # noqa: E731
        assert found("capital") == {capitals}
        assert found("ITALY") == {capitals}
        assert found("budget") == {percent}
        assert found("100%") == {percent}
        assert found("%") == {percent}
        assert found("_") == set()
        assert found("nowhere") == set()
        assert [c.messages for c in history.conversations("capital")] == [4]


def test_title_is_the_first_line_cut_to_fit():
    assert title_from("\n  Hello there  \nmore") == "Hello there"
    long = title_from("word " * 40)
    assert len(long) == history_module.TITLE_LENGTH and long.endswith("…")


def test_a_streaming_reply_reaches_the_file_within_the_flush_interval(db):
    with History(db) as writer, History(db) as reader:
        conversation = writer.create()
        question = writer.add_user_message(conversation, "Count", None)
        reply = writer.start_reply(conversation, question)
        for word in ["one ", "two ", "three "]:
            reply.append(word)
        stored = lambda: reader.load(conversation).path[-1]  # noqa: E731
        assert stored().content == "" and stored().state == "streaming"
        time.sleep(FLUSH_INTERVAL_S)
        reply.append("four")
        writer.later.settle()
        assert stored().content == "one two three four"
        reply.fail("the model stopped answering")
        assert stored().state == "error" and stored().error == "the model stopped answering"
        assert stored().content == "one two three four"


def test_the_streaming_writes_leave_the_callers_thread_and_the_final_one_comes_last(db, monkeypatch):
    """The UI's event loop never waits for SQLite mid-reply; the finished text is never overwritten by a
    streaming write still queued."""
    threads = []
    real = History._write_reply

    def spy(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        time.sleep(0.05)  # a slow disk, or another process holding the write lock
        return real(self, *args, **kwargs)

    monkeypatch.setattr(History, "_write_reply", spy)
    with History(db) as writer, History(db) as reader:
        conversation = writer.create()
        reply = writer.start_reply(conversation, writer.add_user_message(conversation, "Count", None))
        started = time.monotonic()
        for n in range(30):
            reply.append(f"{n} ")
            time.sleep(FLUSH_INTERVAL_S / 10)
        assert time.monotonic() - started < 30 * FLUSH_INTERVAL_S / 10 + 0.05  # no append waited for a write
        reply.finish("done.", "eos")
        assert reader.load(conversation).path[-1].content == "done."
    assert threads[:-1] and set(threads[:-1]) == {"history-writer"}
    assert threads[-1] == threading.current_thread().name


def schema_version(history: History) -> int:
    version: int = history._db.execute("PRAGMA user_version").fetchone()[0]
    return version


def test_migrations_run_in_order_and_keep_the_data(db, monkeypatch):
    with History(db) as history:
        conversation, _ = two_turns(history)
        shipped = len(history_module.MIGRATIONS)
        assert schema_version(history) == shipped
    pinned = ("ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",
              "UPDATE conversations SET pinned = 1")
    monkeypatch.setattr(history_module, "MIGRATIONS", [*history_module.MIGRATIONS, pinned])
    with History(db) as history:
        assert schema_version(history) == shipped + 1
        assert history._db.execute("SELECT pinned FROM conversations").fetchall() == [(1,)]
        assert len(history.load(conversation).path) == 4


def test_a_failed_migration_leaves_the_old_schema_untouched(db, monkeypatch):
    with History(db) as history:
        conversation, _ = two_turns(history)
    broken = ("ALTER TABLE conversations ADD COLUMN pinned INTEGER", "ALTER TABLE no_such_table ADD COLUMN x")
    monkeypatch.setattr(history_module, "MIGRATIONS", [*history_module.MIGRATIONS, broken])
    with pytest.raises(HistoryError, match="no such table"):
        History(db)
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == len(history_module.MIGRATIONS) - 1
    assert "pinned" not in [row[1] for row in raw.execute("PRAGMA table_info(conversations)")]
    raw.close()
    monkeypatch.undo()
    with History(db) as history:
        assert len(history.load(conversation).path) == 4


def test_a_hand_made_version_1_database_opens(db):
    """A file written by another program that follows schema 1 (no WAL, its own ids) is read as ours."""
    raw = sqlite3.connect(db)
    for statement in history_module.MIGRATIONS[0]:
        raw.execute(statement)
    raw.execute("INSERT INTO conversations VALUES (7, 'Old chat', 'm', '', '{\"temperature\": 0.1}', 1.0, 2.0)")
    raw.execute("INSERT INTO messages (id, conversation_id, role, content, state, created_at, updated_at)"
                " VALUES (3, 7, 'user', 'hello', 'complete', 1.0, 1.0)")
    raw.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, state, created_at, updated_at)"
                " VALUES (4, 7, 3, 'assistant', 'hi', 'complete', 1.0, 1.0)")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    with History(db) as history:
        loaded = history.load(7)
        assert loaded.title == "Old chat" and loaded.sampling.temperature == 0.1
        assert [m.content for m in loaded.path] == ["hello", "hi"]
        assert [m.model for m in loaded.path] == ["", "m"], "migrated: an older reply is its chat's last model's"
        assert loaded.output_format == TEXT, "migrated: a chat from before output formats writes free text"
        assert history._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert schema_version(history) == len(history_module.MIGRATIONS)
        assert loaded.thinking and loaded.path[0].reasoning == ""


def test_newer_schema_and_foreign_files_are_clear_errors(db, tmp_path):
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(HistoryError, match="schema version 99, newer than this tui-chat understands"):
        History(db)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(HistoryError, match="cannot open the history .*file is not a database"):
        History(junk)


WRITER = textwrap.dedent("""
    import sys
    import time
    from pathlib import Path
    from tui_chat.history import History

    path, conversation, tag, start = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    with History(path) as history:
        while not start.exists():
            time.sleep(0.005)
        parent = None
        for i in range(200):
            parent = history.add_user_message(conversation, f"{tag} {i}", parent)
        reply = history.start_reply(conversation, parent)
        reply.finish(f"{tag} done", "eos")
""")


def test_two_processes_writing_at_once_both_succeed(db, tmp_path):
    with History(db) as history:
        conversation = history.create(title="shared")
    start = tmp_path / "go"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(conversation), tag, str(start)], cwd=ROOT,
                         stderr=subprocess.PIPE, text=True)
        for tag in ("left", "right")
    ]
    time.sleep(1.0)  # both have opened the file and wait for the start
    start.touch()
    for writer in writers:
        assert writer.wait(timeout=120) == 0, writer.stderr.read()
    with History(db) as history:
        assert history._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        loaded = history.load(conversation)
        for tag in ("left", "right"):
            mine = [m for m in loaded.messages if m.content.startswith(tag)]
            assert [m.content for m in mine] == [f"{tag} {i}" for i in range(200)] + [f"{tag} done"]
            assert all(b.parent_id == a.id for a, b in pairwise(mine))
        assert len(loaded.messages) == 402
        assert loaded.path[-1].content in ("left done", "right done") and len(loaded.path) == 201


def test_kill_9_mid_reply_leaves_a_clean_file_with_the_partial_reply(tiny_model):
    """`tui-chat run --save` is killed while it streams: the file opens clean and holds the reply up to
    about the last flush; since its writer is gone, the reply reads as interrupted."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tui_chat", "run", "--save", "-m", str(tiny_model), "-p", "Hello",
         "--temperature", "0", "--max-tokens", "100000", "--n-ctx", "131072"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        seen = ""
        deadline = time.monotonic() + 60
        while len(seen) < 2000 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            if history_path().exists():
                with History(history_path()) as reader:
                    rows = reader.conversations()
                    if rows and (path := reader.load(rows[0].id).path) and len(path) == 2:
                        seen = path[1].content
        time.sleep(1.5)
        assert process.poll() is None, "the reply ended before the kill"
        process.send_signal(signal.SIGKILL)
        killed_at = time.time()
        assert process.wait(timeout=10) == -signal.SIGKILL
    finally:
        process.kill()
    assert process.stderr.read().startswith("tui-chat: saving as conversation 1")
    with History(history_path()) as history:
        assert history._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        reply = history.load(1).path[1]
        state, updated_at = history._db.execute(
            "SELECT state, updated_at FROM messages WHERE id = ?", (reply.id,)).fetchone()
    assert len(seen) >= 2000
    assert reply.content.startswith(seen) and len(reply.content) > len(seen)
    assert state == "streaming" and reply.state == "interrupted"
    assert killed_at - updated_at < 1.0


def test_export_and_import_round_trip(db, tmp_path):
    with History(db) as history:
        conversation, (question, answer, *_) = two_turns(history)
        fork = history.start_reply(conversation, question, text="Par", fork_of=answer, fork_token=1)
        fork.finish("Paris!", "eos")
        history.set_active(answer)
        exported = to_json(history.load(conversation))
        copy = history.add_conversation(from_json(json.loads(json.dumps(exported))))
        again = to_json(history.load(copy))
    assert copy != conversation

    def without_ids(data: dict) -> dict:
        position = {m["id"]: i for i, m in enumerate(data["messages"])}
        messages = [
            m | {"id": position[m["id"]], "parent_id": position.get(m["parent_id"]),
                 "fork_of": position.get(m["fork_of"])}
            for m in data["messages"]
        ]
        return data | {"id": None, "messages": messages}

    assert without_ids(again) == without_ids(exported)
    assert [m["active"] for m in exported["messages"]] == [True, True, True, True, False]
    assert exported["messages"][4]["fork_token"] == 1
    assert exported["messages"][1]["metrics"]["cost_usd"] == "0.0000812"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("format"), "not a tui-chat conversation export"),
        (lambda d: d.update(version=2), "export version 2 is not one this tui-chat reads"),
        (lambda d: d["messages"][1].update(parent_id=99), r"messages\[1\]: ids must be unique"),
        (lambda d: d["messages"][0].update(role="robot"), r"messages\[0\]: unknown role 'robot'"),
        (lambda d: d["messages"][0].update(content=5), r"messages\[0\]: 'content' must be str"),
        (lambda d: d.update(created_at="yesterday"), "'created_at' must be an ISO 8601 time"),
        (lambda d: d["sampling"].update(temperature=9), "temperature must be between 0 and 2"),
    ],
)
def test_a_damaged_export_is_a_one_line_error(db, change, message):
    with History(db) as history:
        conversation, _ = two_turns(history)
        data = to_json(history.load(conversation))
    change(data)
    with pytest.raises(HistoryError, match=message):
        from_json(data)


def test_markdown_export_reads_like_the_chat(db):
    with History(db) as history:
        conversation, (question, answer, *_) = two_turns(history)
        history.start_reply(conversation, question, fork_of=answer, fork_token=0).fail("out of memory")
        text = to_markdown(history.load(conversation))
    assert text.startswith("# What is the capital of France?\n")
    assert "- Model: tiny" in text and "temperature 0.3" in text
    assert "## System prompt\n\nBe brief.\n" in text
    assert "## User\n\nWhat is the capital of France?\nAnswer in one word.\n" in text
    assert "## Assistant (branch 2 of 2) (error)\n\n*(empty)*\n\n*Error: out of memory*" in text


def test_closing_the_history_ends_its_writer_thread(db):
    with History(db) as history:
        conversation = history.create()
        reply = history.start_reply(conversation, history.add_user_message(conversation, "Count", None))
        time.sleep(FLUSH_INTERVAL_S)
        reply.append("one")
        writer = history.later._thread
        assert writer is not None
    writer.join(timeout=2)
    assert not writer.is_alive()
