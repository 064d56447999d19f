"""The real daemon as a child process, against the real simulator and a real database."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, SimProcess, call_cli, run_cli, start_sim, stop_sim


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(
    folder: Path,
    sim: SimProcess,
    *,
    db_url: str | None = None,
    schedule: str = "*/2 * * * * *",
    model: str = "gpt-4o-mini",
    rounds: int = 1,
    metrics_port: int | None = None,
    grace: float = 20,
    location: str = "test",
) -> Path:
    db_url = db_url or f"sqlite+aiosqlite:///{folder}/ttft.db"
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: {location}
shutdown_grace_s: {grace}
database:
  url: "{db_url}"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{metrics_port or free_port()}"
providers:
  sim:
    base_url: "{sim.v1}"
    api: openai-chat
    timeout_s: {{connect: 2, first_token: 15, total: 30}}
targets:
  fast:
    provider: sim
    model: {model}
    params: {{max_tokens: 4}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: tick
    schedule: "{schedule}"
    targets: [fast]
    prompts: [short]
    rounds: {rounds}
    warmup: 0
    pause_s: 0
"""
    )
    return path


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_url: str

    def logs(self) -> list[dict]:
        events = []
        for line in self.log_path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                events.append({"event": "raw", "line": line})
        return events

    def events(self, name: str) -> list[dict]:
        return [e for e in self.logs() if e.get("event") == name]

    def wait_for(self, name: str, *, count: int = 1, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(name)
            if len(found) >= count:
                return found
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {count} x {name} within {timeout} s; logs:\n{self.log_path.read_text()[-3000:]}")


def start_daemon(config: Path, folder: Path, name: str = "daemon", *, env: dict[str, str] | None = None) -> Daemon:
    log_path = folder / f"{name}.log"
    text = config.read_text()
    listen = text.split('listen: "', 1)[1].split('"', 1)[0]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**{k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}, **(env or {})},
        )
    return Daemon(process=process, log_path=log_path, metrics_url=f"http://{listen}")


def stop_daemon(daemon: Daemon, *, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if daemon.process.poll() is None:
        daemon.process.send_signal(sig)
    try:
        return daemon.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
        daemon.process.wait()
        raise


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_ready(daemon: Daemon, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            break
        try:
            if http_get(daemon.metrics_url + "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"daemon not ready; logs:\n{daemon.log_path.read_text()[-3000:]}")


def sqlite_rows(folder: Path, query: str) -> list[tuple]:
    with sqlite3.connect(folder / "ttft.db") as conn:
        return conn.execute(query).fetchall()


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


def upgrade(config: Path) -> None:
    """`ttft-monitor db upgrade` in-process: ~25 daemon tests call it first, and a child interpreter
    (~1.4 s of start-up each) tests nothing they assert."""
    result = call_cli("db", "upgrade", "--config", str(config))
    assert result.code == 0, str(result)


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


def test_sigterm_mid_probe_lets_it_finish_and_exits_0_with_nothing_lost(sim: SimProcess, tmp_path: Path) -> None:
    sim.post("/sim/models/slow-model", {"ttft_base_ms": 2500, "prefill_ms_per_1k": 0, "decode_tps": 50})
    config = write_config(tmp_path, sim, model="slow-model", schedule="*/3 * * * * *", grace=10)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        # wait until a tick has started probing (its tick is claimed), then stop mid-probe
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not sqlite_rows(tmp_path, "select count(*) from job_ticks")[0][0]:
            time.sleep(0.05)
        time.sleep(0.5)
        started = time.monotonic()
        code = stop_daemon(daemon)
        elapsed = time.monotonic() - started
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
    assert code == 0, daemon.log_path.read_text()[-2000:]
    assert 1.0 < elapsed < 10, elapsed  # it waited for the probe, and not longer than the grace
    samples = daemon.events("probe_sample")
    assert samples and all(s.get("error") is None for s in samples)
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


def wait_until(condition: Callable[[], bool], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def _admin(url: str, statement: str) -> None:
    import asyncio

    import asyncpg

    async def execute() -> None:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(execute())


def _fresh_postgres_database(url: str) -> tuple[str, str]:
    import uuid

    name = f"ttft_daemon_{uuid.uuid4().hex[:10]}"
    _admin(url, f'CREATE DATABASE "{name}"')
    return name, url.rsplit("/", 1)[0] + "/" + name


def _query(url: str, sql: str) -> list[tuple]:
    import asyncio

    from sqlalchemy import text

    from monitor.store.engine import create_engine

    async def read() -> list[tuple]:
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                return [tuple(row) for row in (await conn.execute(text(sql))).all()]
        finally:
            await engine.dispose()

    return asyncio.run(read())


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
