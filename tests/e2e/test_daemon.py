"""The real daemon as a child process, against the real simulator and a real database."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import SimProcess, run_cli, start_sim, stop_sim
from tests.support.daemon import (
    Daemon,
    _admin,
    _fresh_postgres_database,
    _query,
    http_get,
    sqlite_rows,
    start_daemon,
    stop_daemon,
    upgrade,
    wait_ready,
    wait_until,
    write_config,
)
from tests.support.ports import free_port


def test_jobs_fire_on_schedule_samples_land_and_metrics_show_the_series(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        finished = daemon.wait_for("job_finished", count=3, timeout=30)
        status, body = http_get(daemon.metrics_url + "/metrics")
        assert status == 200
        series = 'location="test",model="gpt-4o-mini",probe_job="tick",prompt="short",'
        assert "ttft_monitor_ttft_seconds_count{" + series in body
        assert 'ttft_monitor_probes_total{error_class="none",location="test",outcome="ok",probe_job="tick",' in body
        assert 'ttft_monitor_job_last_run_timestamp_seconds{probe_job="tick"}' in body
        assert "_created" not in body
        assert http_get(daemon.metrics_url + "/healthz")[0] == 200
        samples = daemon.events("probe_sample")
        assert all(s["job"] == "tick" and s["target"] == "fast" for s in samples)
        assert all(f["ok"] == 1 for f in finished)
    finally:
        assert stop_daemon(daemon) == 0
    ticks = sqlite_rows(tmp_path, "select scheduled_at from job_ticks order by scheduled_at")
    assert len(ticks) >= 3
    stored = sqlite_rows(tmp_path, "select count(*) from samples")[0][0]
    assert stored == len(daemon.events("probe_sample"))
    # second-level cron: consecutive ticks are 2 s apart
    assert daemon.events("daemon_stopped")


def _stopped_when(daemon: Daemon, moment: Callable[[], object]) -> tuple[int, float]:
    """Once the daemon is ready and `moment` has returned, SIGTERM: (its exit code, seconds the stop took).
    A daemon still up when this ends (a failed wait) is killed."""
    try:
        wait_ready(daemon)
        moment()
        started = time.monotonic()
        code = stop_daemon(daemon)
        return code, time.monotonic() - started
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_sigterm_mid_probe_lets_it_finish_and_exits_0_with_nothing_lost(sim: SimProcess, tmp_path: Path) -> None:
    sim.post("/sim/models/slow-model", {"ttft_base_ms": 2500, "prefill_ms_per_1k": 0, "decode_tps": 50})
    config = write_config(tmp_path, sim, model="slow-model", schedule="*/3 * * * * *", grace=10)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)

    def mid_probe() -> None:  # a tick has started probing (its tick is claimed), and half a second more
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not sqlite_rows(tmp_path, "select count(*) from job_ticks")[0][0]:
            time.sleep(0.05)
        time.sleep(0.5)

    code, elapsed = _stopped_when(daemon, mid_probe)
    assert code == 0, daemon.log_path.read_text()[-2000:]
    assert 1.0 < elapsed < 10, elapsed  # it waited for the probe, and not longer than the grace
    samples = daemon.events("probe_sample")
    assert samples and all(s.get("error") is None for s in samples)
    assert sqlite_rows(tmp_path, "select count(*) from samples")[0][0] == len(samples)


def test_sigterm_mid_run_starts_no_more_rounds_and_stores_what_it_took(sim: SimProcess, tmp_path: Path) -> None:
    # A run of 10 rounds of about 1 s each, stopped after its second: the stop waits for the request out, not
    # for the 8 rounds left (nor for the 30 s grace, which would then cut them off).
    sim.post("/sim/models/slow-model", {"ttft_base_ms": 900, "prefill_ms_per_1k": 0, "decode_tps": 50})
    config = write_config(tmp_path, sim, model="slow-model", schedule="*/2 * * * * *", rounds=10, grace=30)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    code, elapsed = _stopped_when(daemon, lambda: daemon.wait_for("probe_sample", count=2, timeout=30))
    assert code == 0, daemon.log_path.read_text()[-2000:]
    assert elapsed < 10, elapsed  # one request's time and the flush; the run's 8 rounds left would take 8 s more
    assert not daemon.events("jobs_cancelled_at_shutdown")
    [finished] = daemon.events("job_finished")
    assert finished["drained"] is True and 2 <= finished["ok"] < 10, finished
    assert finished["rounds_not_probed"] == 10 - finished["ok"], finished
    samples = daemon.events("probe_sample")
    assert len(samples) == finished["ok"] and all(s.get("error") is None for s in samples)
    assert sqlite_rows(tmp_path, "select count(*) from samples")[0][0] == len(samples)


def test_sighup_with_a_broken_file_keeps_the_old_jobs(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished")
        good = config.read_text()
        config.write_text(good.replace("rounds: 1", "rounds: lots"))
        daemon.process.send_signal(signal.SIGHUP)
        rejected = daemon.wait_for("reload_rejected")
        assert any("jobs[0].rounds" in e for e in rejected[0]["errors"])
        before = len(daemon.events("job_finished"))
        daemon.wait_for("job_finished", count=before + 2, timeout=20)
        # a good file is taken
        config.write_text(good.replace("rounds: 1", "rounds: 2"))
        daemon.process.send_signal(signal.SIGHUP)
        daemon.wait_for("config_reloaded")
    finally:
        assert stop_daemon(daemon) == 0


def test_a_schema_behind_head_refuses_to_start_and_names_the_fix(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim)
    result = run_cli("run", "--config", str(config), timeout=60)
    assert result.code == 3, str(result)
    assert "ttft-monitor db upgrade" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_once_on_a_schema_behind_head_exits_3_and_names_the_fix(sim: SimProcess, tmp_path: Path) -> None:
    # `once` lost this when it learned to stop on SIGTERM while connecting: the error became a traceback.
    config = write_config(tmp_path, sim)
    result = run_cli("once", "--config", str(config), timeout=60)
    assert result.code == 3, str(result)
    assert "ttft-monitor once: the database schema is empty" in result.stderr, str(result)
    assert "run `ttft-monitor db upgrade`" in result.stderr, str(result)
    assert "Traceback" not in result.stdout + result.stderr


def test_once_on_an_unreachable_database_exits_3_naming_it_without_its_password(
    sim: SimProcess, tmp_path: Path
) -> None:
    url = f"postgresql+asyncpg://monitor:hunter2-secret@127.0.0.1:{free_port()}/ttft"
    config = write_config(tmp_path, sim, db_url=url)
    config.write_text(config.read_text().replace("database:\n", "database:\n  connect_retry_s: 1\n", 1))
    result = run_cli("once", "--config", str(config), timeout=60)
    assert result.code == 3, str(result)
    assert "ttft-monitor once: gave up after 1 s" in result.stderr, str(result)
    assert "127.0.0.1" in result.stderr, str(result)
    assert "Traceback" not in result.stdout + result.stderr
    assert "hunter2-secret" not in result.stdout + result.stderr


def test_a_bad_config_fails_fast_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n  - name: x\n    schedule: '* * *'\n    targets: [nope]\n    prompts: [p]\n")
    result = run_cli("run", "--config", str(bad))
    assert result.code == 2, str(result)
    assert "is not a cron expression" in result.stdout + result.stderr


@pytest.fixture
def shared_database(tmp_path: Path) -> Iterator[str]:
    """Postgres when TTFT_TEST_POSTGRES_URL is set (a fresh database, dropped after), else one SQLite file."""
    db_url = os.environ.get("TTFT_TEST_POSTGRES_URL")
    if db_url is None:
        yield f"sqlite+aiosqlite:///{tmp_path}/shared.db"
        return
    name, url = _fresh_postgres_database(db_url)
    try:
        yield url
    finally:
        _admin(db_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.realtime
def test_two_daemons_on_one_database_run_every_tick_exactly_once(
    sim: SimProcess, tmp_path: Path, shared_database: str
) -> None:
    shared = shared_database
    folder_a, folder_b = tmp_path / "a", tmp_path / "b"
    folder_a.mkdir()
    folder_b.mkdir()
    config_a = write_config(folder_a, sim, db_url=shared)
    config_b = write_config(folder_b, sim, db_url=shared)
    upgrade(config_a)
    a, b = start_daemon(config_a, folder_a, "a"), start_daemon(config_b, folder_b, "b")
    try:
        wait_ready(a)
        wait_ready(b)
        wait_until(lambda: _ticks_seen(a, b) >= (4, 3), timeout=45)
    finally:
        assert stop_daemon(a) == 0
        assert stop_daemon(b) == 0
    ran_a = [e["lag_ms"] for e in a.events("job_finished")]
    ran_b = [e["lag_ms"] for e in b.events("job_finished")]
    skipped = len(a.events("tick_claimed_elsewhere")) + len(b.events("tick_claimed_elsewhere"))
    assert len(ran_a) + len(ran_b) >= 4
    assert skipped >= 3  # both saw the ticks; one of them stood down each time
    # every tick was probed by exactly one of them: one run per intended time, none twice
    runs = _query(shared, "select intended_at from runs where job = 'tick'")
    assert len(runs) == len(set(runs)) == len(ran_a) + len(ran_b)
    assert len(_query(shared, "select id from job_ticks")) == len(runs)


def _ticks_seen(*daemons: Daemon) -> tuple[int, int]:
    """(runs finished, ticks left to the other daemon) over all `daemons`."""
    finished = sum(len(d.events("job_finished")) for d in daemons)
    skipped = sum(len(d.events("tick_claimed_elsewhere")) for d in daemons)
    return finished, skipped


def test_keys_never_reach_logs_metrics_or_the_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    right, wrong = "sk-right-6f1d0c9a2b7e4f5a8c3d", "sk-wrong-1a2b3c4d5e6f7a8b9c0d"
    sim = start_sim("--no-noise", "--api-key-env", "SIM_KEY", env={**os.environ, "SIM_KEY": right})
    try:
        config = write_config(tmp_path, sim)
        text = config.read_text().replace(
            "    api: openai-chat\n",
            "    api: openai-chat\n    api_key_env: PROBE_KEY\n    headers: {X-Trace: '${TRACE_TOKEN}'}\n",
        )
        text = text.replace(
            "targets:\n",
            '  bad:\n    base_url: "' + sim.v1 + '"\n    api: openai-chat\n    api_key_env: BAD_KEY\n'
            "targets:\n  denied:\n    provider: bad\n    model: gpt-4o-mini\n    params: {max_tokens: 4}\n",
        ).replace("targets: [fast]", "targets: [fast, denied]")
        config.write_text(text)
        for key, value in {"PROBE_KEY": right, "BAD_KEY": wrong, "TRACE_TOKEN": "trace-secret-77aa88bb99"}.items():
            monkeypatch.setenv(key, value)
        upgrade(config)
        daemon = start_daemon(config, tmp_path)
        try:
            wait_ready(daemon)
            finished = daemon.wait_for("job_finished", count=2)
            _, metrics = http_get(daemon.metrics_url + "/metrics")
        finally:
            assert stop_daemon(daemon) == 0
    finally:
        stop_sim(sim)
    assert all(f["ok"] == 1 and f["failed"] == 1 for f in finished)  # one good key, one refused
    assert 'error_class="auth"' in metrics
    logs = daemon.log_path.read_text()
    database = (tmp_path / "ttft.db").read_bytes()
    for secret in (right, wrong, "trace-secret-77aa88bb99"):
        assert secret not in logs
        assert secret not in metrics
        assert secret.encode() not in database
