"""The banner for skipped PostgreSQL tests counts every test skipped for want of PostgreSQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import POSTGRES_ENV, ROOT

CASES = f"""
import pytest
from tests.support.store_fixtures import Backend, POSTGRES_ENV

pytest_plugins = ("tests.support.store_fixtures",)


async def test_on_both_backends(backend: Backend) -> None:
    pass


async def test_only_on_postgres(postgres_backend: Backend) -> None:
    pass


@pytest.mark.skipif(True, reason="set {POSTGRES_ENV}")
def test_marked() -> None:
    pass


def test_skipped_in_its_body() -> None:
    pytest.skip(f"needs PostgreSQL: set {{POSTGRES_ENV}}")


def test_skipped_for_something_else() -> None:
    pytest.skip("no Chromium here")
"""


def test_the_banner_counts_the_fixtures_skips_the_marks_and_the_skips_in_a_body(tmp_path: Path) -> None:
    cases = tmp_path / "test_cases.py"
    cases.write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != POSTGRES_ENV}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "-p",
            "tests.conftest",
            str(cases),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"1 passed, 5 skipped", out), out
    assert f"4 PostgreSQL test(s) skipped: {POSTGRES_ENV} is not set" in out, out
