"""Every conversation in one SQLite file, safe against crashes and a second running instance.

WAL lets readers and one writer work at once; each write is one short `BEGIN IMMEDIATE` transaction,
so a second process waits its turn (busy_timeout, then a few retries) instead of failing. A reply is
written while it streams, at most FLUSH_INTERVAL_S behind, so a crash loses under a second of text.

Messages form a tree: a regenerated reply or a token-inspector continuation is a sibling of the
reply it replaces (same parent). Among siblings the one chosen last is on the active path.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from .engine.base import StopReason, ToolCall, TurnMetrics
from .engine.formats import TEXT, OutputFormat, from_dict
from .engine.params import InvalidParameter, SamplingParams

BUSY_TIMEOUT_S = 5.0
WRITE_ATTEMPTS = 4
FLUSH_INTERVAL_S = 0.5
TITLE_LENGTH = 60

State = Literal["streaming", "complete", "stopped", "error", "interrupted"]
STATES: tuple[str, ...] = ("streaming", "complete", "stopped", "error", "interrupted")

# MIGRATIONS[i] takes a database from schema version i to i + 1 (PRAGMA user_version).
# Append new steps; never edit a released one.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            system_prompt TEXT NOT NULL DEFAULT '',
            sampling TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        f"""CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL CHECK (state IN ({", ".join(repr(s) for s in STATES)})),
            stop_reason TEXT,
            error TEXT,
            metrics TEXT NOT NULL DEFAULT '{{}}',
            fork_of INTEGER REFERENCES messages(id) ON DELETE SET NULL,
            fork_token INTEGER,
            chosen INTEGER NOT NULL DEFAULT 0,
            writer TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX messages_by_conversation ON messages(conversation_id, parent_id)",
        "CREATE INDEX conversations_by_update ON conversations(updated_at)",
    ),
    # 2: each conversation's output format (formats.py), `{}` for free text
    ("ALTER TABLE conversations ADD COLUMN output_format TEXT NOT NULL DEFAULT '{}'",),
    (  # 3, reasoning models: a reply's thinking apart from its answer; each chat's thinking switch
        "ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE conversations ADD COLUMN thinking INTEGER NOT NULL DEFAULT 1",
    ),
    # 4, tools: the calls a reply made before its answer (ToolCall.as_dict each)
    ("ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]'",),
    # 5: each conversation's tools (ToolSwitches.as_dict), `{}` for none
    ("ALTER TABLE conversations ADD COLUMN tools TEXT NOT NULL DEFAULT '{}'",),
    (  # 6: the model that wrote each reply (a chat may use several); an older reply's is its chat's last one
        "ALTER TABLE messages ADD COLUMN model TEXT NOT NULL DEFAULT ''",
        "UPDATE messages SET model = (SELECT model FROM conversations c WHERE c.id = messages.conversation_id)"
        " WHERE role = 'assistant'",
    ),
]


class HistoryError(Exception):
    """The history database cannot do what was asked; the message is one user-facing line."""


@dataclass(frozen=True, slots=True)
class ToolSwitches:
    """A chat's tools as the user set them (F9): those on, as (server, tool) names, and how the model may call
    them (auto, none, required or a tool's name). Kept with the chat; its servers start again when it reopens."""

    on: tuple[tuple[str, str], ...] = ()
    choice: str = "auto"

    def as_dict(self) -> dict[str, Any]:
        """`{}` for the defaults; a choice made with no tool on is kept too (F9 opens on it again)."""
        if not self.on and self.choice == "auto":
            return {}
        return {"on": [list(pair) for pair in self.on], "choice": self.choice}


def tool_switches_from(saved: Any) -> ToolSwitches:
    """Stored or imported tool switches (`{}` or none: no tools), checked as untrusted."""
    if not saved:
        return ToolSwitches()
    on, choice = saved.get("on") if isinstance(saved, dict) else None, saved.get("choice", "auto")
    if (not isinstance(on, list) or not isinstance(choice, str)
            or not all(isinstance(pair, list) and len(pair) == 2 and all(isinstance(n, str) for n in pair)
                       for pair in on)):
        raise HistoryError("tools: needs 'on', a list of [server, tool] names, and 'choice', a string")
    return ToolSwitches(tuple((server, tool) for server, tool in on), choice)


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    id: int
    title: str
    model: str
    messages: int  # on the active path: those the chat shows when it opens
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    parent_id: int | None
    role: Literal["user", "assistant"]
    content: str
    state: State
    created_at: float
    updated_at: float
    stop_reason: StopReason | None = None
    error: str | None = None
    metrics: dict[str, Any] | None = None
    fork_of: int | None = None  # the reply this one branched from ...
    fork_token: int | None = None  # ... at this generated-token index
    reasoning: str = ""  # a reply's thinking, before its answer (`content`)
    tool_calls: tuple[ToolCall, ...] = ()  # the tools a reply called before its answer, in order
    model: str = ""  # what opens the model that wrote a reply again ("" for a user's message)


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    title: str
    model: str
    system_prompt: str
    sampling: SamplingParams
    created_at: float
    updated_at: float
    messages: tuple[StoredMessage, ...]  # every branch, oldest first
    path: tuple[StoredMessage, ...]  # the active branch from the first message to the last
    output_format: OutputFormat = TEXT
    thinking: bool = True  # the chat's thinking switch
    tools: ToolSwitches = ToolSwitches()
    _children: dict[int | None, tuple[StoredMessage, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        children: dict[int | None, list[StoredMessage]] = {}
        for message in self.messages:
            children.setdefault(message.parent_id, []).append(message)
        object.__setattr__(self, "_children", {parent: tuple(group) for parent, group in children.items()})

    def siblings(self, message: StoredMessage) -> tuple[StoredMessage, ...]:
        """`message` and its alternatives (regenerations, forks), oldest first."""
        return self._children.get(message.parent_id, ())

    @property
    def last_id(self) -> int | None:
        """The parent for the next message on the active path."""
        return self.path[-1].id if self.path else None


# Each chat's messages on its active path (`active_path` in SQL): among siblings the one ranked highest (the
# newest on a tie), walked down from the first message; edits, regenerations and forks off the path not counted.
_PATH_LENGTHS = """WITH RECURSIVE
    chosen(id, parent_id, conversation_id) AS (
        SELECT m.id, m.parent_id, m.conversation_id FROM messages m WHERE NOT EXISTS (
            SELECT 1 FROM messages o WHERE o.conversation_id = m.conversation_id AND o.parent_id IS m.parent_id
            AND (o.chosen > m.chosen OR (o.chosen = m.chosen AND o.id > m.id)))),
    path(id, conversation_id) AS (
        SELECT id, conversation_id FROM chosen WHERE parent_id IS NULL
        UNION ALL SELECT chosen.id, chosen.conversation_id FROM chosen JOIN path ON chosen.parent_id = path.id),
    path_lengths(conversation_id, messages) AS (SELECT conversation_id, count(*) FROM path GROUP BY conversation_id)
"""


def active_path(messages: tuple[StoredMessage, ...], rank: dict[int, int]) -> tuple[StoredMessage, ...]:
    """Walk from the root, taking at each step the child ranked highest (the newest on a tie)."""
    children: dict[int | None, list[StoredMessage]] = {}
    for message in messages:
        children.setdefault(message.parent_id, []).append(message)
    path: list[StoredMessage] = []
    parent: int | None = None
    while children.get(parent):
        chosen = max(children[parent], key=lambda m: (rank.get(m.id, 0), m.id))
        path.append(chosen)
        parent = chosen.id
    return tuple(path)


def model_label(model: str) -> str:
    """A chat's model as a list shows it: a file path as its file's stem, a name or `@server` as it is."""
    return Path(model).stem if model.lower().endswith(".gguf") else model


def title_from(text: str) -> str:
    """The first line of the first message, cut to fit a list row."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"


def sampling_from(settings: Any) -> SamplingParams:
    """Stored or imported settings, validated like the config's."""
    if not isinstance(settings, dict):
        raise HistoryError("sampling settings must be a table of name: value")
    try:
        return SamplingParams().with_changes(**settings)
    except (TypeError, InvalidParameter) as error:
        raise HistoryError(f"sampling settings: {error}") from None


def output_format_from(saved: Any) -> OutputFormat:
    """A stored or imported output format (`{}` or none: free text), checked again like the settings."""
    if not saved:
        return TEXT
    try:
        return from_dict(saved)
    except InvalidParameter as error:
        raise HistoryError(f"output format: {error}") from None


def _format_record(output: OutputFormat) -> str:
    return json.dumps(output.as_dict() if output.constrained else {})


_WRITER = f"{socket.gethostname()}:{os.getpid()}"


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just added (typeshed allows None: a cursor that inserted nothing)."""
    assert cursor.lastrowid is not None, "called after an INSERT"
    return cursor.lastrowid


def _writer_gone(writer: str | None) -> bool:
    """True when the process that was streaming a reply on this machine no longer exists."""
    host, _, pid = (writer or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _cannot_open(path: Path, error: Exception) -> HistoryError:
    """SQLite says only "unable to open database file" where its folder takes no writes: say that too."""
    reason = str(error)
    if path.parent.is_dir() and not os.access(path.parent, os.W_OK):
        reason = f"{path.parent} is read-only ({reason})"
    return HistoryError(f"cannot open the history {path}: {reason}")


class History:
    """One connection to the history database; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as error:
            raise _cannot_open(path, error) from None
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")  # with WAL: a killed process loses no commit
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.Error as error:
            self._db.close()
            raise _cannot_open(path, error) from None
        except HistoryError:
            self._db.close()
            raise
        self.later = LaterWrites(self)

    def close(self) -> None:
        try:
            self.later.close()
        except HistoryError:
            pass  # said already, or about to be lost with the chat that is closing
        with self._lock:
            self._db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- transactions -------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, begin: str = "BEGIN IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """One short transaction; a writer waits for another process's write instead of failing."""
        with self._lock:
            for attempt in range(WRITE_ATTEMPTS):
                try:
                    self._db.execute(begin)
                    break
                except sqlite3.OperationalError as error:
                    if "locked" not in str(error) and "busy" not in str(error) or attempt == WRITE_ATTEMPTS - 1:
                        raise HistoryError(f"the history {self.path} is busy: {error}") from None
                    time.sleep(0.05 * (attempt + 1))
            try:
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.Error as error:
                self._rollback()
                raise HistoryError(f"the history {self.path} failed: {error}") from None
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        """Undo the failed transaction, unless SQLite already has (it does after a full disk or an I/O error)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _read(self) -> Any:
        """A consistent snapshot across several SELECTs."""
        return self._transaction("BEGIN")

    def _migrate(self) -> None:
        with self._transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise HistoryError(
                    f"the history {self.path} is schema version {version}, newer than this tui-chat "
                    f"understands ({len(MIGRATIONS)}): upgrade tui-chat"
                )
            for step in MIGRATIONS[version:]:
                for statement in step:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")

    # --- conversations ------------------------------------------------------------------------

    def create(
        self, *, model: str = "", system_prompt: str = "", sampling: SamplingParams | None = None, title: str = "",
        output_format: OutputFormat = TEXT,
        thinking: bool = True,
        tools: ToolSwitches = ToolSwitches(),
    ) -> int:
        now = time.time()
        with self._transaction() as db:
            return _row_id(db.execute(
                "INSERT INTO conversations (title, model, system_prompt, sampling, output_format, thinking, tools,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (title, model, system_prompt, json.dumps((sampling or SamplingParams()).as_dict()),
                 _format_record(output_format), int(thinking), json.dumps(tools.as_dict()), now, now),
            ))

    def update(
        self,
        conversation_id: int,
        *,
        title: str | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        sampling: SamplingParams | None = None,
        output_format: OutputFormat | None = None,
        thinking: bool | None = None,
        tools: ToolSwitches | None = None,
    ) -> None:
        """Rename, or change the model, system prompt, settings, output format or tools the next reply will use."""
        changes: dict[str, Any] = {}
        if title is not None:
            if not title.strip():
                raise HistoryError("a title cannot be empty")
            changes["title"] = title.strip()
        if model is not None:
            changes["model"] = model
        if system_prompt is not None:
            changes["system_prompt"] = system_prompt
        if sampling is not None:
            changes["sampling"] = json.dumps(sampling.as_dict())
        if output_format is not None:
            changes["output_format"] = _format_record(output_format)
        if thinking is not None:
            changes["thinking"] = int(thinking)
        if tools is not None:
            changes["tools"] = json.dumps(tools.as_dict())
        changes["updated_at"] = time.time()
        with self._transaction() as db:
            self._require(db, conversation_id)
            db.execute(
                f"UPDATE conversations SET {', '.join(f'{k} = ?' for k in changes)} WHERE id = ?",
                (*changes.values(), conversation_id),
            )

    def delete(self, conversation_id: int) -> None:
        with self._transaction() as db:
            self._require(db, conversation_id)
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def delete_message(self, message_id: int) -> None:
        """A turn the user took back before any reply came: the message and everything below it."""
        with self._transaction() as db:
            db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def conversations(self, search: str | None = None) -> list[ConversationSummary]:
        """Conversations, most recently updated first; `search` matches titles and message text
        (case-insensitive substring; LIKE, since a personal history is small enough to scan)."""
        query = (
            f"{_PATH_LENGTHS} SELECT c.id, c.title, c.model, coalesce(shown.messages, 0), c.created_at, c.updated_at"
            " FROM conversations c LEFT JOIN path_lengths shown ON shown.conversation_id = c.id"
        )
        args: tuple[str, ...] = ()
        if search:
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            query += (
                " WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
                " WHERE m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\')"
            )
            args = (pattern, pattern)
        with self._read() as db:
            rows = db.execute(query + " ORDER BY c.updated_at DESC, c.id DESC", args).fetchall()
        return [ConversationSummary(*row) for row in rows]

    def load(self, conversation_id: int) -> Conversation:
        with self._read() as db:
            head = self._require(db, conversation_id)
            rows = db.execute(
                "SELECT id, parent_id, role, content, state, created_at, updated_at, stop_reason, error, metrics,"
                " fork_of, fork_token, chosen, writer, reasoning, tool_calls, model FROM messages"
                " WHERE conversation_id = ?"
                " ORDER BY id",
                (conversation_id,),
            ).fetchall()
        messages = tuple(_stored(row) for row in rows)
        rank = {row[0]: row[12] for row in rows}
        title, model, system_prompt, sampling, created_at, updated_at, output_format, thinking, tools = head
        return Conversation(
            conversation_id, title, model, system_prompt, sampling_from(json.loads(sampling)), created_at, updated_at,
            messages, active_path(messages, rank), output_format_from(json.loads(output_format)), bool(thinking),
            tool_switches_from(json.loads(tools)),
        )

    def add_conversation(self, conversation: Conversation) -> int:
        """Store a whole conversation (an import) under new ids, keeping its branches and active path."""
        on_path = {m.id for m in conversation.path}
        with self._transaction() as db:
            new_id = _row_id(db.execute(
                "INSERT INTO conversations (title, model, system_prompt, sampling, output_format, thinking, tools,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation.title, conversation.model, conversation.system_prompt,
                 json.dumps(conversation.sampling.as_dict()), _format_record(conversation.output_format),
                 int(conversation.thinking), json.dumps(conversation.tools.as_dict()), conversation.created_at,
                 conversation.updated_at),
            ))
            ids: dict[int | None, int] = {}  # a parent or fork of None looks up None
            for m in conversation.messages:
                ids[m.id] = _row_id(db.execute(
                    "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, state, stop_reason,"
                    " error, metrics, fork_of, fork_token, chosen, created_at, updated_at, tool_calls, model)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (new_id, ids.get(m.parent_id), m.role, m.content, m.reasoning,
                     "interrupted" if m.state == "streaming" else m.state, m.stop_reason, m.error,
                     json.dumps(m.metrics or {}), ids.get(m.fork_of), m.fork_token, int(m.id in on_path),
                     m.created_at, m.updated_at, _calls_record(m.tool_calls), m.model),
                ))
        return new_id

    # --- messages -----------------------------------------------------------------------------

    def add_user_message(self, conversation_id: int, text: str, parent_id: int | None) -> int:
        """A user turn after `parent_id` (None: the first message); it becomes the active branch.
        The conversation's first message also names it, unless it already has a title."""
        with self._transaction() as db:
            self._require(db, conversation_id)
            message_id = self._insert(db, conversation_id, parent_id, "user", text, "complete")
            db.execute(
                "UPDATE conversations SET title = CASE WHEN title = '' THEN ? ELSE title END, updated_at = ?"
                " WHERE id = ?",
                (title_from(text), time.time(), conversation_id),
            )
        return message_id

    def start_reply(
        self, conversation_id: int, parent_id: int, *, text: str = "", fork_of: int | None = None,
        fork_token: int | None = None, model: str = "",
    ) -> ReplyWriter:
        """An assistant reply to `parent_id` by `model`, stored now and kept up to date as it streams.
        A fork carries the reply it branched from, the token index where it diverged and the text before it."""
        with self._transaction() as db:
            self._require(db, conversation_id)
            message_id = self._insert(db, conversation_id, parent_id, "assistant", text, "streaming",
                                      fork_of, fork_token, model)
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conversation_id))
        return ReplyWriter(self, conversation_id, message_id, text)

    def set_active(self, message_id: int) -> None:
        """Put `message_id` (and the branch below it, as last chosen) on the active path."""
        with self._transaction() as db:
            row = db.execute("SELECT conversation_id, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no message {message_id}")
            db.execute("UPDATE messages SET chosen = ? WHERE id = ?", (self._next_rank(db, *row), message_id))

    def _insert(
        self, db: sqlite3.Connection, conversation_id: int, parent_id: int | None, role: str, text: str, state: str,
        fork_of: int | None = None, fork_token: int | None = None, model: str = "",
    ) -> int:
        if parent_id is not None:
            owner = db.execute("SELECT conversation_id FROM messages WHERE id = ?", (parent_id,)).fetchone()
            if owner is None or owner[0] != conversation_id:
                raise HistoryError(f"message {parent_id} is not in conversation {conversation_id}")
        now = time.time()
        return _row_id(db.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, state, fork_of, fork_token, chosen,"
            " writer, created_at, updated_at, model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, parent_id, role, text, state, fork_of, fork_token,
             self._next_rank(db, conversation_id, parent_id), _WRITER if state == "streaming" else None, now, now,
             model),
        ))

    @staticmethod
    def _next_rank(db: sqlite3.Connection, conversation_id: int, parent_id: int | None) -> int:
        top: int
        (top,) = db.execute(
            "SELECT coalesce(max(chosen), 0) FROM messages WHERE conversation_id = ? AND parent_id IS ?",
            (conversation_id, parent_id),
        ).fetchone()
        return top + 1

    @staticmethod
    def _require(db: sqlite3.Connection, conversation_id: int) -> tuple[Any, ...]:
        row: tuple[Any, ...] | None = db.execute(
            "SELECT title, model, system_prompt, sampling, created_at, updated_at, output_format, thinking, tools"
            " FROM conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        if row is None:
            raise HistoryError(f"no conversation {conversation_id}")
        return row

    def _write_reply(self, message_id: int, text: str, reasoning: str, **fields: Any) -> None:
        now = time.time()
        columns = {"content": text, "reasoning": reasoning, "updated_at": now, **fields}
        with self._transaction() as db:
            db.execute(
                f"UPDATE messages SET {', '.join(f'{k} = ?' for k in columns)} WHERE id = ?",
                (*columns.values(), message_id),
            )
            if "state" in fields:
                db.execute(
                    "UPDATE conversations SET updated_at = ? WHERE id = (SELECT conversation_id FROM messages"
                    " WHERE id = ?)",
                    (now, message_id),
                )


def _stored(row: tuple[Any, ...]) -> StoredMessage:
    (message_id, parent_id, role, content, state, created_at, updated_at, stop_reason, error, metrics,
     fork_of, fork_token, _chosen, writer, reasoning, tool_calls, model) = row
    if state == "streaming" and _writer_gone(writer):
        state = "interrupted"
    return StoredMessage(message_id, parent_id, role, content, state, created_at, updated_at, stop_reason, error,
                         json.loads(metrics) or None, fork_of, fork_token, reasoning,
                         tool_calls_from(json.loads(tool_calls), f"message {message_id}"), model)


def _calls_record(calls: tuple[ToolCall, ...] | list[ToolCall]) -> str:
    return json.dumps([call.as_dict() for call in calls], ensure_ascii=False)


_CALL_FIELDS: dict[str, tuple[type, ...]] = {
    "server": (str,), "name": (str,), "arguments": (dict,), "approved": (bool,), "result": (str, type(None)),
    "error": (str, type(None)), "ms": (int, float, type(None)), "cut": (int,)}
_CALL_TEXTS = ("before", "reasoning")  # stored since the step's text was kept: older records lack them


def tool_calls_from(records: Any, where: str) -> tuple[ToolCall, ...]:
    """A reply's calls as stored or exported (`ToolCall.as_dict` each); raises HistoryError naming what is wrong
    (an edited file)."""
    if not isinstance(records, list):
        raise HistoryError(f"{where}: 'tool_calls' must be a list")
    calls = []
    for index, record in enumerate(records):
        wrong = next((name for name, kinds in _CALL_FIELDS.items() if not isinstance(record, dict)
                      or not isinstance(record.get(name), kinds)
                      or (isinstance(record.get(name), bool) and bool not in kinds)), None)
        wrong = wrong or next((name for name in _CALL_TEXTS if not isinstance(record.get(name, ""), str)), None)
        if wrong is not None:
            raise HistoryError(f"{where}: tool_calls[{index}] needs {wrong!r} of the right type")
        calls.append(ToolCall(**{name: record[name] for name in _CALL_FIELDS},
                              **{name: record.get(name, "") for name in _CALL_TEXTS}))
    return tuple(calls)


def metrics_record(metrics: TurnMetrics | None, cost: Decimal | None) -> dict[str, Any]:
    """A reply's figures as stored and exported: money as an exact decimal string."""
    record: dict[str, Any] = metrics.as_dict() if metrics is not None else {}
    if cost is not None:
        record["cost_usd"] = str(cost)
    return record


class LaterWrites:
    """A streaming reply's periodic writes, off the caller's thread (the UI's event loop must not wait for
    SQLite, nor for another process holding the write lock). Only each reply's newest text is written;
    `settle` waits for what is queued and raises the error a write met, so the caller says it once."""

    def __init__(self, history: History) -> None:
        self._history = history
        self._changed = threading.Condition()
        self._queued: dict[int, tuple[str, str]] = {}
        self._writing = False
        self._error: HistoryError | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    def submit(self, message_id: int, text: str, reasoning: str) -> None:
        with self._changed:
            self._queued[message_id] = (text, reasoning)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def check(self) -> None:
        """Raise the error a write met since the last check, without waiting."""
        with self._changed:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def settle(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: not self._queued and not self._writing)
        self.check()

    def close(self) -> None:
        """Write what is queued, then let the thread end (a process opens many histories: the tests do)."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self.settle()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queued or self._closing)
                if not self._queued:
                    return
                message_id, (text, reasoning) = self._queued.popitem()
                self._writing = True
            try:
                self._history._write_reply(message_id, text, reasoning)
            except HistoryError as error:
                self._error = error
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()


class ReplyWriter:
    """A reply being generated, its thinking and its answer. `append` is cheap per token; the text reaches the
    database at most FLUSH_INTERVAL_S after it arrived (written by `History.later`), and at once on `finish`
    or `fail`, after what was queued."""

    def __init__(self, history: History, conversation_id: int, message_id: int, text: str) -> None:
        self.history = history
        self.conversation_id = conversation_id
        self.id = message_id
        self.text = text
        self.reasoning = ""
        self._saved = (text, "")
        self._saved_at = time.monotonic()

    def append(self, text: str, reasoning: str = "") -> None:
        self.text += text
        self.reasoning += reasoning
        self.history.later.check()
        if time.monotonic() - self._saved_at >= FLUSH_INTERVAL_S and (self.text, self.reasoning) != self._saved:
            self.history.later.submit(self.id, self.text, self.reasoning)
            self._saved = (self.text, self.reasoning)
            self._saved_at = time.monotonic()

    def save_calls(self, tool_calls: tuple[ToolCall, ...]) -> None:
        """The reply's calls as they stand (one asked, running, done), with the text so far: a reply the app
        never finished reopens with the call it was waiting on."""
        self.history.later.settle()
        self.history._write_reply(self.id, self.text, self.reasoning, tool_calls=_calls_record(tool_calls))
        self._saved, self._saved_at = (self.text, self.reasoning), time.monotonic()

    def finish(
        self, text: str, stop_reason: StopReason, metrics: TurnMetrics | None = None, cost: Decimal | None = None,
        incomplete: bool = False,
        reasoning: str = "",
        stop_sequence: str = "",
        tool_calls: tuple[ToolCall, ...] = (),
    ) -> None:
        """The final text and thinking (the engine's, which may differ from the streamed pieces), how it ended
        and its figures, and the tools it called. `incomplete`: it stopped before its output format was complete;
        `stop_sequence`: the one it ended on (both kept with the figures)."""
        self.text, self.reasoning = text, reasoning
        record = (metrics_record(metrics, cost) | ({"incomplete": True} if incomplete else {})
                  | ({"stop_sequence": stop_sequence} if stop_sequence else {}))
        self.history.later.settle()
        self.history._write_reply(
            self.id, text, reasoning, state="stopped" if stop_reason in ("cancelled", "cut") else "complete",
            stop_reason=stop_reason, metrics=json.dumps(record), writer=None, tool_calls=_calls_record(tool_calls),
        )
        self._saved = (text, reasoning)

    def fail(self, message: str) -> None:
        """The engine gave up: what arrived stays, with the reason."""
        self.history.later.settle()
        self.history._write_reply(self.id, self.text, self.reasoning, state="error", error=message, writer=None)
        self._saved = (self.text, self.reasoning)
