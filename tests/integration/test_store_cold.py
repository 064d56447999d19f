"""The cold tier on both databases (monitor/store/cold.py): compaction keeps every run and sample readable, the
same as before it, through late runs, a second compaction, a crash mid-way and retention."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.probe.result import ErrorClass
from monitor.store import cold, migrate, partitions
from monitor.store.models import COLD_CHUNKS, RUNS, SAMPLES
from monitor.store.records import (
    ADHOC_JOB,
    ROLLUP_RUN_MEDIANS,
    ROLLUP_SAMPLE_MEDIANS,
    HourlyStats,
    RunRecord,
    SeriesKey,
    floor_hour,
    hourly_stats,
)
from monitor.store.repository import Repository
from tests.support.store_fixtures import T0, Backend, make_batch

pytest_plugins = ("tests.support.store_fixtures",)

DAY0 = cold.day_of(T0)
QWEN_SHORT = SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short", "test-lab")
GPT_LONG = SeriesKey("gpt-4o-mini", "openai", "gpt-4o-mini", "long", "test-lab")
ADHOC = SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short", "adhoc-lab")
SERIES = (QWEN_SHORT, GPT_LONG, ADHOC)
# Three days of runs every 3 hours; the first two are compacted, the third is not old enough.
NOW = DAY0 + timedelta(days=12, hours=1)
COLD_AFTER_DAYS = 10
EVERYTHING = (DAY0 - timedelta(days=1), DAY0 + timedelta(days=4))


def history() -> list[tuple[RunRecord, list[Any]]]:
    """Four scheduled series and an ad-hoc one over three days: failed rounds, warm-ups, absent fields."""
    batch = []
    for tick in range(24):
        at = T0 + timedelta(hours=3 * tick)
        errors = {2: ErrorClass.TIMEOUT_TOTAL, 4: ErrorClass.SERVER_ERROR} if tick % 5 == 0 else None
        batch += make_batch(at, errors=errors)
        if tick % 7 == 0:
            batch += make_batch(at + timedelta(minutes=1), targets=("qwen3-8b",), prompts=("short",),
                                job=ADHOC_JOB, location="adhoc-lab", rounds=2, warmup=0)  # fmt: skip
    return batch


async def count(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as connection:
        return int(await connection.scalar(sa.text(f"SELECT count(*) FROM {table}")) or 0)


async def readings(repository: Repository) -> dict[str, Any]:
    """What every store reader gives of the whole history and of parts of it."""
    out: dict[str, Any] = {}
    for series in SERIES:
        name = f"{series.target}/{series.prompt}/{series.location}"
        out[f"load {name}"] = await repository.load_runs(series, *EVERYTHING)
        out[f"between {name}"] = await repository.runs_between(series, *EVERYTHING)
        out[f"part {name}"] = await repository.runs_between(series, T0 + timedelta(hours=20), T0 + timedelta(hours=50))
        out[f"last {name}"] = await repository.last_runs(series, 5)
        out[f"last many {name}"] = await repository.last_runs(series, 40)
        out[f"hourly {name}"] = await repository.hourly_percentiles(series, *EVERYTHING)
        out[f"history {name}"] = (await repository.history_rows(series, *EVERYTHING)).rows
        part = (T0 + timedelta(hours=20), T0 + timedelta(hours=50))
        out[f"history part {name}"] = (await repository.history_rows(series, *part)).rows
    return out


async def filled(engine: AsyncEngine) -> Repository:
    repository = Repository(engine)
    await repository.save_runs(history())
    await repository.rollup(NOW)
    return repository


def test_the_chunks_layout_is_the_tables_columns() -> None:
    """A migration that changes runs or samples must add a layout (cold.LAYOUTS), or chunks would read wrong."""
    runs, samples = cold.LAYOUTS[cold.LAYOUT]
    assert runs == tuple(column.name for column in RUNS.c)
    assert samples == tuple(column.name for column in SAMPLES.c)


async def test_every_reader_gives_the_same_runs_and_samples_after_compaction(engine: AsyncEngine) -> None:
    repository = await filled(engine)
    before = await readings(repository)
    rows_before = await count(engine, "samples")
    done = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    # Two of the three days, every series that ran in them.
    assert done.series_days == 2 * 5
    assert done.duplicates == 0
    assert await count(engine, "cold_chunks") == 10
    left = await count(engine, "samples")
    assert left + done.samples == rows_before
    assert 0 < left < rows_before
    after = await readings(repository)
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] == before[key], key


async def test_the_one_series_look_for_chunks_answers_as_the_general_one(engine: AsyncEngine) -> None:
    """Detection asks `any_chunk_of_series` (a statement run directly on SQLite); every other reader `any_chunk`."""
    repository = await filled(engine)
    await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    async with engine.begin() as connection:
        ids = [row[0] for row in await connection.execute(sa.text("SELECT id FROM series ORDER BY id"))]
        windows = [
            (DAY0 - timedelta(days=3), DAY0 - timedelta(days=2)),
            (DAY0 - timedelta(hours=1), DAY0 + timedelta(hours=1)),
            (DAY0 + timedelta(days=1, hours=23), DAY0 + timedelta(days=2, hours=1)),
            (DAY0 + timedelta(days=2, hours=12), DAY0 + timedelta(days=3)),
            (DAY0 + timedelta(days=5), DAY0 + timedelta(days=6)),
            (datetime(1970, 1, 1, tzinfo=UTC), DAY0 + timedelta(days=9)),
        ]
        answers = [
            (
                await cold.any_chunk_of_series(connection, series_id, *window),
                await cold.any_chunk(connection, [series_id], *window),
            )
            for series_id in ids
            for window in windows
        ]
    assert all(one == general for one, general in answers)
    assert {one for one, _ in answers} == {True, False}


async def test_compaction_is_idempotent_and_a_crash_before_its_commit_leaves_the_rows(engine: AsyncEngine) -> None:
    repository = await filled(engine)
    before = await readings(repository)
    # A crash between writing a chunk and deleting its rows: the transaction rolls back, as a lost connection's does.
    async with engine.connect() as connection:
        transaction = await connection.begin()
        series_id = await connection.scalar(sa.text("SELECT min(id) FROM series"))
        written = await cold.compact_series_day(connection, series_id, DAY0)
        assert written.runs > 0
        await transaction.rollback()
    assert await count(engine, "cold_chunks") == 0
    assert await readings(repository) == before
    first = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    again = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    assert first.samples > 0 and dataclasses.astuple(again) == (0, 0, 0, 0, 0, 0)
    assert await readings(repository) == before


async def test_a_late_run_of_a_compacted_day_is_read_beside_its_chunk_and_folded_in_later(
    engine: AsyncEngine,
) -> None:
    repository = await filled(engine)
    await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    hour = floor_hour(T0 + timedelta(hours=3))
    [rolled] = await repository.rollups_between(QWEN_SHORT, hour, hour + timedelta(hours=1))
    # Drained from a spool after an outage: a run of a new tick on the compacted day, and a replica's second
    # run of a tick the chunk holds (the rows' one-run-per-tick key cannot see the chunk).
    late = make_batch(hour + timedelta(minutes=30), targets=("qwen3-8b",), prompts=("short",))
    [(held, held_samples)] = [
        (run, samples)
        for run, samples in await repository.load_runs(QWEN_SHORT, hour, hour + timedelta(hours=1))
        if run.job != ADHOC_JOB
    ]
    second = make_batch(held.intended_at, targets=("qwen3-8b",), prompts=("short",))
    assert second[0][0].run_id != held.run_id
    expected = sorted([*(await readings_of(repository, hour)), late[0]], key=lambda pair: pair[0].started_at)
    await repository.save_runs(late + second)
    with_late = await repository.load_runs(QWEN_SHORT, hour, hour + timedelta(hours=1))
    assert [run.run_id for run, _ in with_late] == [run.run_id for run, _ in expected]
    assert held in [run for run, _ in with_late] and second[0][0].run_id not in {run.run_id for run, _ in with_late}
    # Detection's history reads them so too: the late run beside the chunk's, not the replica's second run.
    history = await repository.history_rows(QWEN_SHORT, hour, hour + timedelta(hours=1))
    assert [row[0] for row in history.rows] == [run.started_at for run, _ in with_late]
    assert history.from_chunks == [run.run_id != late[0][0].run_id for run, _ in with_late]
    # The hour's rollup is made again from the chunk and the late run: as if every sample were rows.
    assert await repository.rollup(NOW) == 1
    [again] = await repository.rollups_between(QWEN_SHORT, hour, hour + timedelta(hours=1))
    measured = [
        (s.ttft_ms, s.error.value if s.error else None, s.decode_tps, *(getattr(s, n) for n in ROLLUP_SAMPLE_MEDIANS))
        for _, samples in with_late
        for s in samples
        if not s.warmup
    ]
    runs = [tuple(getattr(run, name) for name in ROLLUP_RUN_MEDIANS) for run, _ in with_late]
    assert_same(again, hourly_stats(hour, measured, [r for r in runs if any(v is not None for v in r)]))
    assert again.samples == rolled.samples + 5
    before = await readings(repository)
    folded = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    assert (folded.series_days, folded.runs, folded.duplicates) == (1, 1, 1)
    async with engine.connect() as connection:
        assert not await connection.scalar(
            sa.select(sa.func.count()).select_from(RUNS).where(RUNS.c.intended_at < DAY0 + timedelta(days=2))
        )
    assert await readings(repository) == before
    assert held_samples == dict(await repository.load_runs(QWEN_SHORT, hour, hour + timedelta(hours=1)))[held]


async def readings_of(repository: Repository, hour: datetime) -> list[tuple[RunRecord, list[Any]]]:
    return await repository.load_runs(QWEN_SHORT, hour, hour + timedelta(hours=1))


def assert_same(actual: HourlyStats, wanted: HourlyStats) -> None:
    for field in dataclasses.fields(HourlyStats):
        a, w = getattr(actual, field.name), getattr(wanted, field.name)
        if isinstance(w, float) and a is not None:
            assert a == pytest.approx(w, rel=1e-9), field.name
        else:
            assert a == w, field.name


async def test_retention_drops_the_chunks_of_days_past_raw_days(engine: AsyncEngine) -> None:
    repository = await filled(engine)
    done = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    runs_rows, samples_rows = await count(engine, "runs"), await count(engine, "samples")
    # 30 days after the second day ended: both compacted days go, the third day's rows stay.
    pruned = await repository.prune(DAY0 + timedelta(days=32), raw_days=30, rollup_days=400)
    assert (pruned.cold_days, pruned.runs, pruned.samples) == (done.series_days, done.runs, done.samples)
    assert await count(engine, "cold_chunks") == 0
    assert (await count(engine, "runs"), await count(engine, "samples")) == (runs_rows, samples_rows)
    later = await repository.prune(DAY0 + timedelta(days=34), raw_days=30, rollup_days=400)
    assert (later.runs, later.samples) == (runs_rows, samples_rows)


async def test_a_day_held_by_its_pending_rollup_is_not_compacted(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    await repository.save_runs(history())
    done = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)  # nothing rolled up yet
    assert done.series_days == 0 and await count(engine, "cold_chunks") == 0


async def test_postgresql_drops_a_compacted_days_partitions_and_a_late_run_lands_beside_its_chunk(
    postgres_backend: Backend,
) -> None:
    engine = postgres_backend.engine()
    try:
        await partitions.ensure_days(engine, [(DAY0 + timedelta(days=n)).date() for n in range(3)])
        repository = await filled(engine)
        before = await readings(repository)
        done = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
        assert done.days_dropped == 2
        async with engine.connect() as connection:
            left = await partitions.existing(connection, "runs")
        assert partitions.partition_name("runs", DAY0.date()) not in left
        assert partitions.partition_name("runs", (DAY0 + timedelta(days=2)).date()) in left
        assert await readings(repository) == before
        late = make_batch(T0 + timedelta(hours=1), targets=("qwen3-8b",), prompts=("short",))
        await repository.save_runs(late)
        assert late[0][0].run_id in {run.run_id for run in await repository.runs_between(QWEN_SHORT, *EVERYTHING)}
    finally:
        await engine.dispose()


async def test_the_migration_refuses_to_drop_stored_chunks(backend: Backend) -> None:
    engine = backend.engine()
    try:
        repository = await filled(engine)
        await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
        with pytest.raises(RuntimeError, match="cold_chunks holds 10 compacted series-days"):
            await migrate.downgrade(engine, "0020")
        await repository.prune(DAY0 + timedelta(days=40), raw_days=30, rollup_days=400)
        assert await migrate.downgrade(engine, "0020") == (migrate.head(), "0020")
        assert await migrate.upgrade(engine) == ("0020", migrate.head())
    finally:
        await engine.dispose()


async def test_housekeeping_compacts_after_the_rollup_a_bounded_number_of_series_days_a_pass(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monitor.config.models import ColdPolicy, Database
    from monitor.schedule import maintenance

    monkeypatch.setattr(maintenance, "COMPACT_PER_PASS", 4)
    engine = backend.engine()
    try:
        repository = Repository(engine)
        await repository.save_runs(history())  # not rolled up: the pass rolls up first, then compacts
        before = await readings(repository)
        database = Database(url=backend.url)
        policy = ColdPolicy(after_days=COLD_AFTER_DAYS)
        passes = [await maintenance.maintain_once(repository, database, cold=policy, now=NOW) for _ in range(4)]
        assert [done["series_days_compacted"] for done in passes] == [4, 4, 2, 0]
        assert sum(done["samples_compacted"] for done in passes) > 0
        assert await readings(repository) == before
        # Without a policy (`off`, or retention too short for one) nothing is compacted.
        await repository.save_runs(make_batch(T0 + timedelta(hours=1), targets=("qwen3-8b",), prompts=("short",)))
        assert (await maintenance.maintain_once(repository, database, now=NOW))["series_days_compacted"] == 0
    finally:
        await engine.dispose()


async def chunk_days(engine: AsyncEngine) -> dict[str, list[int]]:
    """Per series' target, the days (since DAY0) the cold tier holds."""
    async with engine.connect() as connection:
        rows = await connection.execute(
            sa.select(sa.text("series.target"), COLD_CHUNKS.c.day).select_from(
                COLD_CHUNKS.join(sa.text("series"), sa.text("series.id = cold_chunks.series_id"))
            )
        )
        found: dict[str, list[int]] = {}
        for target, day in rows:
            day = day if isinstance(day, datetime) else datetime.fromisoformat(day)
            day = day if day.tzinfo else day.replace(tzinfo=DAY0.tzinfo)
            found.setdefault(target, []).append((day - DAY0).days)
        return {target: sorted(days) for target, days in found.items()}


async def test_auto_compacts_each_series_only_past_its_newest_runs(backend: Backend) -> None:
    """`cold_after_days: auto`: a series probed every hour and one probed every 12 hours (another location's
    slow job this daemon's config does not know) over 12 days; each keeps its newest `keep_runs` runs as rows,
    on top of the floor of `cold_after_days`."""
    engine = backend.engine()
    try:
        repository = Repository(engine)
        batch = []
        for hour in range(12 * 24):
            at = T0 + timedelta(hours=hour)
            batch += make_batch(at, targets=("qwen3-8b",), prompts=("short",))
            if hour % 12 == 0:
                batch += make_batch(at, targets=("gpt-4o-mini",), prompts=("short",))
        await repository.save_runs(batch)
        now = DAY0 + timedelta(days=12, hours=6)
        await repository.rollup(now)
        before = await readings(repository)
        # The hourly series' 10th newest run started 9 h before its last (day 11, 14:09), so days 0-10 may go; the
        # floor (3 days before now: day 9, 06:00) keeps day 9 and after. The 12-hourly series' 10th newest started
        # on day 7 at 9:00 (day 11 21:00 less 4.5 days), so days 0-6 go.
        done = await repository.compact(now, cold_after_days=3, keep_runs=10)
        assert await chunk_days(engine) == {"qwen3-8b": list(range(9)), "gpt-4o-mini": list(range(7))}
        assert done.series_days == 9 + 7
        assert await readings(repository) == before
        # A series with fewer runs as rows than it keeps loses none of them: `keep_runs` past what any has.
        again = await repository.compact(now + timedelta(days=30), cold_after_days=3, keep_runs=10_000)
        assert again.series_days == 0
        # The limit counts the pairs kept, not those looked at.
        more = await repository.compact(now + timedelta(days=2), cold_after_days=1, keep_runs=10, limit=2)
        assert more.series_days == 2
    finally:
        await engine.dispose()


async def test_a_replicas_late_run_of_a_held_tick_is_left_out_even_where_its_chunk_has_no_run_in_the_window(
    engine: AsyncEngine,
) -> None:
    repository = await filled(engine)
    await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    # The day's last tick; the other replica probed it late (its run started 40 minutes after it): no run of
    # the chunk started in a window around that start.
    day = [run for run in await repository.runs_between(QWEN_SHORT, DAY0, DAY0 + cold.DAY) if run.job != ADHOC_JOB]
    held = day[-1]
    [(run, samples)] = make_batch(held.intended_at, targets=("qwen3-8b",), prompts=("short",))
    late = dataclasses.replace(run, started_at=held.started_at + timedelta(minutes=40))
    await repository.save_runs([(late, samples)])
    window = (held.started_at + timedelta(minutes=30), held.started_at + timedelta(minutes=50))
    assert await repository.runs_between(QWEN_SHORT, *window) == []
    assert await repository.load_runs(QWEN_SHORT, *window) == []
    assert (await repository.history_rows(QWEN_SHORT, *window)).rows == []
    assert await repository.last_runs(QWEN_SHORT, 200) == [*(await repository.last_runs(QWEN_SHORT, 200))]
    await repository.rollup(NOW)  # its hour was marked for a new rollup; compaction waits for it
    folded = await repository.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    assert folded.duplicates == 1 and await repository.runs_between(QWEN_SHORT, *window) == []
