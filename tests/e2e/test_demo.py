"""`ttft-monitor demo` end to end: the simulator, the real daemon, a regression that opens and resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import run_cli


@pytest.mark.realtime
@pytest.mark.timeout(260)
def test_the_demo_raises_and_resolves_a_regression(tmp_path: Path) -> None:
    result = run_cli(
        "demo",
        "--state-dir",
        str(tmp_path / "demo"),
        "--slow-after",
        "45",
        "--recover-after",
        "120",
        "--duration",
        "185",
        timeout=230,
    )
    out = result.stdout
    assert result.code == 0, str(result)
    assert re.search(r"metrics: http://127\.0\.0\.1:\d+/metrics", out)
    assert "made qwen3-14b 2.5x slower" in out
    page, resolve = "!!! [PAGE] TTFT regression on qwen3-14b", "!!! [RESOLVED] TTFT regression on qwen3-14b"
    assert page in out and resolve in out, out
    assert out.index(page) < out.index(resolve)
    # only the slowed model regressed
    assert "regression on qwen3-8b" not in out and "regression on gpt-4o-mini" not in out
    assert "Traceback" not in out + result.stderr
    assert out.rstrip().endswith("ttft-monitor demo: stopped")


def test_the_demo_refuses_a_state_dir_it_would_wrongly_delete(tmp_path: Path) -> None:
    # It deletes its state directory first: a file was a traceback, and any other directory was wiped.
    (tmp_path / "a-file").write_text("")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "ttft-monitor.db").write_text("not the demo's")
    for where, says in (
        ("a-file", "is not a directory"),
        ("state", "holds files that are not an earlier demo's (no demo.yaml)"),
    ):
        result = run_cli("demo", "--state-dir", str(tmp_path / where), "--duration", "1", timeout=60)
        assert result.code == 2, str(result)
        assert f"ttft-monitor demo: --state-dir {tmp_path / where}: {says}" in result.stderr, str(result)
        assert "Traceback" not in result.stdout + result.stderr, str(result)
    assert (tmp_path / "state" / "ttft-monitor.db").read_text() == "not the demo's"
