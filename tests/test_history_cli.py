"""`tui-chat run --save`, `history`, `export` and `import` as real processes on a real history file."""

from __future__ import annotations

import json
from decimal import Decimal

from conftest import run_cli as run
from tui_chat.config import history_path
from tui_chat.history import History
from tui_chat.pricing import PRESETS, turn_cost


def save(tiny_model, *prompts: str, system: str | None = None):
    args = ["run", "--save", "-m", str(tiny_model), "--temperature", "0", "--max-tokens", "12"]
    args += [part for prompt in prompts for part in ("-p", prompt)]
    if system is not None:
        args += ["--system", system]
    result = run(*args)
    assert result.returncode == 0, result.stderr
    return result


def test_run_save_stores_the_conversation_with_its_settings_and_figures(tiny_model):
    result = save(tiny_model, "Hello there", "And then?", system="Be brief.")
    assert result.stderr == "tui-chat: saving as conversation 1\n"
    with History(history_path()) as history:
        conversation = history.load(1)
    assert conversation.title == "Hello there" and conversation.model == str(tiny_model)  # what opens it again
    assert conversation.system_prompt == "Be brief."
    assert conversation.sampling.temperature == 0 and conversation.sampling.max_tokens == 12
    user, reply, follow_up, last = conversation.path
    assert (user.content, follow_up.content) == ("Hello there", "And then?")
    assert result.stdout.split("\n\n")[0] == reply.content.strip()
    assert reply.state == "complete" and reply.stop_reason == "length"
    assert reply.metrics["completion_tokens"] == 12 and reply.metrics["ttft_s"] > 0
    gpt_4o = turn_cost(PRESETS["GPT-4o"], reply.metrics["prompt_tokens"], 0, 12).total
    assert Decimal(reply.metrics["cost_usd"]) == gpt_4o > 0
    assert last.metrics["cached_tokens"] > 0


def test_the_configured_system_prompt_starts_new_conversations(tiny_model, isolated_dirs):
    config = isolated_dirs / "config" / "tui-chat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('system_prompt = "You answer in haiku."\n')
    save(tiny_model, "Hello")
    save(tiny_model, "Hello", system="")
    with History(history_path()) as history:
        assert history.load(1).system_prompt == "You answer in haiku."
        assert history.load(2).system_prompt == ""
    config.write_text("system_prompt = 3\n")
    broken = run("history")
    assert broken.returncode == 2 and "system_prompt must be text" in broken.stderr


def test_history_lists_most_recent_first_and_searches(tiny_model):
    save(tiny_model, "Capital of France?")
    save(tiny_model, "Tell me about llamas")
    listing = run("history")
    assert listing.returncode == 0
    header, newest, oldest = listing.stdout.splitlines()
    assert header.split() == ["ID", "UPDATED", "MSGS", "MODEL", "TITLE"]
    assert newest.split()[0] == "2" and newest.endswith("Tell me about llamas")
    assert oldest.split()[0] == "1" and oldest.split()[3] == "2" and "tiny" in oldest
    found = run("history", "--search", "FRANCE")
    assert [line.split()[0] for line in found.stdout.splitlines()[1:]] == ["1"]
    assert run("history", "--search", "zebra").stdout == "no conversation mentions 'zebra'\n"


def test_export_markdown_and_json_then_import(tiny_model, tmp_path):
    save(tiny_model, "Hello there", system="Be brief.")
    markdown = run("export", "1")
    assert markdown.returncode == 0
    assert markdown.stdout.startswith("# Hello there\n") and "## System prompt\n\nBe brief." in markdown.stdout
    assert "· max tokens · $0.000" in markdown.stdout, "the stop reason and the cost as the app shows them"
    target = tmp_path / "chat.json"
    written = run("export", "1", "--format", "json", "-o", str(target))
    assert written.returncode == 0 and written.stderr == f"wrote conversation 1 to {target}\n"
    exported = json.loads(target.read_text())
    assert exported["messages"][1]["metrics"]["completion_tokens"] == 12
    imported = run("import", str(target))
    assert imported.returncode == 0 and imported.stdout == f"imported {target} as conversation 2\n"
    again = json.loads(run("export", "2", "--format", "json").stdout)
    assert again["messages"][1]["content"] == exported["messages"][1]["content"]
    assert again["title"] == "Hello there" and again["id"] == 2


def test_history_commands_fail_in_one_line(tmp_path):
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello")
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"format": "something else"}')
    cases = [
        (("export", "7"), "no conversation 7"),
        (("export", "seven"), "argument id: invalid int value: 'seven'"),
        (("export", "1", "--format", "pdf"), "invalid choice: 'pdf'"),
        (("import", str(tmp_path / "missing.json")), "cannot read"),
        (("import", str(not_json)), "is not JSON"),
        (("import", str(wrong)), "not a tui-chat conversation export"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.returncode == 2, args
        assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr
