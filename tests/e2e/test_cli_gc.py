"""The cyclic garbage collector is off while a measuring command starts up, and on for everything after."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from monitor.app import freeze_heap
from tests.conftest import ROOT

# In a child process: the command configures logging for its whole process.
AFTER_MAIN = """
import gc, sys
from monitor import cli
code = cli.main(sys.argv[1:])
print(code, gc.isenabled())
"""


def test_a_measuring_command_that_ends_before_probing_leaves_the_collector_on(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("targets: [not, a, mapping]\n")
    done = subprocess.run(
        [sys.executable, "-c", AFTER_MAIN, "once", "--config", str(bad)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.stdout.splitlines()[-1].split() == ["2", "True"], done


def test_freeze_heap_turns_the_collector_back_on() -> None:
    gc.disable()
    try:
        freeze_heap()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
