"""Attacks on the cold tier's `auto` default (database.retention.cold_after_days: auto): what housekeeping compacts
must stay out of what every rows-only reader still reads, and the readers made cheap for it must answer as a
full read does. On SQLite and PostgreSQL, real databases; each test states the defect it pins."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from monitor.store.records import RunRecord, SeriesKey
from monitor.store.repository import Repository
from monitor.web import queries
from tests.support.store_fixtures import T0, Backend, PostgresServer, make_batch

pytest_plugins = ("tests.support.store_fixtures",)
pytestmark = pytest.mark.timeout(240)

SERIES = SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short", "test-lab")


def runs_at(moments: list[datetime], *, job: str = "probe") -> list[tuple[RunRecord, list[Any]]]:
    batch = []
    for at in moments:
        batch += make_batch(at, targets=("qwen3-8b",), prompts=("short",), job=job, rounds=1, warmup=0)
    return batch


async def save(repository: Repository, batch: list[tuple[RunRecord, list[Any]]]) -> None:
    for offset in range(0, len(batch), 500):
        await repository.save_runs(batch[offset : offset + 500])


# ---------------------------------------------------------------- the overview's note of a series without a baseline


@pytest.fixture
async def twin(backend: Backend, tmp_path: Path, postgres_server: PostgresServer | None) -> AsyncIterator[Backend]:
    """A second database of the test's backend, migrated: the never compacted one to compare with."""
    if backend.name == "sqlite":
        path = Path(sa.engine.make_url(backend.url).database or "")
        shutil.copyfile(path, tmp_path / "twin.db")
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'twin.db'}")
        return
    assert postgres_server is not None
    url = await postgres_server.create()
    try:
        yield Backend("postgres", url)
    finally:
        await postgres_server.drop(url)


async def test_a_series_back_with_a_burst_after_its_days_were_compacted_keeps_its_overview_note(
    backend: Backend, twin: Backend
) -> None:
    """A series that ran every 4 hours for 10 days, went quiet (a location down) and came back probing every
    minute: no baseline (nothing in the week before the last hour), 30 runs in the last hour, and its first days
    compacted. Its runs in the month say `no runs in the day before the last hour`, compacted or not; counted
    with `enough` the last hour's 30 rows reached the baseline's minimum and their first start stood for the
    series' first run: `first hour: from 09:31 UTC`, as if the series had just started."""
    now = T0 + timedelta(days=25)
    batch = runs_at([T0 + timedelta(hours=4 * k) for k in range(60)])
    batch += runs_at([now - timedelta(minutes=minute) for minute in range(29, -1, -1)])
    engines = [backend.engine(), twin.engine()]
    try:
        compacted, rows = (Repository(engine) for engine in engines)
        for repository in (compacted, rows):
            await save(repository, batch)
            await repository.rollup(now)
            await repository.refresh_overview_summary(now)
        done = await compacted.compact(now, cold_after_days=9)
        assert done.series_days == 11
        shown = await queries.overview(compacted.engine, now=now)
        expected = await queries.overview(rows.engine, now=now)
        assert [row["baseline_note"] for row in expected] == ["no runs in the day before the last hour"]
        assert shown == expected
    finally:
        for engine in engines:
            await engine.dispose()
