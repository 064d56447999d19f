"""The suite's parallel run (tests/support/parallel.py): tests sharing a module's fixture run in one
worker, others spread, and a `solo` test runs while no other test runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

CASES = """
import json, os, time
from pathlib import Path
import pytest

LOG = Path(os.environ["PARALLEL_LOG"])


def record(name):
    started = time.monotonic()
    time.sleep(0.4)
    with LOG.open("a") as out:
        out.write(json.dumps({"name": name, "worker": os.environ["PYTEST_XDIST_WORKER"],
                              "start": started, "end": time.monotonic()}) + "\\n")


@pytest.fixture(scope="module")
def shared():
    return object()


@pytest.mark.parametrize("n", range(4))
def test_shares_a_module_fixture(shared, n):
    record(f"shared-{n}")


@pytest.mark.parametrize("n", range(8))
def test_on_its_own(n):
    record(f"alone-{n}")


@pytest.mark.solo
def test_alone_in_the_run():
    record("solo")
"""


def test_groups_stay_in_one_worker_others_spread_and_a_solo_test_runs_alone(tmp_path: Path) -> None:
    folder = tmp_path / "cases"
    folder.mkdir()
    (folder / "test_cases.py").write_text(CASES)
    log = tmp_path / "log.jsonl"
    environment = {**os.environ, "PARALLEL_LOG": str(log), "PYTHONPATH": str(ROOT)}
    pytest_args = ["-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "3", "--dist", "loadgroup"]
    options = ["-o", "markers=solo", "-o", "asyncio_default_fixture_loop_scope=function"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, *options, str(folder)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 13, runs
    assert len({run["worker"] for run in runs if run["name"].startswith("shared-")}) == 1, runs
    assert len({run["worker"] for run in runs if run["name"].startswith("alone-")}) > 1, runs
    (solo,) = [run for run in runs if run["name"] == "solo"]
    overlapping = [r["name"] for r in runs if r is not solo and r["start"] < solo["end"] and solo["start"] < r["end"]]
    assert not overlapping, (solo, runs)
