"""Detection reads its history from cold chunks and rows alike (Repository.history_rows), so housekeeping may
compact every day past 3 (`cold_after_days: auto`) while detection reads a week and more back: on a real
database (SQLite and PostgreSQL), a service keeping its histories across compactions decides exactly what one
on a twin database never compacted decides, run for run; and a compaction committing between the rows' and the
chunks' reads (PostgreSQL, READ COMMITTED) loses no run."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from monitor.detect.service import DetectionService
from monitor.store import cold
from monitor.store.engine import write_transaction
from monitor.store.models import DetectorStateRow, IncidentRow
from monitor.store.records import ADHOC_JOB, RunRecord, SeriesKey, runs_from_samples
from monitor.store.repository import Repository
from tests.support.detection import config, service_on
from tests.support.store_fixtures import PROVIDERS, Backend, make_samples

pytest_plugins = ("tests.support.store_fixtures",)
pytestmark = pytest.mark.timeout(300)

SERIES = SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short", "test-lab")
DAY0 = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday's midnight
JOB = "every-5m"


def run_at(at: datetime, slow: float = 1.0) -> list[tuple[RunRecord, list[Any]]]:
    samples = [
        dataclasses.replace(s, ttft_ms=s.ttft_ms * slow) if s.ttft_ms is not None else s
        for s in make_samples("qwen3-8b", "short", at=at, rounds=3, warmup=0)
    ]
    return runs_from_samples(samples, job=JOB, location="test-lab", provider_of=PROVIDERS)


async def _decided(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        states = await connection.execute(sa.select(DetectorStateRow.version, DetectorStateRow.state))
        incidents = await connection.execute(
            sa.select(IncidentRow.kind, IncidentRow.severity, IncidentRow.opened_at, IncidentRow.resolved_at)
        )
        return [tuple(row) for row in states] + [tuple(row) for row in incidents]


async def test_a_service_keeping_histories_across_compactions_decides_as_on_rows(
    backend: Backend, twin: Backend
) -> None:
    engines = {"compacted": backend.engine(), "rows": twin.engine()}
    repositories = {name: Repository(engine) for name, engine in engines.items()}
    services: dict[str, DetectionService] = {name: service_on(engine, config()) for name, engine in engines.items()}
    start = DAY0 + timedelta(days=10, hours=22)
    try:
        history = [
            r
            for k in range(int((start - DAY0) / timedelta(minutes=5)))
            for r in run_at(DAY0 + timedelta(minutes=5 * k))
        ]
        for repository in repositories.values():
            for offset in range(0, len(history), 1000):
                await repository.save_runs(history[offset : offset + 1000])
            await repository.rollup(start)
        # Days 0-6 into chunks: all but a day and a bit of what the first evaluation reads (8.3 days back).
        done = await repositories["compacted"].compact(start, cold_after_days=3, keep_runs=24)
        assert done.series_days == 7
        rereads = 0
        # Six hours of runs, past midnight, when day 7 is compacted under the history the service keeps; then
        # three hours 2.5x slower (a page).
        for k in range(6 * 12):
            at = start + timedelta(minutes=5 * k)
            batch = run_at(at, 2.5 if 30 <= k < 66 else 1.0)
            for name, repository in repositories.items():
                await repository.save_runs(batch)
                if name == "compacted" and at == start + timedelta(hours=2, minutes=10):
                    await repository.rollup(at)
                    assert (await repository.compact(at, cold_after_days=3, keep_runs=24)).series_days == 1
                with capture_logs() as logs:
                    await services[name].after_store(JOB, batch)
                if name == "compacted":
                    rereads += sum(1 for line in logs if line["event"] == "detection_history_reread")
            assert await _decided(engines["compacted"]) == await _decided(engines["rows"]), f"run at {at}"
        decided = await _decided(engines["compacted"])
        read = await repositories["compacted"].history_rows(SERIES, start - timedelta(days=8), at)
    finally:
        for engine in engines.values():
            await engine.dispose()
    assert read.from_chunks is not None and sum(read.from_chunks) > 0.6 * len(read.rows)
    # The day compacted under the kept history made it read again, once.
    assert rereads == 1
    assert [row[:2] for row in decided if len(row) == 4] == [("regression", "page")]  # it did decide something


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("between", ["any_chunk_of_series", "chunks_touching"])
async def test_a_compaction_committing_between_the_rows_and_the_chunks_read_loses_no_run(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, between: str, when: str
) -> None:
    """The history read in READ COMMITTED (detection's write transaction on PostgreSQL): the rows, then whether
    a chunk may hold some (`any_chunk_of_series`), then rows and chunks (`cold.read_runs`: the rows, then the chunks). A
    compaction of a day committing between two of them is seen twice (its runs as rows and in the chunk) and
    read once; read the other way round, it was seen by neither and its runs were missing from the history the
    service then kept for a week. (SQLite's transaction reads one snapshot: the compaction is not seen.)"""
    engine = backend.engine()
    other = backend.engine()
    repository = Repository(engine)
    try:
        runs = [r for k in range(4 * 288) for r in run_at(DAY0 + timedelta(minutes=5 * k))]
        for offset in range(0, len(runs), 1000):
            await repository.save_runs(runs[offset : offset + 1000])
        now = DAY0 + timedelta(days=4)
        await repository.rollup(now)
        if between == "chunks_touching":  # a chunk already, so the read goes through read_runs
            assert (await repository.compact(now - timedelta(days=2), cold_after_days=1)).series_days == 1
        whole = await repository.history_rows(SERIES, DAY0, now)
        real = getattr(cold, between)
        moved: list[int] = []

        async def compact_day_1() -> None:
            if not moved:  # another connection compacts day 1 and commits, between this read's statements
                async with other.begin() as connection:
                    series_id = await connection.scalar(sa.text("SELECT id FROM series"))
                    done = await cold.compact_series_day(connection, series_id, DAY0 + timedelta(days=1))
                moved.append(done.runs)

        async def compacting(*args: Any, **kwargs: Any) -> Any:
            if when == "before":
                await compact_day_1()
            found = await real(*args, **kwargs)
            if when == "after":
                await compact_day_1()
            return found

        monkeypatch.setattr(cold, between, compacting)
        async with engine.begin() as connection:
            read = await repository.history_rows(SERIES, DAY0, now, connection=connection)
        again = await repository.history_rows(SERIES, DAY0, now)
    finally:
        await engine.dispose()
        await other.dispose()
    assert moved == [288]
    assert read.rows == whole.rows and len(read.rows) == 4 * 288
    assert (
        again.rows == whole.rows
        and again.from_chunks is not None
        and sum(again.from_chunks) == 288 * (2 if between == "chunks_touching" else 1)
    )
    if backend.name == "postgres" and when == "before":  # it saw the compaction
        assert read.from_chunks is not None and sum(read.from_chunks) == sum(again.from_chunks)


async def _kept_and_fresh(
    service: DetectionService, repository: Repository, engine: AsyncEngine, at: datetime
) -> tuple[list[datetime], list[datetime]]:
    """The runs the service's kept history hands the detector for a run at `at`, and a fresh read's."""
    detector = service._detector(SERIES.target)
    since = detector.history_since(at, interval=timedelta(minutes=5))
    async with write_transaction(engine) as connection:
        kept = await service._history(SERIES, since, at, service._settings_generation, connection)
    fresh = await repository.history_rows(SERIES, since, at)
    return [point.at for point in kept.points(since, at)], [row[0] for row in fresh.rows]


async def _keep_history_at(service: DetectionService, engine: AsyncEngine, at: datetime) -> None:
    detector = service._detector(SERIES.target)
    since = detector.history_since(at, interval=timedelta(minutes=5))
    async with write_transaction(engine) as connection:
        await service._history(SERIES, since, at, service._settings_generation, connection)


@pytest.mark.parametrize("case", ["late run in a compacted day", "sparse runs", "retention under the history"])
async def test_a_kept_history_notices_what_the_chunks_changed_under_it(backend: Backend, case: str) -> None:
    """The kept history checks its rows against the database's and, in the same statement, the series' chunks'
    edges (Repository.history_since_span): without the second, it went on without runs a fresh read has.
    - A late run of a compacted day evaluated (an ad-hoc one, a spool's replay): kept with its last run days
      back, the next evaluation read only the rows after it, 431 runs of chunks short.
    - Runs further apart than `cold_after_days` (a weekly job): the previous run is compacted before the next
      evaluation, which read only rows after the last kept run, and never had it.
    - Retention dropping a chunk inside the history (raw_days shorter than detection's reach): the kept
      history still had its 340 runs."""
    engine = backend.engine()
    repository = Repository(engine)
    service = service_on(engine, config())
    days = 10 if case == "retention under the history" else 8
    try:
        runs = [r for k in range(days * 288) for r in run_at(DAY0 + timedelta(minutes=5 * k))]
        for offset in range(0, len(runs), 1000):
            await repository.save_runs(runs[offset : offset + 1000])
        now = DAY0 + timedelta(days=days)
        if case == "late run in a compacted day":
            await repository.rollup(now)
            assert (await repository.compact(now, cold_after_days=3)).series_days == 5
            late = runs_from_samples(
                make_samples("qwen3-8b", "short", at=DAY0 + timedelta(days=3, hours=12, seconds=150), rounds=3),
                job=ADHOC_JOB,
                location="test-lab",
                provider_of=PROVIDERS,
            )
            await repository.save_runs(late)
            await _keep_history_at(service, engine, late[0][0].started_at)
            kept, fresh = await _kept_and_fresh(service, repository, engine, now)
        elif case == "sparse runs":
            first = DAY0 + timedelta(days=11, hours=12)
            await repository.rollup(first)
            await repository.compact(first, cold_after_days=3)
            await repository.save_runs(run_at(first))
            await _keep_history_at(service, engine, first)  # the first run's evaluation: every run kept is a chunk's
            second = DAY0 + timedelta(days=15, hours=12)
            await repository.rollup(second)
            assert (await repository.compact(second, cold_after_days=3)).series_days >= 1  # the first run's day
            await repository.save_runs(run_at(second))
            kept, fresh = await _kept_and_fresh(service, repository, engine, second)
            assert first in {moment.replace(second=0, microsecond=0) for moment in kept}
        else:
            await repository.rollup(now)
            assert (await repository.compact(now, cold_after_days=3)).series_days == 7
            await _keep_history_at(service, engine, now)
            assert (await repository.prune(now, raw_days=7, rollup_days=30)).cold_days == 3
            await repository.save_runs(run_at(now))
            kept, fresh = await _kept_and_fresh(service, repository, engine, now + timedelta(minutes=5))
    finally:
        await engine.dispose()
    assert kept == fresh and len(fresh) > 100
