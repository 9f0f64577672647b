"""`tui-chat history`, `export` and `import`: the saved conversations from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import Config, history_path
from ..export import from_json, to_json, to_markdown
from ..history import History, HistoryError, model_label
from ..units import local_time
from .common import print_table, writer


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = commands.add_parser("history", description="List saved conversations, most recent first.")
    listing.add_argument("--search", metavar="TEXT", help="only conversations whose title or messages contain TEXT")
    listing.set_defaults(run=run_history)
    export = commands.add_parser(
        "export", description="Write a saved conversation as Markdown (to read) or JSON (to import).")
    export.add_argument("id", type=int, help="the conversation's ID (see tui-chat history)")
    export.add_argument("--format", choices=("md", "json"), default="md",
                        help="md to read, json to import (default md)")
    export.add_argument("--output", "-o", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    export.set_defaults(run=run_export)
    imports = commands.add_parser(
        "import", description="Add a conversation from a JSON export to the history, under a new ID.")
    imports.add_argument("file", type=Path, help="a file written by tui-chat export --format json")
    imports.set_defaults(run=run_import)


def run_history(args: argparse.Namespace, _config: Config) -> int:
    with History(history_path()) as history:
        return list_conversations(history, args.search)


def run_export(args: argparse.Namespace, _config: Config) -> int:
    with History(history_path()) as history:
        return export_conversation(history, args.id, args.format, args.output)


def run_import(args: argparse.Namespace, _config: Config) -> int:
    with History(history_path()) as history:
        return import_conversation(history, args.file)


def list_conversations(history: History, search: str | None) -> int:
    rows = history.conversations(search)
    if not rows:
        print(f"no conversation mentions {search!r}" if search else "no saved conversations yet")
        return 0
    table = [("ID", "UPDATED", "MSGS", "MODEL", "TITLE")]
    for row in rows:
        model = model_label(row.model)
        model = model if len(model) <= 24 else model[:23] + "…"
        table.append((str(row.id), local_time(row.updated_at), str(row.messages), model, row.title or "(untitled)"))
    print_table(table, right=(0, 2))
    return 0


def export_conversation(history: History, conversation_id: int, form: str, output: Path | None) -> int:
    conversation = history.load(conversation_id)
    text = json.dumps(to_json(conversation), indent=2, ensure_ascii=False) + "\n" if form == "json" \
        else to_markdown(conversation)
    if output is None:
        writer(sys.stdout)(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        raise HistoryError(f"cannot write {output}: {error.strerror or error}") from None
    print(f"wrote conversation {conversation_id} to {output}", file=sys.stderr)
    return 0


def import_conversation(history: History, source: Path) -> int:
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise HistoryError(f"cannot read {source}: {getattr(error, 'strerror', None) or error}") from None
    except json.JSONDecodeError as error:
        raise HistoryError(f"{source} is not JSON: {error}") from None
    new_id = history.add_conversation(from_json(data))
    print(f"imported {source} as conversation {new_id}")
    return 0
