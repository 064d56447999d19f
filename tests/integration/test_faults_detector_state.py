"""The detector state's `version` is a real compare-and-set: concurrent writers lose no update.

Two detection services on two engines (two daemons on one database, as replicas are) evaluate the
runs of one series at the same time, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import select

from monitor.config.models import Config
from monitor.detect.service import DetectionService
from monitor.store.models import DetectorStateRow
from monitor.store.repository import Repository
from tests.support.store_fixtures import T0, Backend, make_batch

pytest_plugins = ("tests.support.store_fixtures",)
RUNS = 16


async def test_two_concurrent_writers_count_every_evaluation_once(backend: Backend) -> None:
    engines = [backend.engine(), backend.engine()]
    try:
        repository = Repository(engines[0])
        batches = [
            make_batch(T0 + timedelta(minutes=5 * i), targets=("qwen3-8b",), prompts=("short",), job="every-5m")
            for i in range(RUNS)
        ]
        for batch in batches:
            await repository.save_runs(batch)
        services = [
            DetectionService(engine, Repository(engine), Config(), outbox=None, metrics=None) for engine in engines
        ]
        # Every run evaluated by one of the two writers, all at once.
        await asyncio.gather(*(services[i % 2].after_store("every-5m", batch) for i, batch in enumerate(batches)))
        async with engines[1].connect() as connection:
            versions = (await connection.execute(select(DetectorStateRow.version))).scalars().all()
    finally:
        for engine in engines:
            await engine.dispose()
    # One state row for the series; each evaluation moved it exactly one version on (none overwritten).
    assert versions == [RUNS]
