"""`tui-chat history`, `export` and `import`: the saved conversations from the command line."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

from .export import from_json, to_json, to_markdown
from .history import History, HistoryError, model_label
from .safetext import terminal_safe


def list_conversations(history: History, search: str | None) -> int:
    rows = history.conversations(search)
    if not rows:
        print(f"no conversation mentions {search!r}" if search else "no saved conversations yet")
        return 0
    clean = terminal_safe if sys.stdout.isatty() else (lambda text: text)
    print(f"{'ID':>5}  {'UPDATED':<16}  {'MSGS':>4}  {'MODEL':<24}  TITLE")
    for row in rows:
        updated = datetime.fromtimestamp(row.updated_at).strftime("%Y-%m-%d %H:%M")
        model = model_label(row.model)
        model = model if len(model) <= 24 else model[:23] + "…"
        print(clean(f"{row.id:>5}  {updated:<16}  {row.messages:>4}  {model:<24}  {row.title or '(untitled)'}"))
    return 0


def export_conversation(history: History, conversation_id: int, form: str, output: Path | None) -> int:
    conversation = history.load(conversation_id)
    text = json.dumps(to_json(conversation), indent=2, ensure_ascii=False) + "\n" if form == "json" \
        else to_markdown(conversation)
    if output is None:
        sys.stdout.write(terminal_safe(text) if sys.stdout.isatty() else text)
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
