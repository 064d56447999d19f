"""Attacks on the cold tier's `auto` default (database.retention.cold_after_days: auto): what housekeeping compacts
must stay out of what every rows-only reader still reads, and the readers made cheap for it must answer as a
full read does. On SQLite and PostgreSQL, real databases; each test states the defect it pins."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from monitor.store import cold
from monitor.store.models import RUNS
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


# ---------------------------------------------------------------- auto's cost with many series


async def test_auto_looks_each_series_reach_up_a_hundred_series_a_statement(backend: Backend) -> None:
    """Every housekeeping pass looks up the reach of every series with a candidate day (at steady state, every
    series: its days between the floor and its detection's reach). A statement each took 13-20 s a pass at
    5,000 series on PostgreSQL (each planned over every day partition: plan_cache_mode force_custom_plan) and 5-7 s
    on SQLite; a hundred a statement, 1 s and 0.2 s. 150 hourly series and 150 every 4 hours over 14 days: the
    hourly ones' first two days go, the others' none (their 61st newest run is 10 days old)."""
    engine = backend.engine()
    try:
        statements: list[str] = []
        async with engine.begin() as connection:
            await connection.execute(
                sa.text(
                    "INSERT INTO series (target, provider, model, prompt, location) VALUES (:t, 'p', 'm', 's', 'l')"
                ),
                [{"t": f"t{k:03d}"} for k in range(300)],
            )
            ids = list(await connection.scalars(sa.text("SELECT id FROM series ORDER BY target")))
            day0 = cold.day_of(T0)
            rows = []
            for index, series_id in enumerate(ids):
                every = 1 if index % 2 == 0 else 4
                for hour in range(0, 14 * 24, every):
                    at = day0 + timedelta(hours=hour, minutes=7)
                    rows.append({
                        "id": uuid.uuid4(), "series_id": series_id, "job": "probe", "api": "openai-chat",
                        "intended_at": at, "started_at": at + timedelta(seconds=1),
                        "finished_at": at + timedelta(seconds=3), "rounds": 1, "warmup": 0, "ok": 1, "errors": 0,
                        "ttft_p50_ms": 300.0,
                    })  # fmt: skip
            await connection.execute(RUNS.insert(), rows)

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            statements.append(statement)

        sa.event.listen(engine.sync_engine, "before_cursor_execute", count)
        done = await Repository(engine).compact(
            day0 + timedelta(days=14, minutes=30), cold_after_days=8, keep_runs=61, lookback_s=782400.0
        )
        sa.event.remove(engine.sync_engine, "before_cursor_execute", count)
        assert done.series_days == 150 * 2
        lookups = [statement for statement in statements if "OFFSET" in statement.upper()]
        assert len(lookups) <= 3, len(lookups)
    finally:
        await engine.dispose()
