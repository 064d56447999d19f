"""PostgreSQL's day partitions of runs and samples: made ahead by housekeeping, rows that went to the
default partition moved into their day when it is made, whole days dropped by retention (never one
with a run younger than the cutoff, never while a reader holds the tables), nothing lost or doubled."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.config.models import Database
from monitor.probe.result import Sample
from monitor.schedule.maintenance import maintain_once
from monitor.store import partitions
from monitor.store.records import runs_from_samples
from monitor.store.repository import Repository
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)


def probe(at: datetime, *, late_s: float = 0.0, rounds: int = 3) -> list[Sample]:
    """A run scheduled at `at` that started `late_s` later."""
    sent = at + timedelta(seconds=late_s)
    return [
        Sample(
            target="t",
            model="m",
            api="openai-chat",
            prompt="p",
            round=index + 1,
            intended_at=at,
            sent_at=sent + timedelta(seconds=index),
            ttft_ms=200.0 + index,
            total_ms=300.0,
            http_status=200,
        )
        for index in range(rounds)
    ]


async def store(repository: Repository, at: datetime, *, late_s: float = 0.0) -> None:
    batch = runs_from_samples(probe(at, late_s=late_s), job="j", location="l", provider_of={"t": "p"}, now=at)
    await repository.save_runs(batch)


async def placement(engine: AsyncEngine, table: str) -> dict[str, int]:
    async with engine.connect() as connection:
        rows = await connection.execute(sa.text(f"SELECT tableoid::regclass::text, count(*) FROM {table} GROUP BY 1"))
        return {name: count for name, count in rows}


async def partition_names(engine: AsyncEngine, table: str) -> set[str]:
    async with engine.connect() as connection:
        return set(await partitions.existing(connection, table))


async def test_housekeeping_makes_the_coming_days_once(postgres_backend: Backend) -> None:
    engine = postgres_backend.engine()
    try:
        repository = Repository(engine)
        later = datetime.now(UTC) + timedelta(days=20)  # past what the migration made ahead
        created = await repository.ensure_partitions(later)
        wanted = partitions.days_around(later)
        names = [partitions.partition_name(table, day) for table in partitions.PARTITIONED for day in wanted]
        assert sorted(created) == sorted(names)
        assert await repository.ensure_partitions(later) == []
        for table in partitions.PARTITIONED:
            assert {partitions.partition_name(table, day) for day in wanted} <= await partition_names(engine, table)
    finally:
        await engine.dispose()


async def test_rows_of_a_day_without_its_partition_wait_in_the_default_and_move_in_when_it_is_made(
    postgres_backend: Backend,
) -> None:
    engine = postgres_backend.engine()
    try:
        repository = Repository(engine)
        far = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)  # a clock far ahead: no day yet
        await store(repository, far)
        await store(repository, far + timedelta(minutes=5))
        assert await placement(engine, "runs") == {"runs_default": 2}
        assert await placement(engine, "samples") == {"samples_default": 6}
        await repository.ensure_partitions(far)
        day = partitions.partition_name("runs", far.date())
        assert await placement(engine, "runs") == {day: 2}
        assert await placement(engine, "samples") == {partitions.partition_name("samples", far.date()): 6}
        # And the runs read as before, with their samples.
        [series] = await repository.series_list()
        loaded = await repository.load_runs(series, far - timedelta(hours=1), far + timedelta(hours=1))
        assert [len(samples) for _, samples in loaded] == [3, 3]
    finally:
        await engine.dispose()


async def test_retention_drops_whole_aged_days_and_keeps_a_day_with_a_late_run(postgres_backend: Backend) -> None:
    engine = postgres_backend.engine()
    try:
        repository = Repository(engine)
        now = datetime.now(UTC).replace(microsecond=0)
        aged = (now - timedelta(days=40)).replace(hour=12, minute=0, second=0)
        late = (now - timedelta(days=31)).replace(hour=23, minute=55, second=0)
        await repository.ensure_partitions(aged)
        await repository.ensure_partitions(late)
        await store(repository, aged)
        await store(repository, aged + timedelta(hours=1))
        # Scheduled on day -31 but started a day later: its day must wait until it has aged too.
        await store(repository, late, late_s=timedelta(days=1, hours=1).total_seconds())
        await repository.rollup(now)  # nothing pending holds them back
        pruned = await repository.prune(now, raw_days=30, rollup_days=400)
        names = await partition_names(engine, "runs")
        assert partitions.partition_name("runs", aged.date()) not in names
        assert partitions.partition_name("samples", aged.date()) not in await partition_names(engine, "samples")
        assert pruned.days_dropped >= 1
        assert (pruned.runs, pruned.samples) == (2, 6)  # the aged day's, exactly
        assert partitions.partition_name("runs", late.date()) in names
        [series] = await repository.series_list()
        assert [r.intended_at for r in await repository.last_runs(series, 10)] == [late]
        # A day later the late run has aged as well.
        pruned = await repository.prune(now + timedelta(days=2), raw_days=30, rollup_days=400)
        assert (pruned.runs, pruned.samples) == (1, 3)
        assert await repository.last_runs(series, 10) == []
    finally:
        await engine.dispose()


async def test_a_reader_holding_the_tables_delays_the_drop_to_the_next_pass_without_failing_it(
    postgres_backend: Backend,
) -> None:
    engine = postgres_backend.engine()
    reader = postgres_backend.engine()
    try:
        repository = Repository(engine)
        now = datetime.now(UTC).replace(microsecond=0)
        aged = (now - timedelta(days=40)).replace(hour=12, minute=0, second=0)
        await repository.ensure_partitions(aged)
        await store(repository, aged)
        await repository.rollup(now)
        async with reader.connect() as held:
            await held.execute(sa.text("BEGIN"))
            await held.execute(sa.text("SELECT count(*) FROM runs"))  # holds every partition until it ends
            began = asyncio.get_running_loop().time()
            pruned = await repository.prune(now, raw_days=30, rollup_days=400)
            waited = asyncio.get_running_loop().time() - began
            await held.execute(sa.text("ROLLBACK"))
        assert (pruned.days_dropped, pruned.runs) == (0, 0)
        assert waited < 15  # the drop's lock timeout (2 s), not the reader's length
        pruned = await repository.prune(now, raw_days=30, rollup_days=400)
        assert (pruned.runs, pruned.samples) == (1, 3)
        assert pruned.days_dropped == len(partitions.days_around(aged))  # the aged day and its empty neighbours
        assert partitions.partition_name("runs", aged.date()) not in await partition_names(engine, "runs")
    finally:
        await reader.dispose()
        await engine.dispose()


async def test_maintenance_reports_the_days_it_made_and_dropped(postgres_backend: Backend) -> None:
    engine = postgres_backend.engine()
    try:
        repository = Repository(engine)
        now = datetime.now(UTC) + timedelta(days=12)
        done = await maintain_once(repository, Database(url=postgres_backend.url), now=now)
        assert done["partitions_created"] > 0
        assert done["days_dropped"] == 0
        again = await maintain_once(repository, Database(url=postgres_backend.url), now=now)
        assert again["partitions_created"] == 0
    finally:
        await engine.dispose()


def test_partition_names_and_days_read_back() -> None:
    day = date(2026, 12, 6)
    assert partitions.partition_name("runs", day) == "runs_p20261206"
    assert partitions.day_of("samples_p20261206") == day
    assert partitions.day_of("runs_default") is None and partitions.is_partition("runs_default")
    assert not partitions.is_partition("runs") and not partitions.is_partition("rollups_hourly")
    assert partitions.day_bounds(day) == (datetime(2026, 12, 6, tzinfo=UTC), datetime(2026, 12, 7, tzinfo=UTC))
    cutoff = datetime(2026, 12, 8, 0, 0, tzinfo=UTC)
    assert partitions.droppable_days([date(2026, 12, 7), day, date(2026, 12, 8)], cutoff=cutoff) == [
        day,
        date(2026, 12, 7),
    ]


async def test_two_daemons_housekeeping_at_once_make_and_drop_each_day_once(postgres_backend: Backend) -> None:
    engines = [postgres_backend.engine(), postgres_backend.engine()]
    try:
        one, other = (Repository(engine) for engine in engines)
        now = datetime.now(UTC).replace(microsecond=0)
        aged = (now - timedelta(days=40)).replace(hour=12, minute=0, second=0)
        made = await asyncio.gather(one.ensure_partitions(aged), other.ensure_partitions(aged))
        assert sorted(made[0] + made[1]) == sorted(
            partitions.partition_name(table, day)
            for table in partitions.PARTITIONED
            for day in partitions.days_around(aged)
        )
        await store(one, aged)
        await store(one, aged + timedelta(hours=2))
        await one.rollup(now)
        pruned = await asyncio.gather(*(r.prune(now, raw_days=30, rollup_days=400) for r in (one, other)))
        assert sum(p.runs for p in pruned) == 2 and sum(p.samples for p in pruned) == 6
        assert sum(p.days_dropped for p in pruned) == len(partitions.days_around(aged))
    finally:
        for engine in engines:
            await engine.dispose()


def test_a_partition_is_stale_once_its_changes_outgrow_its_statistics() -> None:
    assert not partitions.is_stale(live_rows=0, changed_since_analyze=0)
    assert not partitions.is_stale(live_rows=5_000, changed_since_analyze=5_000)  # small: autovacuum's
    assert partitions.is_stale(live_rows=50_000, changed_since_analyze=50_000)  # filled, never analyzed
    assert not partitions.is_stale(live_rows=1_000_000, changed_since_analyze=150_000)
    assert partitions.is_stale(live_rows=1_000_000, changed_since_analyze=250_000)


async def test_housekeeping_analyzes_a_day_filled_faster_than_autovacuum(postgres_backend: Backend) -> None:
    engine = postgres_backend.engine()
    try:
        repository = Repository(engine)
        now = datetime.now(UTC) + timedelta(days=40)  # a day of its own, away from the other tests'
        await repository.ensure_partitions(now)
        at = now.replace(minute=0, second=0, microsecond=0)
        batch = runs_from_samples(probe(at, rounds=15_000), job="j", location="l", provider_of={"t": "p"}, now=at)
        await repository.save_runs(batch)
        name = partitions.partition_name("samples", at.date())
        statistics = sa.text(
            "SELECT n_live_tup, n_mod_since_analyze, last_autoanalyze FROM pg_stat_user_tables WHERE relname = :name"
        )
        for _ in range(50):  # the writer's counts reach the statistics views within a second or so
            async with engine.connect() as connection:
                live, changed, autoanalyzed = (await connection.execute(statistics, {"name": name})).one()
            if changed >= 15_000 or autoanalyzed is not None:
                break
            await asyncio.sleep(0.1)
        analyzed = await repository.analyze_partitions()
        assert name in analyzed or autoanalyzed is not None  # autovacuum may have got there first
        async with engine.connect() as connection:
            live, changed, _ = (await connection.execute(statistics, {"name": name})).one()
        assert live >= 15_000 and not partitions.is_stale(live_rows=live, changed_since_analyze=changed)
        assert name not in await repository.analyze_partitions()
        done = await maintain_once(repository, Database(url=postgres_backend.url), now=now)
        assert done["partitions_analyzed"] >= 0 and name not in await repository.analyze_partitions()
    finally:
        await engine.dispose()


async def test_a_statement_over_the_days_is_planned_for_its_own_time_range_however_often_it_runs(
    postgres_backend: Backend,
) -> None:
    """asyncpg prepares every statement; after five runs PostgreSQL may switch one to a generic plan,
    made without the parameters' values, which cannot leave day partitions out (the overview at 20M
    samples went from 0.2 to 1.4 s from its eleventh call). The engine asks for custom plans."""
    engine = postgres_backend.engine()
    try:
        repository = Repository(engine)
        now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
        for hours_ago in range(0, 72, 6):
            await store(repository, now - timedelta(hours=hours_ago))
        query = sa.select(sa.func.count()).select_from(sa.table("runs", sa.column("started_at")))
        async with engine.connect() as connection:
            for _ in range(12):
                at = sa.bindparam("since", now - timedelta(hours=1), type_=sa.DateTime(timezone=True))
                await connection.execute(query.where(sa.column("started_at") >= at))
            plans = (
                await connection.execute(
                    sa.text(
                        "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                        "WHERE statement LIKE '%count(*)%FROM runs%' AND statement NOT LIKE '%pg_prepared%'"
                    )
                )
            ).all()
        assert plans and all(generic == 0 and custom >= 12 for generic, custom in plans), plans
    finally:
        await engine.dispose()
