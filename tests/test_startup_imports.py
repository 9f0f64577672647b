"""`tui-chat --help` and `--version` answer at once (within 150 ms of a bare `python -c pass`, benchmarks/startup.py):
bounded here by what they import, not by a clock. Neither loads a heavy library nor importlib.metadata, which
loads the email package to read a version that the installed package's folder name already gives."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest

from tui_chat.commands.info import package_version

NOT_AT_START = ("textual", "llama_cpp", "numpy", "huggingface_hub", "jinja2", "email", "importlib.metadata",
                "tui_chat.guard")


def loaded_after(argv: list[str]) -> list[str]:
    """The modules a fresh interpreter holds once the command line has answered `argv`."""
    script = ("import json, sys\nfrom tui_chat.cli import main\n"
              f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
              "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stderr.splitlines()[-1])


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_load_no_heavy_library(flag):
    loaded = loaded_after([flag])
    assert [name for name in loaded for heavy in NOT_AT_START
            if name == heavy or name.startswith(f"{heavy}.")] == []


@pytest.mark.parametrize("name", ["tui-chat", "llama-cpp-python", "textual", "markdown-it-py", "PyYAML"])
def test_a_version_read_from_its_folder_is_the_installed_one(name):
    assert package_version(name) == metadata.version(name)


def test_a_package_not_installed_says_so():
    assert package_version("no-such-package-here") == "not installed"
