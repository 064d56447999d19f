"""The daemon object in this process: start, reload and stop, against the simulator and SQLite.

The process-lifetime resources are opened once: every run and every reload scrapes providers'
`server_metrics_url` through one shared session, so the metrics endpoint sees one connection
however many runs and reloads there are (the old code opened a session, and a connection, per run).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from structlog.testing import capture_logs

from monitor.daemon import Daemon, StartupFailed
from monitor.exitcodes import EXIT_INFRA, EXIT_USAGE
from monitor.sim import RunningSimulator, Simulator, start
from monitor.store import migrate
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(120)


@dataclass
class MetricsEndpoint:
    """The simulator's /metrics page behind a keep-alive HTTP/1.1 server that counts connections."""

    simulator: Simulator
    connections: int = 0
    requests: int = 0
    open: set[asyncio.StreamWriter] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"GET "):
                    break
                self.requests += 1
                body = self.simulator.metrics.page(self.simulator.profiles, self.simulator.caches)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open.discard(writer)
            writer.close()


def _write_config(path: Path, folder: Path, sim_url: str, metrics_url: str, *, job: str) -> None:
    path.write_text(
        f"""
location: test
shutdown_grace_s: 5
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{free_port()}"
providers:
  sim:
    base_url: "{sim_url}/v1"
    api: openai-chat
    server_metrics_url: "{metrics_url}"
    timeout_s: {{connect: 2, first_token: 15, total: 30}}
targets:
  fast: {{provider: sim, model: gpt-4o-mini, params: {{max_tokens: 4}}}}
prompts:
  short: {{tokens: 128}}
jobs:
  - name: {job}
    schedule: "* * * * * *"
    targets: [fast]
    prompts: [short]
    rounds: 1
    warmup: 0
    pause_s: 0
"""
    )


def _listen(config: Path) -> str:
    return config.read_text().split('listen: "', 1)[1].split('"', 1)[0]


def _rewrite_for_job(config: Path, folder: Path, sim_url: str, metrics_url: str, *, job: str, listen: str) -> None:
    """`_write_config` for another job, on the listener the daemon has (metrics.listen changes on restart only)."""
    _write_config(config, folder, sim_url, metrics_url, job=job)
    config.write_text(config.read_text().replace(_listen(config), listen))


async def _metrics_text(listen: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"http://{listen}/metrics") as response:
        return await response.text()


async def _query(folder: Path, sql: str) -> list[Any]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{folder}/ttft.db")
    try:
        async with engine.connect() as connection:
            return list((await connection.execute(sa.text(sql))).all())
    finally:
        await engine.dispose()


@pytest.fixture
async def simulator() -> AsyncIterator[tuple[Simulator, RunningSimulator]]:
    sim = Simulator(noise=False, seed=1)
    running = await start(sim, port=0)
    yield sim, running
    await running.close()


@pytest.fixture
async def metrics_endpoint(simulator: tuple[Simulator, RunningSimulator]) -> AsyncIterator[tuple[MetricsEndpoint, str]]:
    endpoint = MetricsEndpoint(simulator[0])
    server = await asyncio.start_server(endpoint.handle, "127.0.0.1", 0)
    yield endpoint, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    server.close()
    for writer in list(endpoint.open):
        writer.close()
    await server.wait_closed()


@contextlib.asynccontextmanager
async def _running(tmp_path: Path, sim_url: str, metrics_url: str) -> AsyncIterator[tuple[Daemon, Path]]:
    """A daemon of job `tick` on a migrated SQLite database in `tmp_path`, started, and stopped at the end."""
    config = tmp_path / "config.yaml"
    _write_config(config, tmp_path, sim_url, metrics_url, job="tick")
    await migrate.upgrade(f"sqlite+aiosqlite:///{tmp_path}/ttft.db")
    daemon = Daemon(str(config))
    await daemon.start()
    try:
        yield daemon, config
    finally:
        await daemon.stop()


async def _runs_finished(daemon: Daemon, at_least: int, within_s: float = 45) -> None:
    async with asyncio.timeout(within_s):
        while True:
            done = sum(sample.value for sample in _job_runs(daemon))
            if done >= at_least:
                return
            await asyncio.sleep(0.1)


def _job_runs(daemon: Daemon) -> list[Any]:
    return [
        sample
        for metric in daemon.metrics.job_runs.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    ]


async def test_runs_and_reloads_scrape_server_metrics_over_one_shared_connection(
    simulator: tuple[Simulator, RunningSimulator], metrics_endpoint: tuple[MetricsEndpoint, str], tmp_path: Path
) -> None:
    endpoint, metrics_url = metrics_endpoint
    async with _running(tmp_path, simulator[1].url, metrics_url) as (daemon, config):
        await _runs_finished(daemon, 3)
        session = daemon.context.scrape_session
        for n in range(3):
            _write_config(config, tmp_path, simulator[1].url, metrics_url, job=f"tick{n}")
            await daemon.reload()
            assert daemon.context.scrape_session is session  # the reload kept the process's session
            await _runs_finished(daemon, 5 + 2 * n)
    runs = sum(sample.value for sample in _job_runs(daemon))
    assert runs >= 9
    assert endpoint.requests >= 2 * runs  # scraped before and after every run
    # One connection for every scrape (two, should one be dropped under load); the old code: one per run.
    assert endpoint.connections <= 2, (endpoint.connections, runs)
    assert session is not None and session.closed  # stop closed it


def _frozen(objects: list[object]) -> bool:
    """Each of `objects` is tracked by the collector and in none of its generations: frozen (gc.freeze)."""
    walked = {id(o) for o in gc.get_objects()}
    return all(gc.is_tracked(o) and id(o) not in walked for o in objects)


async def test_what_a_jobs_first_tick_made_for_its_series_is_frozen_out_of_full_collections(
    simulator: tuple[Simulator, RunningSimulator], metrics_endpoint: tuple[MetricsEndpoint, str], tmp_path: Path
) -> None:
    # Every full collection walked each series' metric children, histories and states again, 21-37 ms of the
    # probes' loop at 500 series (docs/benchmarks.md): the daemon freezes them once the first tick is evaluated.
    _, metrics_url = metrics_endpoint
    async with _running(tmp_path, simulator[1].url, metrics_url) as (daemon, _config):
        await _runs_finished(daemon, 1)
        children: list[object] = []
        async with asyncio.timeout(30):
            while not children or not _frozen(children):
                await asyncio.sleep(0.1)
                children = list(daemon.metrics.ttft_last._metrics.values())  # made by the first probe
        assert gc.isenabled()
        await _runs_finished(daemon, 3)  # and probing goes on


async def test_a_bad_config_fails_start_with_the_usage_exit_code_and_stop_is_safe(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("jobs: 5\n")
    daemon = Daemon(str(config))
    with pytest.raises(StartupFailed) as failed:
        await daemon.start()
    assert failed.value.code == EXIT_USAGE
    assert failed.value.event == "config_invalid"
    await daemon.stop()  # nothing was started: nothing to stop, and no error


async def test_a_busy_metrics_port_fails_start_with_the_infra_exit_code_and_closes_what_it_opened(
    simulator: tuple[Simulator, RunningSimulator], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    _write_config(config, tmp_path, simulator[1].url, f"{simulator[1].url}/metrics", job="tick")
    await migrate.upgrade(f"sqlite+aiosqlite:///{tmp_path}/ttft.db")
    listen = config.read_text().split('listen: "', 1)[1].split('"', 1)[0]
    host, port = listen.rsplit(":", 1)
    with socket.socket() as busy:
        busy.bind((host, int(port)))
        busy.listen()
        before = {t for t in asyncio.all_tasks() if not t.done()}
        daemon = Daemon(str(config))
        with pytest.raises(StartupFailed) as failed:
            await daemon.start()
    assert (failed.value.code, failed.value.event) == (EXIT_INFRA, "metrics_listen_failed")
    assert f"cannot listen on {listen}" in str(failed.value)
    await asyncio.sleep(0)
    left = {t for t in asyncio.all_tasks() if not t.done()} - before - {asyncio.current_task()}
    assert not left, left  # the background store and every other task start opened are gone
    assert daemon.resources.scrape_session.closed


async def test_a_reload_that_renames_the_job_leaves_no_series_of_the_old_name_on_metrics(
    simulator: tuple[Simulator, RunningSimulator], metrics_endpoint: tuple[MetricsEndpoint, str], tmp_path: Path
) -> None:
    # The old name's last-run gauge, left in place, grew old: the shipped TTFTMonitorJobStale paged three
    # intervals after the rename and never resolved.
    _, metrics_url = metrics_endpoint
    config = tmp_path / "config.yaml"
    _write_config(config, tmp_path, simulator[1].url, metrics_url, job="tick")
    listen = _listen(config)
    await migrate.upgrade(f"sqlite+aiosqlite:///{tmp_path}/ttft.db")
    daemon = Daemon(str(config))
    await daemon.start()
    try:
        await _runs_finished(daemon, 2)
        _rewrite_for_job(config, tmp_path, simulator[1].url, metrics_url, job="tock", listen=listen)
        await daemon.reload()
        await _runs_finished(daemon, 4)
        text = await _metrics_text(listen)
    finally:
        await daemon.stop()
    assert 'probe_job="tock"' in text
    assert 'probe_job="tick"' not in text, [line for line in text.splitlines() if 'probe_job="tick"' in line][:5]


async def test_a_run_in_flight_through_the_reload_that_removed_its_job_leaves_no_series_behind(
    simulator: tuple[Simulator, RunningSimulator], metrics_endpoint: tuple[MetricsEndpoint, str], tmp_path: Path
) -> None:
    # Running instances finish undisturbed by a reload: the removed job's run, still probing, set its last-run
    # gauge and its series again after the reload had removed them (and its detection, after that).
    _, metrics_url = metrics_endpoint
    config = tmp_path / "config.yaml"
    _write_config(config, tmp_path, simulator[1].url, metrics_url, job="slow")
    config.write_text(config.read_text().replace("rounds: 1", "rounds: 2").replace("pause_s: 0", "pause_s: 3"))
    listen = _listen(config)
    await migrate.upgrade(f"sqlite+aiosqlite:///{tmp_path}/ttft.db")
    daemon = Daemon(str(config))
    await daemon.start()
    try:
        async with asyncio.timeout(30):  # the first run's first probe is in: it is mid-run, in its pause
            while True:
                if any(sample.value for family in daemon.metrics.probes.collect() for sample in family.samples):
                    break
                await asyncio.sleep(0.05)
        _rewrite_for_job(config, tmp_path, simulator[1].url, metrics_url, job="quick", listen=listen)
        await daemon.reload()
        # The slow run stored, then two runs of the new job after it: the background store stores and
        # evaluates in order, so the slow run's detection is done too.
        async with asyncio.timeout(60):
            while True:
                jobs = [row.job for row in await _query(tmp_path, "SELECT job FROM runs ORDER BY started_at")]
                if "slow" in jobs and jobs[::-1].index("slow") >= 2:
                    break
                await asyncio.sleep(0.2)
        text = await _metrics_text(listen)
    finally:
        await daemon.stop()
    assert 'probe_job="quick"' in text
    assert 'probe_job="slow"' not in text, [line for line in text.splitlines() if 'probe_job="slow"' in line][:5]


async def test_a_reload_that_changes_the_location_keeps_the_running_one_and_says_so(
    simulator: tuple[Simulator, RunningSimulator], metrics_endpoint: tuple[MetricsEndpoint, str], tmp_path: Path
) -> None:
    # The metrics and telemetry are made for the location the daemon started with; the runs stored after a
    # reload took the new one, so each series was split in two, the old half's regression state kept for good.
    _, metrics_url = metrics_endpoint
    config = tmp_path / "config.yaml"
    _write_config(config, tmp_path, simulator[1].url, metrics_url, job="tick")
    await migrate.upgrade(f"sqlite+aiosqlite:///{tmp_path}/ttft.db")
    daemon = Daemon(str(config))
    await daemon.start()
    try:
        await _runs_finished(daemon, 1)
        config.write_text(config.read_text().replace("location: test", "location: elsewhere"))
        with capture_logs() as logs:
            await daemon.reload()
        await _runs_finished(daemon, 3)
        assert daemon.config.location == "test"
    finally:
        await daemon.stop()
    assert any(e["event"] == "reload_partial" and "location" in e["reason"] and e["keeping"] == "test" for e in logs), (
        logs
    )
    assert [row.location for row in await _query(tmp_path, "SELECT DISTINCT location FROM series")] == ["test"]
