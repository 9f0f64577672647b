"""The test suite's own set-up leaves nothing behind on the machine it runs on (issue 44 item 15: one
`tui-chat-hf-home-*` directory in the system's temp dir per run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_importing_the_suites_conftest_leaves_no_temp_dir(tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    tests = Path(__file__).parent
    code = "import conftest, os; assert os.environ['HF_HOME'].startswith(os.environ['TMPDIR'])"
    subprocess.run([sys.executable, "-c", code], cwd=tests, env=os.environ | {"TMPDIR": str(temp)}, check=True,
                   timeout=120)
    assert list(temp.iterdir()) == []
