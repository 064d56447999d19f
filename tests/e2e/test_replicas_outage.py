"""Two real daemons of one location on one PostgreSQL, through a real TCP proxy that cuts it.

While the database is away neither can claim a tick, so both probe every tick and spool it; after
it comes back both spools replay. The store keeps one run per (series, job, scheduled time), so the
history holds each tick once (docs/storage.md, "Each tick once").
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from monitor.store.engine import create_engine
from tests.conftest import SimProcess, start_sim, stop_sim
from tests.support.daemon import start_daemon, stop_daemon, upgrade, wait_ready, write_config
from tests.support.tcp_proxy import TcpProxy

POSTGRES_ENV = "TTFT_TEST_POSTGRES_URL"


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


def _admin(url: str, statement: str) -> None:
    async def execute() -> None:
        connection = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(execute())


def _query(url: str, sql: str) -> list[tuple]:
    async def read() -> list[tuple]:
        engine = create_engine(url)
        try:
            async with engine.connect() as connection:
                return [tuple(row) for row in (await connection.execute(text(sql))).all()]
        finally:
            await engine.dispose()

    return asyncio.run(read())


@pytest.fixture
def postgres_database() -> Iterator[str]:
    admin = os.environ.get(POSTGRES_ENV)
    if admin is None:
        pytest.skip(f"needs PostgreSQL: set {POSTGRES_ENV} (see tests/support/store_fixtures.py)")
    name = f"ttft_replicas_{uuid.uuid4().hex[:10]}"
    _admin(admin, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    finally:
        _admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _drained(daemon_log: Path) -> bool:
    return '"spool_drained"' in daemon_log.read_text()


@pytest.mark.realtime
@pytest.mark.timeout(120)  # two daemons, a cut of six ticks and their replays: about 40 s on a busy VM
def test_two_replicas_through_a_database_cut_store_each_tick_once(
    sim: SimProcess, tmp_path: Path, postgres_database: str
) -> None:
    direct = make_url(postgres_database)
    with TcpProxy(direct.host or "127.0.0.1", direct.port or 5432) as proxy:
        through_proxy = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        folders = [tmp_path / "a", tmp_path / "b"]
        configs = []
        for folder in folders:
            folder.mkdir()
            configs.append(write_config(folder, sim, db_url=through_proxy, schedule="* * * * * *", location="lab"))
        upgrade(configs[0])
        daemons = [start_daemon(config, folder, folder.name) for config, folder in zip(configs, folders, strict=True)]

        def spooled_runs() -> list[int]:
            return [sum(e["runs"] for e in d.events("results_spooled")) for d in daemons]

        try:
            for daemon in daemons:
                wait_ready(daemon)
                daemon.wait_for("job_finished", count=2)
            proxy.set_mode("cut")
            # Until each replica has spooled six runs (a fixed 12 s before): the first may be of a tick it
            # claimed just before the cut, the others of ticks nobody could claim.
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and min(spooled_runs()) < 6:
                time.sleep(0.2)
            proxy.set_mode("pass")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(_drained(d.log_path) for d in daemons):
                time.sleep(0.5)
            for daemon in daemons:  # a tick more from each after its replay
                daemon.wait_for("job_finished", count=len(daemon.events("job_finished")) + 1)
        finally:
            codes = [stop_daemon(daemon) for daemon in daemons]
        assert codes == [0, 0]
        spooled = spooled_runs()
        drained = [sum(e["runs"] for e in d.events("spool_drained")) for d in daemons]
        probed = [len(d.events("job_finished")) for d in daemons]

    # The cut made both replicas probe ticks nobody could claim, and spool them...
    assert min(spooled) >= 5, spooled
    unclaimed = _query(
        postgres_database,
        "SELECT count(*) FROM runs WHERE NOT EXISTS (SELECT 1 FROM job_ticks t "
        "WHERE t.job = runs.job AND t.scheduled_at = runs.intended_at)",
    )
    assert unclaimed[0][0] >= 5, unclaimed
    assert drained == spooled
    # ...and the history still holds each tick once.
    runs = _query(postgres_database, "SELECT series_id, job, intended_at FROM runs")
    assert len(runs) == len(set(runs)), f"{len(runs)} runs stored for {len(set(runs))} ticks"
    assert len(runs) >= max(probed)  # every tick a replica probed is there
    orphans = _query(postgres_database, "SELECT count(*) FROM samples WHERE run_id NOT IN (SELECT id FROM runs)")
    assert orphans == [(0,)]
    samples = _query(postgres_database, "SELECT count(*) FROM samples")
    assert samples == [(len(runs),)]  # rounds: 1, warmup: 0
