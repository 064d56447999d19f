"""The real daemon against a database that hangs: probing goes on, shutdown stays bounded.

A real TCP proxy (tests/support/tcp_proxy.py) sits between the daemon and the real PostgreSQL and
blackholes it (connections accept, nothing answers); SQLite is held by another process under
BEGIN EXCLUSIVE. The daemon runs as a child process on a 2-second schedule against the simulator.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import ROOT, SimProcess, start_sim, stop_sim
from tests.support.daemon import (
    Daemon,
    _admin,
    _fresh_postgres_database,
    _query,
    http_get,
    start_daemon,
    stop_daemon,
    upgrade,
    wait_ready,
    write_config,
)
from tests.support.tcp_proxy import TcpProxy

POSTGRES = os.environ.get("TTFT_TEST_POSTGRES_URL")
needs_postgres = pytest.mark.skipif(POSTGRES is None, reason="set TTFT_TEST_POSTGRES_URL")
TICK_S = 2


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


@pytest.fixture
def postgres_behind_proxy(tmp_path: Path) -> Iterator[tuple[str, str, TcpProxy]]:
    """(direct url, url through the proxy, proxy) for a fresh database."""
    assert POSTGRES is not None
    name, direct = _fresh_postgres_database(POSTGRES)
    proxy = TcpProxy("127.0.0.1", 5432).start()
    try:
        yield direct, direct.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), proxy
    finally:
        proxy.close()
        _admin(POSTGRES, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _upgrade_direct(folder: Path, simulator: SimProcess, direct: str) -> None:
    sub = folder / "migrate"
    sub.mkdir()
    upgrade(write_config(sub, simulator, db_url=direct))


def _no_holes(intended: list[datetime]) -> tuple[int, int]:
    """(runs, ticks between the first and the last run): equal when no tick was skipped."""
    times = sorted(intended)
    span = (times[-1] - times[0]).total_seconds()
    return len(times), round(span / TICK_S) + 1


def _skips(daemon: Daemon) -> int:
    return sum(len(daemon.events(name)) for name in ("job_run_skipped", "job_run_missed", "job_runs_coalesced"))


@pytest.mark.realtime
@needs_postgres
def test_a_blackholed_postgres_skips_no_tick_and_every_run_lands_once_after_recovery(
    sim: SimProcess,
    tmp_path: Path,
    postgres_behind_proxy: tuple[str, str, TcpProxy],
) -> None:
    direct, proxied, proxy = postgres_behind_proxy
    _upgrade_direct(tmp_path, sim, direct)
    config = write_config(tmp_path, sim, db_url=proxied)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2)
        proxy.set_mode("blackhole")
        time.sleep(20)
        during = len(daemon.events("job_finished"))
        proxy.set_mode("pass")
        daemon.wait_for("spool_drained", timeout=30)
        time.sleep(2 * TICK_S)
        skipped = _skips(daemon)
    finally:
        assert stop_daemon(daemon) == 0
    probed = len(daemon.events("job_finished"))
    assert during >= 2 + 9, daemon.log_path.read_text()[-3000:]  # ~10 ticks in 20 s, all probed
    assert skipped == 0, daemon.log_path.read_text()[-3000:]
    intended = [row[0] for row in _query(direct, "select intended_at from runs where job = 'tick'")]
    runs, ticks = _no_holes(intended)
    assert runs == len(set(intended)) == probed == ticks
    # Detection followed every stored run that is evidence, the replayed ones included: each evaluation
    # is one version. A run whose every sample was disturbed (the monitor itself late around its stamps:
    # on this 2-vCPU VM the daemon shares the cores with PostgreSQL, the simulator and this process) is
    # stored but not evaluated, and says so; only the run stored as the hang began may have lost its
    # detection, and then the log says that too.
    no_evidence = _query(direct, "select count(*) from runs where job = 'tick' and rounds > 0 and ok + errors = 0")
    skipped_whole = [e for e in daemon.events("detection_skipped_disturbed") if e.get("run_evaluated") is False]
    assert len(skipped_whole) == no_evidence[0][0], (skipped_whole, no_evidence)
    evaluable = runs - len(skipped_whole)
    undetected = [e for e in daemon.logs() if e.get("event") in ("detection_failed", "detection_skipped")]
    versions = [row[0] for row in _query(direct, "select version from detector_state")]
    expected = {evaluable - 1, evaluable} if undetected else {evaluable}
    assert len(versions) == 1 and versions[0] in expected, (versions, runs, skipped_whole, undetected)


@pytest.mark.realtime
def test_sqlite_locked_by_another_process_skips_no_tick(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    holder = None
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2)
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys, time\n"
                "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                "c.execute('BEGIN EXCLUSIVE')\n"
                "print('locked', flush=True)\n"
                "time.sleep(float(sys.argv[2]))\n"
                "c.execute('ROLLBACK')\n",
                str(tmp_path / "ttft.db"),
                "16",
            ],
            stdout=subprocess.PIPE,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        before = len(daemon.events("job_finished"))
        holder.wait(timeout=30)
        during = len(daemon.events("job_finished")) - before
        daemon.wait_for("spool_drained", timeout=30)
        time.sleep(2 * TICK_S)
        skipped = _skips(daemon)
    finally:
        if holder is not None:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            assert holder.stdout is not None
            holder.stdout.close()
        assert stop_daemon(daemon) == 0
    assert during >= 7, daemon.log_path.read_text()[-3000:]  # ~8 ticks in 16 s
    assert skipped == 0, daemon.log_path.read_text()[-3000:]
    with sqlite3.connect(tmp_path / "ttft.db") as conn:
        intended = [datetime.fromisoformat(r[0]) for r in conn.execute("select intended_at from runs")]
    runs, ticks = _no_holes(intended)
    assert runs == len(set(intended)) == len(daemon.events("job_finished")) == ticks


@pytest.mark.realtime
@needs_postgres
def test_sigterm_during_a_database_hang_exits_within_the_grace_and_spools_the_rest(
    sim: SimProcess,
    tmp_path: Path,
    postgres_behind_proxy: tuple[str, str, TcpProxy],
) -> None:
    direct, proxied, proxy = postgres_behind_proxy
    _upgrade_direct(tmp_path, sim, direct)
    grace = 6
    config = write_config(tmp_path, sim, db_url=proxied, grace=grace)
    first = start_daemon(config, tmp_path, "first")
    try:
        wait_ready(first)
        first.wait_for("job_finished", count=2)
        proxy.set_mode("blackhole")
        time.sleep(7)  # a write is stuck on the hung server, later runs queue behind it
        asked = time.monotonic()
        assert http_get(first.metrics_url + "/readyz")[0] == 503
        assert time.monotonic() - asked < 4  # /readyz answers in bounded time, the database hung or not
        started = time.monotonic()
        code = stop_daemon(first, timeout=60)
        elapsed = time.monotonic() - started
    finally:
        if first.process.poll() is None:
            first.process.kill()
    assert code == 0, first.log_path.read_text()[-3000:]
    assert elapsed < grace + 5, elapsed
    errors = [e for e in first.logs() if e.get("level") in ("error", "critical")]
    assert not errors, errors
    # What the hung database did not take waited in the spool; the next start replays it.
    proxy.set_mode("pass")
    second = start_daemon(config, tmp_path, "second")
    try:
        wait_ready(second)
        second.wait_for("spool_drained", timeout=30)
        second.wait_for("job_finished", count=1)
    finally:
        assert stop_daemon(second) == 0
    probed = len(first.events("job_finished")) + len(second.events("job_finished"))
    intended = [row[0] for row in _query(direct, "select intended_at from runs where job = 'tick'")]
    assert len(intended) == len(set(intended)) == probed


def test_sigterm_mid_probe_after_the_grace_logs_no_error(sim: SimProcess, tmp_path: Path) -> None:
    sim.post("/sim/models/slow-model", {"ttft_base_ms": 6000, "prefill_ms_per_1k": 0, "decode_tps": 50})
    config = write_config(tmp_path, sim, model="slow-model", schedule="*/2 * * * * *", grace=1)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _requests_running(sim, "slow-model") < 1:
            time.sleep(0.05)  # until a tick is probing the slow model (a fixed 3 s before)
        assert stop_daemon(daemon) == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
    assert daemon.events("jobs_cancelled_at_shutdown"), daemon.log_path.read_text()[-3000:]
    errors = [e for e in daemon.logs() if e.get("level") in ("error", "critical") or e.get("event") == "raw"]
    assert not errors, errors


def _sockets(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(fd).startswith("socket:")
    return count


@pytest.mark.realtime
def test_reloads_open_no_new_http_sessions(sim: SimProcess, tmp_path: Path) -> None:
    # Every second: each reload waits for a run of the reloaded job, and the tick's length matters not.
    config = write_config(tmp_path, sim, schedule="* * * * * *")
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2)
        baseline = _sockets(daemon.process.pid)
        for n in range(1, 7):
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_for("config_reloaded", count=n)
            done = len(daemon.events("job_finished"))
            daemon.wait_for("job_finished", count=done + 1)  # the reloaded job probes (keep-alive)
        after = _sockets(daemon.process.pid)
    finally:
        assert stop_daemon(daemon) == 0
    # Each leaked session would keep its keep-alive connection to the simulator open.
    assert after <= baseline + 1, (baseline, after)


def _run_once(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "monitor", "once", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )


@pytest.mark.realtime
def test_once_on_sigterm_stores_what_it_measured_logs_one_line_and_exits_4(
    sim: SimProcess,
    tmp_path: Path,
) -> None:
    sim.post("/sim/models/slow-model", {"ttft_base_ms": 700, "prefill_ms_per_1k": 0, "decode_tps": 50})
    # A long grace: the stop must not wait for it, only for the request each series has out (about 1 s).
    config = write_config(tmp_path, sim, model="slow-model", rounds=20, grace=30)
    upgrade(config)
    log = tmp_path / "once.log"
    process = _run_once(config, log)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and log.read_text().count('"probe_sample"') < 2:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = process.wait(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 4, text[-3000:]
    assert elapsed < 12, elapsed  # the rounds not begun are not waited for (20 rounds take 20 s and more)
    assert text.count('"once_interrupted"') == 1, text[-3000:]
    assert '"jobs_cancelled_at_shutdown"' not in text, text[-3000:]  # the request in flight finished
    finished = [json.loads(line) for line in text.splitlines() if '"job_finished"' in line]
    assert len(finished) == 1 and finished[0]["drained"] is True, finished
    assert finished[0]["rounds_not_probed"] == 20 - finished[0]["ok"], finished
    measured = text.count('"probe_sample"')
    with sqlite3.connect(tmp_path / "ttft.db") as conn:
        stored = conn.execute("select count(*) from samples").fetchone()[0]
    assert 2 <= stored == measured < 20, (stored, measured)


def _requests_running(sim: SimProcess, model: str) -> float:
    """The simulator's own count of requests of `model` it is answering (received, not finished)."""
    for line in http_get(sim.url + "/metrics")[1].splitlines():
        if line.startswith("vllm:num_requests_running{") and f'model_name="{model}"' in line:
            return float(line.split()[-1])
    return 0.0


@pytest.mark.realtime
def test_once_on_sigterm_gives_an_in_flight_probe_the_grace_and_stores_it(sim: SimProcess, tmp_path: Path) -> None:
    # A CronJob evicted while its probe waits for a slow first token: the probe finishes inside
    # shutdown_grace_s, so its sample is stored, as `run` does on SIGTERM.
    sim.post("/sim/models/slow-model", {"ttft_base_ms": 2500, "prefill_ms_per_1k": 0, "decode_tps": 200})
    config = write_config(tmp_path, sim, model="slow-model", rounds=1, grace=10)
    upgrade(config)
    log = tmp_path / "once.log"
    process = _run_once(config, log)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _requests_running(sim, "slow-model") < 1:
            time.sleep(0.02)
        assert _requests_running(sim, "slow-model") == 1, log.read_text()[-3000:]
        process.send_signal(signal.SIGTERM)  # before the first token, 2.5 s after the request arrived
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 4, text[-3000:]
    assert text.count('"once_interrupted"') == 1, text[-3000:]
    with sqlite3.connect(tmp_path / "ttft.db") as conn:
        rows = conn.execute("select ttft_us / 1000.0, error from samples").fetchall()
    assert len(rows) == 1, (rows, text[-3000:])
    ttft_ms, error = rows[0]
    assert error is None and ttft_ms is not None and ttft_ms >= 2500, rows


def test_once_stores_its_runs_detects_them_and_exits_0(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim, rounds=3)
    upgrade(config)
    log = tmp_path / "once.log"
    process = _run_once(config, log)
    try:
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    with sqlite3.connect(tmp_path / "ttft.db") as conn:
        samples = conn.execute("select count(*) from samples").fetchone()[0]
        versions = [row[0] for row in conn.execute("select version from detector_state")]
    assert samples == text.count('"probe_sample"') == 3
    assert versions == [1]  # detection ran on the stored run before `once` exited
    assert text.count('"once_finished"') == 1


def _database_up(daemon: Daemon) -> float | None:
    for line in http_get(daemon.metrics_url + "/metrics")[1].splitlines():
        if line.startswith("ttft_monitor_database_up "):
            return float(line.split()[1])
    return None


@pytest.mark.realtime
@needs_postgres
def test_a_read_only_database_is_not_ready_says_so_and_stays_down_while_writes_fail(
    sim: SimProcess, tmp_path: Path
) -> None:
    assert POSTGRES is not None
    name, direct = _fresh_postgres_database(POSTGRES)
    others = (
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )
    try:
        config = write_config(tmp_path, sim, db_url=direct)
        upgrade(config)
        daemon = start_daemon(config, tmp_path)
        try:
            wait_ready(daemon)
            daemon.wait_for("job_finished", count=1)
            # What a standby after a failover looks like to a client: reads answer, every write is refused.
            _admin(POSTGRES, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            _admin(POSTGRES, others)
            deadline = time.monotonic() + 30
            while not any(
                "read-only" in e.get("error", "")
                for e in daemon.events("database_write_failed") + daemon.events("spool_drain_failed")
            ):
                assert time.monotonic() < deadline, daemon.log_path.read_text()[-3000:]
                time.sleep(0.2)
            answers = [http_get(daemon.metrics_url + "/readyz") for _ in range(5)]
            up_while_read_only = _database_up(daemon)
            _admin(POSTGRES, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            _admin(POSTGRES, others)
            daemon.wait_for("spool_drained", timeout=30)
            wait_ready(daemon, timeout=15)
            up_after = _database_up(daemon)
        finally:
            assert stop_daemon(daemon) == 0
    finally:
        _admin(POSTGRES, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    log = daemon.log_path.read_text()[-3000:]
    assert [status for status, _ in answers] == [503] * 5, (answers, log)
    assert all("the database is read-only: a standby or a failover?" in body for _, body in answers), answers
    assert up_while_read_only == 0, log  # readiness's own ping answered: it must not say the database is up
    assert up_after == 1
