"""`ttft-monitor demo` end to end: the simulator, the real daemon, a regression that opens and resolves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, CliResult, run_cli


@pytest.mark.realtime
@pytest.mark.timeout(260)
def test_the_demo_raises_and_resolves_a_regression(tmp_path: Path) -> None:
    page, resolve = "!!! [PAGE] TTFT regression on qwen3-14b", "!!! [RESOLVED] TTFT regression on qwen3-14b"
    result = run_demo_until(tmp_path, resolve, within_s=200)
    out = result.stdout
    assert result.code == 0, str(result)
    assert re.search(r"metrics: http://127\.0\.0\.1:\d+/metrics", out)
    assert "made qwen3-14b 2.5x slower" in out
    assert page in out and resolve in out, out
    # Under the page's headline, why: the detector's evidence in words.
    assert re.search(r"\n    (qwen3-14b / \w+: )?\+\d+% over \d+ runs \(", out), out
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


def run_demo_until(tmp_path: Path, line: str, *, within_s: float) -> CliResult:
    """`ttft-monitor demo` as a user runs it, stopped with Ctrl-C (SIGINT, as the demo says) once it has
    printed `line`: the story is told by then. A fixed `--duration` waited out ~50 s after the resolve on
    a quiet machine and could cut the story short on a loaded one; `within_s` is only the cap."""
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed below; an unread pipe could fill up
    process = subprocess.Popen(
        [sys.executable, "-m", "monitor", "demo", "--state-dir", str(tmp_path / "demo"), "--slow-after", "60",
         "--recover-after", "120", "--duration", f"{within_s:g}"],
        stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != "TTFT_CONFIG"}, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + within_s + 15
        while process.poll() is None and time.monotonic() < deadline and not any(line in printed for printed in lines):
            time.sleep(0.5)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(10)
        process.stdout.close()
        errors.seek(0)
        stderr = errors.read()
        errors.close()
    return CliResult(code, "".join(lines), stderr)


def test_a_daemon_that_cannot_start_ends_the_demo_with_its_status_and_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two demos started together both find 9464 free, and the second daemon cannot bind it: the demo
    # said "stopped" and exited 0. Here the port the demo picks is taken before its daemon binds it.
    import io
    import socket

    from monitor import demo

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pick = demo._free_port
        monkeypatch.setattr(demo, "_free_port", lambda preferred: port if preferred == 9464 else pick(preferred))
        out = io.StringIO()
        started = time.monotonic()
        code = demo.run_demo(state_dir=tmp_path / "demo", slow_after_s=60, recover_after_s=150, duration_s=60, out=out)
    assert code == 3, out.getvalue()
    assert time.monotonic() - started < 30, out.getvalue()  # not the whole --duration
    assert f"cannot listen on 127.0.0.1:{port}" in out.getvalue() and "stop what uses that port" in out.getvalue()
