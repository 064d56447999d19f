"""The repository on both databases: round trips, idempotent replays, windows, percentiles, retention."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.probe.prompts import Calibration
from monitor.probe.result import SAMPLE_FIELDS, ErrorClass, Sample
from monitor.schedule.claims import TickClaims
from monitor.store import repository as repository_module
from monitor.store.models import AlertOutboxRow, IncidentRow, table_of
from monitor.store.records import (
    MAX_STORED_MS,
    ROLLUP_RUN_MEDIANS,
    ROLLUP_SAMPLE_MEDIANS,
    SERVER_RUN_FIELDS,
    UNSTORED_SAMPLE_FIELDS,
    Batch,
    HourlyStats,
    RunRecord,
    SeriesKey,
    floor_hour,
    hourly_stats,
)
from monitor.store.repository import PruneResult, Repository
from tests.support.store_fixtures import T0, Backend, as_read_back, make_batch

pytest_plugins = ("tests.support.store_fixtures",)

QWEN_SHORT = SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short", "test-lab")


async def scalars(engine: AsyncEngine, query: str) -> list[Any]:
    async with engine.connect() as connection:
        return list(await connection.scalars(sa.text(query)))


async def count(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as connection:
        return int(await connection.scalar(sa.text(f"SELECT count(*) FROM {table}")) or 0)


@contextmanager
def commits(engine: AsyncEngine) -> Iterator[list[int]]:
    """Counts the transactions committed on `engine` inside the block."""
    seen: list[int] = []

    def on_commit(_connection: object) -> None:
        seen.append(1)

    sa.event.listen(engine.sync_engine, "commit", on_commit)
    try:
        yield seen
    finally:
        sa.event.remove(engine.sync_engine, "commit", on_commit)


def one_series_runs(hours: int, *, start: datetime = T0, every: timedelta = timedelta(hours=1)) -> list:
    return [
        run
        for i in range(hours)
        for run in make_batch(
            start + i * every,
            targets=("qwen3-8b",),
            prompts=("short",),
            errors={3: ErrorClass.TIMEOUT_TOTAL} if i % 4 == 0 else None,
        )
    ]


async def test_a_run_and_every_field_of_its_samples_come_back_unchanged(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    batch = make_batch(errors={2: ErrorClass.RATE_LIMITED, 4: ErrorClass.STREAM_ERROR})
    # A sample sent from a non-UTC clock is the same instant in UTC.
    batch[0][1][0].sent_at = batch[0][1][0].sent_at.astimezone(timezone(timedelta(hours=8)))  # type: ignore[union-attr]
    batch[0][1][1].self_delay_ms, batch[0][1][1].disturbed = 52.5, True  # the monitor was late around it
    await repository.save_runs(batch)

    loaded = await repository.load_runs(QWEN_SHORT, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    assert loaded == [as_read_back(*batch[0])]  # named by its run and round: no sample id is stored
    # These samples exercise every field the probe records, so a new field cannot slip by unstored.
    samples = [s for _, members in batch for s in members]
    defaults = Sample("t", "m", "a", "p", 1)
    # (Fields the probe keeps for itself and never stores are left out: UNSTORED_SAMPLE_FIELDS.)
    always_set = {"target", "model", "api", "prompt", "round", "sample_id"} | UNSTORED_SAMPLE_FIELDS
    unexercised = [
        name
        for name in SAMPLE_FIELDS
        if name not in always_set and all(getattr(s, name) == getattr(defaults, name) for s in samples)
    ]
    assert unexercised == []
    assert loaded[0][1][0].sent_at.tzinfo == UTC  # type: ignore[union-attr]


async def test_a_replayed_run_or_sample_is_stored_once(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    first = make_batch(T0)
    second = make_batch(T0 + timedelta(minutes=5))
    await repository.save_runs(first)
    await repository.save_runs(first)
    await repository.save_runs(first[1:] + second)  # overlapping replay, as after a crash mid-drain
    await Repository(engine).save_runs(second)  # another process, cold cache
    assert await count(engine, "runs") == 8
    assert await count(engine, "samples") == 8 * 6
    assert await count(engine, "series") == 4


async def test_a_tick_probed_by_two_replicas_is_stored_once_whichever_replays_first(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    ticks = [T0 + timedelta(minutes=5 * i) for i in range(3)]
    # Two replicas of one location probed the same ticks: different run and sample ids, same ticks.
    replica_a = [run for tick in ticks for run in make_batch(tick)]
    replica_b = [run for tick in ticks for run in make_batch(tick)]
    assert {run.run_id for run, _ in replica_a}.isdisjoint(run.run_id for run, _ in replica_b)

    stored_a = await repository.save_runs(replica_a[:4])  # A replays its first tick
    stored_b = await Repository(engine).save_runs(replica_b)  # B replays everything
    stored_a_rest = await repository.save_runs(replica_a[4:])  # A replays the rest

    assert stored_a == {run.run_id for run, _ in replica_a[:4]}
    assert stored_b == {run.run_id for run, _ in replica_b[4:]}
    assert stored_a_rest == set()
    assert await count(engine, "runs") == 12  # 3 ticks x 4 series
    assert await count(engine, "samples") == 12 * 6  # only the stored runs' samples
    async with engine.connect() as connection:
        orphans = await connection.scalar(
            sa.text("SELECT count(*) FROM samples WHERE run_id NOT IN (SELECT id FROM runs)")
        )
        distinct = await connection.scalar(
            sa.text("SELECT count(*) FROM (SELECT DISTINCT series_id, job, intended_at FROM runs) AS ticks")
        )
    assert orphans == 0
    assert distinct == 12
    loaded = await repository.load_runs(QWEN_SHORT, T0, T0 + timedelta(hours=1))
    assert [run for run, _ in loaded] == [run for run, _ in replica_a[:4] + replica_b[4:] if run.series == QWEN_SHORT]


async def test_both_replicas_runs_of_a_tick_in_one_batch_store_one(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    first = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
    second = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
    stored = await repository.save_runs(first + second)
    assert len(stored) == 1 and stored <= {first[0][0].run_id, second[0][0].run_id}
    [kept] = await repository.load_runs(QWEN_SHORT, T0, T0 + timedelta(hours=1))
    assert kept in (as_read_back(*first[0]), as_read_back(*second[0]))  # one whole run with its own samples, not a mix
    assert await count(engine, "runs") == 1
    assert await count(engine, "samples") == 6


async def test_sqlite_stores_a_large_batch_a_part_at_a_time_in_one_transaction(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rows' parameters are made on the probes' loop: a statement of a job's 500 runs held it for
    # ~10 ms; between parts the loop runs the probes. Replays and a tick's second run still store once.
    if engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL copies the batch into staging tables in one go")
    monkeypatch.setattr(repository_module, "SQLITE_SAVE_PART", 3)
    checked: list[int] = []  # the runs whose times are checked at once: a part's, not the whole batch's
    check_aware = repository_module._check_aware

    def counted(part: Batch) -> None:
        checked.append(len(part))
        check_aware(part)

    monkeypatch.setattr(repository_module, "_check_aware", counted)
    repository = Repository(engine)
    first = make_batch(T0)
    await repository.save_runs(first[:1])
    second_replica = make_batch(T0, targets=("qwen3-8b",))  # the same tick's series, other run ids
    batch = first + make_batch(T0 + timedelta(minutes=5)) + second_replica
    rows_per_insert: list[int] = []

    def on_execute(_conn: object, clause: object, multiparams: Any, _params: Any, _options: Any) -> None:
        if isinstance(clause, sa.Insert) and clause.table.name == "runs":
            rows_per_insert.append(len(multiparams) or 1)  # one row comes as `params`

    sa.event.listen(engine.sync_engine, "before_execute", on_execute)
    try:
        with commits(engine) as committed:
            stored = await repository.save_runs(batch)
    finally:
        sa.event.remove(engine.sync_engine, "before_execute", on_execute)
    assert rows_per_insert == [3, 3, 3, 1]
    assert checked == [1, 3, 3, 3, 1]  # the first save's one run, then this one's parts
    assert len(committed) == 1
    assert stored == {run.run_id for run, _ in batch[1:8]}  # not the stored one, nor the tick's second runs
    assert await count(engine, "runs") == 8
    assert await count(engine, "samples") == 8 * 6


async def test_other_jobs_and_ad_hoc_runs_at_the_same_time_are_each_their_own(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    one: dict[str, Any] = dict(targets=("qwen3-8b",), prompts=("short",))
    # Two jobs probing one series at one scheduled time are two runs.
    await repository.save_runs(make_batch(T0, job="every-5m", **one) + make_batch(T0, job="hourly", **one))
    # `probe --store` runs are never a second run of a tick, even when their times coincide.
    adhoc = [make_batch(T0, job="adhoc", **one) for _ in range(3)]
    stored = await repository.save_runs([run for batch in adhoc for run in batch])
    assert len(stored) == 3
    assert await count(engine, "runs") == 5
    assert await count(engine, "samples") == 5 * 6
    # ...and an ad-hoc run replayed is still stored once.
    assert await repository.save_runs(adhoc[0]) == set()
    assert await count(engine, "runs") == 5


async def test_the_last_runs_of_a_series_come_oldest_first(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    for i in range(12):
        await repository.save_runs(make_batch(T0 + timedelta(minutes=5 * i)))
    last = await repository.last_runs(QWEN_SHORT, 5)
    assert [run.started_at for run in last] == sorted(run.started_at for run in last)
    assert [floor_minute(run.intended_at) for run in last] == [T0 + timedelta(minutes=5 * i) for i in range(7, 12)]
    assert all(run.series == QWEN_SHORT for run in last)
    assert len(await repository.last_runs(QWEN_SHORT, 50)) == 12
    assert await repository.last_runs(dataclasses.replace(QWEN_SHORT, location="elsewhere"), 5) == []


def floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


async def test_a_window_includes_its_start_and_excludes_its_end(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    batches = [make_batch(T0 + timedelta(minutes=5 * i), targets=("qwen3-8b",), prompts=("short",)) for i in range(6)]
    for batch in batches:
        await repository.save_runs(batch)
    starts = [batch[0][0].started_at for batch in batches]
    window = await repository.runs_between(QWEN_SHORT, starts[1], starts[4])
    assert [run.run_id for run in window] == [batch[0][0].run_id for batch in batches[1:4]]
    assert window[0] == batches[1][0][0]


async def test_hourly_percentiles_match_the_definition(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    batch = one_series_runs(36, every=timedelta(minutes=10))  # six hours, six runs an hour
    # Some runs carry the server's own metrics (the rollups keep their hourly medians); one hour has none.
    batch = [
        (
            dataclasses.replace(
                run,
                **{name: 1.5 * i + position for position, name in enumerate(SERVER_RUN_FIELDS)},
            )
            if i % 3 and not 18 <= i < 24
            else run,
            members,
        )
        for i, (run, members) in enumerate(batch)
    ]
    await repository.save_runs(batch)
    got = await repository.hourly_percentiles(QWEN_SHORT, T0 + timedelta(hours=1), T0 + timedelta(hours=5))

    expected = []
    for hour in (T0 + timedelta(hours=h) for h in range(1, 5)):
        in_hour = [(run, members) for run, members in batch if floor_hour(run.started_at) == hour]
        rows = [
            (s.ttft_ms, s.error, s.decode_tps, *(getattr(s, name) for name in ROLLUP_SAMPLE_MEDIANS))
            for _, members in in_hour
            for s in members
            if not s.warmup
        ]
        runs = [tuple(getattr(run, name) for name in ROLLUP_RUN_MEDIANS) for run, _ in in_hour]
        expected.append(hourly_stats(hour, rows, runs))
    assert [stats.hour for stats in got] == [stats.hour for stats in expected]
    for actual, wanted in zip(got, expected, strict=True):
        assert_same(actual, wanted)
        assert actual.samples == 6 * 5
        assert actual.ttft_p10_ms is not None and actual.ttfb_ms_p50 is not None
        assert actual.prompt_tokens_p50 is not None
    assert sum(stats.errors for stats in got) > 0
    assert [stats.server_ttft_ms_p50 is None for stats in got] == [False, False, True, False]


async def test_rollups_keep_the_band_the_phases_and_the_server_metrics(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    batch = [
        (dataclasses.replace(run, server_ttft_ms=100.0 + i, server_waiting=float(i)), members)
        for i, (run, members) in enumerate(one_series_runs(12, every=timedelta(minutes=10)))
    ]
    await repository.save_runs(batch)
    assert await repository.rollup(T0 + timedelta(hours=3)) == 2
    stored = await repository.rollups_between(QWEN_SHORT, T0, T0 + timedelta(hours=2))
    computed = await repository.hourly_percentiles(QWEN_SHORT, T0, T0 + timedelta(hours=2))
    assert len(stored) == 2
    for actual, wanted in zip(stored, computed, strict=True):
        assert_same(actual, wanted)
    assert [s.server_ttft_ms_p50 for s in stored] == [102.5, 108.5]
    assert all(s.ttft_p10_ms is not None and s.ttft_p10_ms <= s.ttft_p50_ms for s in stored)  # type: ignore[operator]


async def test_a_batch_of_calibration_fits_is_saved_at_once(backend: Backend) -> None:
    engine = backend.engine()
    try:
        repository = Repository(engine)
        await repository.save_calibration(("a", "short"), 3.7, 12.0)
        await repository.save_calibrations({})  # nothing moved: nothing written
        await repository.save_calibrations(
            {("a", "short"): (3.9, 11.5), ("a", "long"): (4.1, 0.0), ("b", "short"): (2.5, 3.0)}
        )
        stored = await repository.load_calibration()
    finally:
        await engine.dispose()
    assert stored == {("a", "short"): (3.9, 11.5), ("a", "long"): (4.1, 0.0), ("b", "short"): (2.5, 3.0)}


async def test_prompt_calibration_survives_a_restart(backend: Backend) -> None:
    engine = backend.engine()
    repository = Repository(engine)
    await repository.save_calibration(("qwen3-8b", "short"), 3.7, 12.0)
    await repository.save_calibration(("qwen3-8b", "long"), 4.1, 0.0)
    await repository.save_calibration(("qwen3-8b", "short"), 3.9, 11.5)  # refit
    await engine.dispose()

    engine = backend.engine()  # a new process
    try:
        stored = await Repository(engine).load_calibration()
    finally:
        await engine.dispose()
    assert stored == {("qwen3-8b", "short"): (3.9, 11.5), ("qwen3-8b", "long"): (4.1, 0.0)}
    calibration = Calibration()
    for key, (cpt, overhead) in stored.items():
        calibration.load(key, cpt, overhead)
    assert calibration.chars_for(("qwen3-8b", "short"), 2011, "en") == round((2011 - 11.5) * 3.9)


async def test_rollups_cover_complete_hours_and_are_computed_in_batches(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    await repository.save_runs(one_series_runs(50, every=timedelta(minutes=30)))  # 25 hours
    now = T0 + timedelta(hours=24, minutes=40)  # the 25th hour is not over
    with commits(engine) as seen:
        assert await repository.rollup(now, batch_size=7) == 24
    assert len(seen) >= math.ceil(24 / 7)
    raw = await repository.hourly_percentiles(QWEN_SHORT, T0, T0 + timedelta(hours=24))
    rolled = await repository.rollups_between(QWEN_SHORT, T0, T0 + timedelta(days=2))
    assert len(rolled) == len(raw) == 24
    for actual, wanted in zip(rolled, raw, strict=True):
        assert_same(actual, wanted)
    assert await repository.rollup(now) == 0  # nothing new
    assert await repository.rollup(now + timedelta(hours=1)) == 1


async def test_a_late_run_recomputes_its_hours_rollup(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    await repository.save_runs(one_series_runs(2, every=timedelta(minutes=20)))
    now = T0 + timedelta(hours=3)
    await repository.rollup(now)
    [before] = await repository.rollups_between(QWEN_SHORT, T0, now)
    # Replayed from a spool after an outage: lands in an hour already rolled up.
    await repository.save_runs(one_series_runs(1, start=T0 + timedelta(minutes=50)))
    assert await repository.rollup(now) == 1
    [after] = await repository.rollups_between(QWEN_SHORT, T0, now)
    assert (before.samples, after.samples) == (10, 15)


async def test_retention_prunes_raw_and_rollups_in_short_batches(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    await repository.save_runs(one_series_runs(50))  # hourly for 50 hours
    now = T0 + timedelta(hours=50)
    await repository.rollup(now)
    with commits(engine) as seen:
        result = await repository.prune(now, raw_days=1, rollup_days=2, batch_size=4)
    # Runs started before now - 1 day (the first 26) go with their samples; hours before now - 2 days too.
    assert result == PruneResult(runs=26, samples=26 * 6, rollups=2)
    assert len(seen) >= math.ceil(26 / 4) + 1
    assert await count(engine, "runs") == 24
    assert await count(engine, "samples") == 24 * 6
    assert await repository.hourly_percentiles(QWEN_SHORT, T0, T0 + timedelta(hours=26)) == []
    kept = await repository.rollups_between(QWEN_SHORT, T0, now)
    assert [stats.hour for stats in kept] == [T0 + timedelta(hours=h) for h in range(2, 50)]
    assert await repository.prune(now, raw_days=1, rollup_days=2, batch_size=4) == PruneResult(0, 0, 0)


async def test_retention_covers_job_ticks_and_long_resolved_incidents(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    await repository.save_runs(one_series_runs(1))
    [series_id] = await scalars(engine, "SELECT id FROM series")
    now = T0 + timedelta(days=10)
    claims = TickClaims(engine)
    for days_ago in (9, 8, 3, 0):  # raw_days=5: the first two go
        claimed = await claims.claim(job="j", scheduled_at=now - timedelta(days=days_ago), location="l", owner="me")
        assert claimed
    incidents, outbox = table_of(IncidentRow), table_of(AlertOutboxRow)

    def incident(kind: str, opened_days_ago: float, resolved_days_ago: float | None) -> dict[str, object]:
        return {
            "id": uuid.uuid4(),
            "series_id": series_id,
            "kind": kind,
            "severity": "page",
            "opened_at": now - timedelta(days=opened_days_ago),
            "resolved_at": None if resolved_days_ago is None else now - timedelta(days=resolved_days_ago),
            "updated_at": now,
        }

    old_resolved, old_notified, recent_resolved, still_open = (
        incident("regression", 9, 8),  # rollup_days=7: goes
        incident("availability", 9, 8),  # would go, but a notification still refers to it
        incident("slo", 5, 4),
        incident("regression", 9, None),
    )
    async with engine.begin() as connection:
        await connection.execute(incidents.insert(), [old_resolved, old_notified, recent_resolved, still_open])
        await connection.execute(
            outbox.insert().values(
                id=uuid.uuid4(),
                dedup_key="k",
                incident_id=old_notified["id"],
                receiver="r",
                event="resolved",
                payload={},
                status="sent",
                attempts=1,
                next_attempt_at=now,
                created_at=now,
            )
        )
    result = await repository.prune(now, raw_days=5, rollup_days=7, batch_size=1)
    assert (result.job_ticks, result.incidents) == (2, 1)
    remaining_ticks = await scalars(engine, "SELECT scheduled_at FROM job_ticks ORDER BY scheduled_at")
    assert len(remaining_ticks) == 2
    remaining = {str(i).replace("-", "") for i in await scalars(engine, "SELECT id FROM incidents")}
    assert remaining == {i["id"].hex for i in (old_notified, recent_resolved, still_open)}  # type: ignore[attr-defined]
    second = await repository.prune(now, raw_days=5, rollup_days=7)
    assert (second.job_ticks, second.incidents) == (0, 0)


async def test_raw_data_stays_until_its_rollup_is_computed(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    await repository.save_runs(one_series_runs(10))
    now = T0 + timedelta(days=5)
    assert await repository.prune(now, raw_days=1, rollup_days=400) == PruneResult(0, 0, 0)
    await repository.rollup(now)
    assert await repository.prune(now, raw_days=1, rollup_days=400) == PruneResult(10, 60, 0)
    assert len(await repository.rollups_between(QWEN_SHORT, T0, now)) == 10


async def test_a_naive_time_is_refused_and_nothing_is_written(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    [(run, samples)] = make_batch(targets=("qwen3-8b",), prompts=("short",))
    naive: RunRecord = dataclasses.replace(run, started_at=run.started_at.replace(tzinfo=None))
    with pytest.raises(ValueError, match="naive datetime"):
        await repository.save_runs([(naive, samples)])
    assert await count(engine, "runs") == 0
    assert await count(engine, "series") == 0
    await repository.save_runs([(run, samples)])  # the series cache forgot the rolled-back id
    assert await count(engine, "runs") == 1


async def test_it_lists_series_and_answers_pings(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    await repository.ping()
    await repository.save_runs(make_batch())
    assert await repository.series_list() == sorted(
        SeriesKey(t, p, m, prompt, "test-lab")
        for t, p, m in (("qwen3-8b", "vllm", "Qwen/Qwen3-8B"), ("gpt-4o-mini", "openai", "gpt-4o-mini"))
        for prompt in ("short", "long")
    )


def assert_same(actual: HourlyStats, wanted: HourlyStats) -> None:
    """Equal, floats to 12 significant digits (PostgreSQL's percentile_cont vs. Python's)."""
    for name, value in dataclasses.asdict(wanted).items():
        expected = pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
        assert getattr(actual, name) == expected, name


async def test_the_tokens_seen_and_spent_are_summed_per_series_on_both_databases(backend: Backend) -> None:
    from monitor.config.cost import Tokens

    engine = backend.engine()
    try:
        repository = Repository(engine)
        batch = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
        for sample in batch[0][1]:
            sample.error, sample.prompt_tokens, sample.cached_tokens = None, 1000, 100
            sample.completion_tokens, sample.reasoning_tokens = 64, 40
        await repository.save_runs(batch)
        run, samples = batch[0]
        location = run.series.location
        seen = await repository.tokens_seen(location, T0 - timedelta(hours=1))
        assert list(seen) == [("qwen3-8b", "short")]
        got = seen["qwen3-8b", "short"]
        assert (got.samples, got.prompt_tokens, got.completion_tokens, got.reasoning_tokens) == (
            len(samples),
            1000,
            64,
            40,
        )
        spent, first = await repository.tokens_spent(location, T0 - timedelta(hours=1))
        n = len(samples)
        assert spent == {(run.job, "qwen3-8b"): Tokens(1000 * n, 100 * n, 24 * n, 40 * n)}
        assert first == run.started_at
        assert await repository.tokens_spent(location, T0 + timedelta(hours=1)) == ({}, None)
    finally:
        await engine.dispose()


async def test_a_duration_past_what_the_database_holds_is_kept_at_its_bound_with_the_rest_of_its_batch(
    engine: AsyncEngine,
) -> None:
    # What a spool written by an older version can hold: durations to the nanosecond, and one of a monitor
    # suspended mid-request for an hour (past an int4 of microseconds, 35 min 47 s).
    batch = make_batch(T0)
    members = batch[0][1]
    members[1] = dataclasses.replace(members[1], total_ms=3_600_000.0, ttft_ms=250.1234567, disturbed=True)
    stored = await Repository(engine).save_runs(batch)
    assert stored == {r.run_id for r, _ in batch}
    assert await count(engine, "samples") == 4 * 6
    [(_, read)] = await Repository(engine).load_runs(QWEN_SHORT, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    long = next(s for s in read if s.round == members[1].round)
    assert (long.total_ms, long.ttft_ms, long.disturbed) == (MAX_STORED_MS, 250.123, True)
