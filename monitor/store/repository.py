"""Reads and writes of results, on PostgreSQL and SQLite alike.

Writes are idempotent: runs and samples carry client-generated UUIDs and are inserted with
ON CONFLICT DO NOTHING, so a batch replayed from the spool (or saved twice after a timeout whose
commit did land) is stored once; and a series holds one run per job tick, so a tick probed by two
replicas is stored once too, whichever replays first. Write transactions are short; retention works in bounded batches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any

from sqlalchemy import (
    String,
    Table,
    bindparam,
    column,
    delete,
    func,
    or_,
    select,
    table,
    text,
    tuple_,
    type_coerce,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.expression import TableClause

from monitor.config.cost import Seen, Tokens
from monitor.probe.result import ErrorClass, Sample, TimingPath
from monitor.store import cold, overview_summary, partitions
from monitor.store.direct import DirectStatement
from monitor.store.engine import write_transaction
from monitor.store.models import (
    BUDGET_HOLDS,
    CALIBRATION,
    COLD_CHUNKS,
    ROLLUP_PENDING,
    ROLLUPS,
    RUNS,
    SAMPLES,
    SAMPLES_OF_RUN,
    SERIES,
    AlertOutboxRow,
    AnnotationRow,
    IncidentGroupRow,
    IncidentRow,
    JobTickRow,
    RunRow,
    SampleRow,
    table_of,
)
from monitor.store.records import (
    IDENTITY_RUN_FIELDS,
    ROLLUP_RUN_MEDIANS,
    ROLLUP_SAMPLE_MEDIANS,
    SAMPLE_COLUMN_FIELDS,
    SERVER_RUN_FIELDS,
    Batch,
    BudgetHoldRecord,
    HourlyStats,
    RunRecord,
    SeriesKey,
    StorableBatch,
    floor_hour,
    hourly_stats,
    sample_id_of,
    storable_batch,
    to_microseconds,
)
from monitor.store.statements import SERIES_COLUMNS, find_series_id, upsert_insert
from monitor.store.types import Microseconds, UtcDateTime

_HOUR = timedelta(hours=1)


LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL: lock_timeout ran out


def _sqlstate(exc: DBAPIError) -> str | None:
    original = exc.orig
    return getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)


# Series whose newest runs auto compaction looks up in one statement (`Repository._past_newest_runs`).
REACH_BATCH = 100


@dataclass(frozen=True, slots=True)
class PruneResult:
    runs: int
    samples: int
    rollups: int
    job_ticks: int = 0
    incidents: int = 0
    incident_groups: int = 0
    annotations: int = 0
    days_dropped: int = 0  # PostgreSQL: whole days of runs and samples dropped as partitions
    cold_days: int = 0  # series-days of the cold tier dropped (their runs and samples counted above)


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """What `Repository.history_rows` read: the rows (detect/history.py's HistoryRow), and for each whether it
    came from a cold chunk (None: every one from a row)."""

    rows: list[tuple[Any, ...]]
    from_chunks: list[bool] | None


@dataclass(frozen=True, slots=True)
class HistorySpan:
    """What the database holds of a series' runs up to a kept history's last one (`history_since_span`): how many
    started in [start, last] as rows, the first and last of them; the first run of its oldest cold chunk, and the
    last run of its chunks of the days since the one before `last`'s (None: no such chunk)."""

    rows: int
    first: datetime | None
    last: datetime | None
    oldest_chunk_run: datetime | None
    newest_chunk_run: datetime | None


@dataclass(frozen=True, slots=True)
class CompactResult:
    """What one compaction pass moved into the cold tier (`Repository.compact`)."""

    series_days: int = 0
    runs: int = 0
    samples: int = 0
    duplicates: int = 0  # rows of a run or tick a chunk already held, deleted
    skipped: int = 0  # series another daemon was compacting
    days_dropped: int = 0  # PostgreSQL: day partitions dropped once every run of theirs was compacted


def _check_aware(batch: Batch) -> None:
    """Refuse naive datetimes up front (the COPY path bypasses the column types' own check)."""
    for run, samples in batch:
        moments: list[datetime | None] = [run.intended_at, run.started_at, run.finished_at]
        moments += [s.intended_at for s in samples] + [s.sent_at for s in samples]
        if any(moment is not None and moment.tzinfo is None for moment in moments):
            naive = next(m for m in moments if m is not None and m.tzinfo is None)
            raise ValueError(
                f"run {run.run_id}: naive datetime {naive.isoformat()} cannot be stored; give it a time zone (UTC)"
            )


def _run_row(run: RunRecord, series_id: int) -> dict[str, Any]:
    return {
        "id": run.run_id,
        "series_id": series_id,
        "job": run.job,
        "api": run.api,
        "intended_at": run.intended_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "rounds": run.rounds,
        "warmup": run.warmup,
        "ok": run.ok,
        "errors": run.errors,
        "ttft_p50_ms": run.ttft_p50_ms,
        "ttft_min_ms": run.ttft_min_ms,
        "ttft_max_ms": run.ttft_max_ms,
        "ttfa_p50_ms": run.ttfa_p50_ms,
        "decode_tps_p50": run.decode_tps_p50,
        "prompt_tokens_p50": run.prompt_tokens_p50,
        "error": run.error.value if run.error is not None else None,
        **{name: getattr(run, name) for name in SERVER_RUN_FIELDS},
        **{name: getattr(run, name) for name in IDENTITY_RUN_FIELDS},
    }


def _sample_row(sample: Sample, run: RunRecord) -> dict[str, Any]:
    row = {column: getattr(sample, name) for column, name in SAMPLE_COLUMN_FIELDS.items()}
    row["run_id"] = run.run_id
    row["intended_at"] = run.intended_at  # the day its run is kept in (SAMPLES_OF_RUN)
    row["error"] = sample.error.value if sample.error is not None else None
    return row


_RUN_COLUMNS = [c for c in RUNS.c if c.name not in ("series_id", "stored_at")]
_ERROR_CLASSES = {error.value: error for error in ErrorClass}
# The hot reads, built once (SQLAlchemy then reuses their compiled form).
_LAST_RUNS = (
    select(*_RUN_COLUMNS)
    .where(RunRow.series_id == bindparam("series_id"))
    .order_by(RunRow.started_at.desc())
    .limit(bindparam("n"))
)
_MEASURED_IN_WINDOW = (
    RUNS.c.series_id.in_(bindparam("series_ids", expanding=True)),
    RUNS.c.started_at >= bindparam("start", type_=UtcDateTime()),
    RUNS.c.started_at < bindparam("end", type_=UtcDateTime()),
    SAMPLES.c.warmup.is_(False),
)
_RUNS_JOIN_SAMPLES = RUNS.join(SAMPLES, SAMPLES_OF_RUN)
# SQLite keeps UTC timestamps as text, 'YYYY-MM-DD HH:MM:SS.ffffff': the first 13 characters name the hour.
_HOURLY_VALUES = (
    select(
        RUNS.c.series_id,
        type_coerce(func.substr(RUNS.c.started_at, 1, 13), String),
        SAMPLES.c.ttft_ms,
        SAMPLES.c.error,
        SAMPLES.c.decode_tps,
        *(SAMPLES.c[name] for name in ROLLUP_SAMPLE_MEDIANS),
    )
    .select_from(_RUNS_JOIN_SAMPLES)
    .where(*_MEASURED_IN_WINDOW)
    .order_by(RUNS.c.series_id, RUNS.c.started_at)
)
_RUNS_IN_WINDOW = (
    RUNS.c.series_id.in_(bindparam("series_ids", expanding=True)),
    RUNS.c.started_at >= bindparam("start", type_=UtcDateTime()),
    RUNS.c.started_at < bindparam("end", type_=UtcDateTime()),
)
# The runs' own numbers (the server's metrics), one row per run of a series that has any.
_HOURLY_RUN_VALUES = select(
    RUNS.c.series_id,
    type_coerce(func.substr(RUNS.c.started_at, 1, 13), String),
    *(RUNS.c[name] for name in ROLLUP_RUN_MEDIANS),
).where(*_RUNS_IN_WINDOW, or_(*(RUNS.c[name].is_not(None) for name in ROLLUP_RUN_MEDIANS)))


def _utc_hour(column: Any) -> Any:
    return func.timezone("UTC", func.date_trunc("hour", func.timezone("UTC", column)))


# Built on first use (once), not at import: they need SQLAlchemy's PostgreSQL dialect, which a process on
# SQLite then never loads.
@functools.cache
def _hourly_percentiles_statement() -> Any:
    """PostgreSQL: per UTC hour, percentile_cont (one sort for the TTFT quantiles) over successful
    samples, and the medians of the phases and token counts over every measured sample."""
    from sqlalchemy.dialects import postgresql

    samples = SAMPLES
    ok = samples.c.error.is_(None)
    utc_hour = _utc_hour(RUNS.c.started_at)
    quantiles = func.percentile_cont(postgresql.array([0.1, 0.5, 0.9, 0.99])).within_group(samples.c.ttft_ms)
    return (
        select(
            RUNS.c.series_id,
            type_coerce(utc_hour, UtcDateTime()),
            func.count(),
            func.count().filter(samples.c.error.is_not(None)),
            type_coerce(quantiles.filter(ok), postgresql.ARRAY(Microseconds())),
            func.min(samples.c.ttft_ms).filter(ok),
            func.max(samples.c.ttft_ms).filter(ok),
            func.percentile_cont(0.5).within_group(samples.c.decode_tps).filter(ok),
            *(func.percentile_cont(0.5).within_group(samples.c[name]) for name in ROLLUP_SAMPLE_MEDIANS),
        )
        .select_from(_RUNS_JOIN_SAMPLES)
        .where(*_MEASURED_IN_WINDOW)
        .group_by(RUNS.c.series_id, utc_hour)
        .order_by(RUNS.c.series_id, utc_hour)
    )


@functools.cache
def _hourly_run_medians_statement() -> Any:
    """PostgreSQL: per series and UTC hour with any, the medians of the runs' server metrics."""
    utc_hour = _utc_hour(RUNS.c.started_at)
    return (
        select(
            RUNS.c.series_id,
            type_coerce(utc_hour, UtcDateTime()),
            *(func.percentile_cont(0.5).within_group(RUNS.c[name]) for name in ROLLUP_RUN_MEDIANS),
        )
        .where(*_RUNS_IN_WINDOW, or_(*(RUNS.c[name].is_not(None) for name in ROLLUP_RUN_MEDIANS)))
        .group_by(RUNS.c.series_id, utc_hour)
    )


def _series_runs(*columns: Any, after: bool = False) -> Any:
    """`columns` of the runs of `:series_id` started in [`:start`, `:end`) (`after`: in (`:after`, `:end`)),
    oldest first."""
    lower = (
        RunRow.started_at > bindparam("after", type_=UtcDateTime())
        if after
        else RunRow.started_at >= bindparam("start", type_=UtcDateTime())
    )
    return (
        select(*columns)
        .where(
            RunRow.series_id == bindparam("series_id"), lower, RunRow.started_at < bindparam("end", type_=UtcDateTime())
        )
        .order_by(RunRow.started_at)
    )


_RUNS_BETWEEN = _series_runs(*_RUN_COLUMNS)
# What the detector reads of each run (detect/history.py's HistoryRow), and the check that the runs it
# keeps are still all the database holds over their span.
_HISTORY_COLUMNS = (
    RunRow.started_at, RunRow.ttft_p50_ms, RunRow.error, RunRow.ok, RunRow.errors, RunRow.rounds,
    RunRow.canary, RunRow.server_build,
)  # fmt: skip
# Read once a series and tick: on SQLite without SQLAlchemy's execution around them (store/direct.py).
_HISTORY_KEYS = tuple(column.key for column in _HISTORY_COLUMNS)
HISTORY_FROM = DirectStatement(_series_runs(*_HISTORY_COLUMNS))
HISTORY_AFTER = DirectStatement(_series_runs(*_HISTORY_COLUMNS, after=True))
# And of the series' cold chunks (in the same statement: one snapshot, one trip): the first run of the oldest (a
# chunk retention dropped under a kept history moves it), and the last run of those of the days since `:recent`
# (a chunk holding a run after the kept history's last: compacted before it was read, or a late one).
_OLDEST_CHUNK_RUN = (
    select(COLD_CHUNKS.c.first_started_at)
    .where(COLD_CHUNKS.c.series_id == bindparam("series_id"))
    .order_by(COLD_CHUNKS.c.day)
    .limit(1)
    .scalar_subquery()
)
_NEWEST_CHUNK_RUN = (
    select(func.max(COLD_CHUNKS.c.last_started_at))
    .where(
        COLD_CHUNKS.c.series_id == bindparam("series_id"),
        COLD_CHUNKS.c.day >= bindparam("recent", type_=UtcDateTime()),
    )
    .scalar_subquery()
)
RUN_SPAN = DirectStatement(
    select(
        func.count(),
        func.min(RunRow.started_at).label("first"),
        func.max(RunRow.started_at).label("last"),
        _OLDEST_CHUNK_RUN.label("oldest_chunk_run"),
        _NEWEST_CHUNK_RUN.label("newest_chunk_run"),
    ).where(
        RunRow.series_id == bindparam("series_id"),
        RunRow.started_at >= bindparam("start", type_=UtcDateTime()),
        RunRow.started_at <= bindparam("end", type_=UtcDateTime()),
    )
)

_ROLLUPS_BETWEEN = (
    select(*(ROLLUPS.c[f.name] for f in fields(HourlyStats)))
    .where(
        ROLLUPS.c.series_id == bindparam("series_id"),
        ROLLUPS.c.hour >= bindparam("start", type_=UtcDateTime()),
        ROLLUPS.c.hour < bindparam("end", type_=UtcDateTime()),
    )
    .order_by(ROLLUPS.c.hour)
)

# SQLite's save: the samples, and the hours marked for roll-up (store/direct.py).
_SQLITE_SAMPLES = DirectStatement(SAMPLES.insert())
_mark_pending = sqlite.insert(ROLLUP_PENDING)
_SQLITE_MARK_PENDING = DirectStatement(
    _mark_pending.on_conflict_do_update(
        index_elements=["series_id", "hour"], set_={"marked_at": _mark_pending.excluded.marked_at}
    )
)

# PostgreSQL bulk path: column order of the COPY records, and the statements around them.
_RUN_COPY = (
    "id", "series_id", "job", "api", "intended_at", "started_at", "finished_at", "rounds", "warmup", "ok", "errors",
    "ttft_p50_ms", "ttft_min_ms", "ttft_max_ms", "ttfa_p50_ms", "decode_tps_p50", "prompt_tokens_p50", "error",
    *SERVER_RUN_FIELDS, *IDENTITY_RUN_FIELDS,
)  # fmt: skip
# The columns' names in the database (the durations' are `*_us`: SAMPLES.c[key].name).
_SAMPLE_COPY = tuple(SAMPLES.c[key].name for key in ("run_id", *SAMPLE_COLUMN_FIELDS, "error"))
# COPY sends each value as its column's type: the durations as whole microseconds (types.Microseconds).
_SAMPLE_COPY_MICROS = tuple(
    index for index, key in enumerate(SAMPLE_COLUMN_FIELDS) if isinstance(SAMPLES.c[key].type, Microseconds)
)
_sample_values = attrgetter(*SAMPLE_COLUMN_FIELDS.values())
_PG_STAGE_TABLES = tuple(
    f"CREATE TEMP TABLE IF NOT EXISTS ttft_stage_{table} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
    for table in ("runs", "samples")
)


def _columns(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


# Runs first; samples only of the runs inserted here. A run not inserted is either stored already
# (a replay: its samples came in its own transaction) or a second run of one tick (another replica's,
# whose samples must not join the stored run's).
_PG_MERGE = f"""
WITH inserted AS (
    INSERT INTO runs ({_columns(_RUN_COPY)}) SELECT {_columns(_RUN_COPY)} FROM ttft_stage_runs
    ON CONFLICT DO NOTHING RETURNING id
), inserted_samples AS (
    INSERT INTO samples ({_columns(_SAMPLE_COPY)}) SELECT {_columns(_SAMPLE_COPY)} FROM ttft_stage_samples
    WHERE run_id IN (SELECT id FROM inserted) ON CONFLICT DO NOTHING
)
SELECT id FROM inserted
"""
_PG_MARK_PENDING = """
INSERT INTO rollup_pending (series_id, hour, marked_at)
SELECT series_id, hour, $3 FROM unnest($1::integer[], $2::timestamptz[]) AS pending(series_id, hour)
ON CONFLICT (series_id, hour) DO UPDATE SET marked_at = excluded.marked_at
"""


def _run_copy_values(run: RunRecord, series_id: int) -> tuple[Any, ...]:
    row = _run_row(run, series_id)
    return tuple(row[name] for name in _RUN_COPY)


_SAMPLE_INTENDED = list(SAMPLE_COLUMN_FIELDS).index("intended_at")


def _sample_copy_values(sample: Sample, run: RunRecord) -> tuple[Any, ...]:
    error = sample.error.value if sample.error is not None else None
    values = list(_sample_values(sample))
    values[_SAMPLE_INTENDED] = run.intended_at  # the day its run is kept in (SAMPLES_OF_RUN)
    for index in _SAMPLE_COPY_MICROS:
        if (value := values[index]) is not None:
            values[index] = to_microseconds(value)
    return (run.run_id, *values, error)


def _run_record(row: Any, series: SeriesKey) -> RunRecord:
    # Positional: this runs for every row of the hot window queries.
    (
        run_id,
        job,
        api,
        intended,
        started,
        finished,
        rounds,
        warmup,
        ok,
        errors,
        p50,
        low,
        high,
        ttfa,
        rate,
        tokens,
        error,
        *server,
    ) = row
    return RunRecord(
        run_id, job, series, api, intended, started, finished, rounds, warmup, ok, errors,
        p50, low, high, ttfa, rate, tokens, _ERROR_CLASSES[error] if error is not None else None, *server,
    )  # fmt: skip


def _sample(row: Mapping[Any, Any], run: RunRecord) -> Sample:
    """A sample from its row, by column key (`select(SAMPLES)`'s mapping, or a chunk's: cold.Read)."""
    values = {name: row[column] for column, name in SAMPLE_COLUMN_FIELDS.items()}
    if values["timing_path"] is not None:
        values["timing_path"] = TimingPath(values["timing_path"])
    return Sample(
        target=run.series.target,
        model=run.series.model,
        api=run.api,
        prompt=run.series.prompt,
        sample_id=str(sample_id_of(run.run_id, row["round"])),
        error=ErrorClass(row["error"]) if row["error"] is not None else None,
        **values,
    )


def _run_of(run: Mapping[str, Any], series: SeriesKey) -> RunRecord:
    """A run read through `cold.read_runs`, as `_run_record` makes it of a row."""
    return _run_record(tuple(run[column.key] for column in _RUN_COLUMNS), series)


_FAR = datetime(9999, 1, 1, tzinfo=UTC)


_HOURLY_SAMPLE_VALUES = ("ttft_ms", "error", "decode_tps", *ROLLUP_SAMPLE_MEDIANS)
_MICROS_KEYS = frozenset(column.key for column in SAMPLES.c if isinstance(column.type, Microseconds))
# The statistics of durations: PostgreSQL computes them over whole microseconds, then divides by 1000.
_DURATION_STATS = tuple(
    field.name
    for field in fields(HourlyStats)
    if field.name.startswith("ttft_") or field.name.removesuffix("_p50") in _MICROS_KEYS
)


def _micros_of(value: Any) -> Any:
    return None if value is None else to_microseconds(value)


def _hourly_of_read(read: cold.Read, *, postgres: bool) -> dict[int, list[HourlyStats]]:
    """`Repository._hourly` over runs read through `cold.read_runs`: per series, its hours (by run start) with
    measured samples, to the last bit as each database's own statement computes them (SQLite's path over
    milliseconds, PostgreSQL's percentile_cont over the microseconds stored)."""
    buckets: dict[tuple[int, datetime], list[Sequence[Any]]] = {}
    servers: dict[tuple[int, datetime], list[Sequence[Any]]] = {}
    convert = [_micros_of if postgres and name in _MICROS_KEYS else None for name in _HOURLY_SAMPLE_VALUES]
    for run in read.runs:
        key = (run["series_id"], floor_hour(run["started_at"]))
        for sample in read.samples.get(run["id"], ()):
            if sample["warmup"]:
                continue
            values = [sample[name] for name in _HOURLY_SAMPLE_VALUES]
            buckets.setdefault(key, []).append(
                [value if to is None else to(value) for value, to in zip(values, convert, strict=True)]
            )
        medians = tuple(run[name] for name in ROLLUP_RUN_MEDIANS)
        if any(value is not None for value in medians):
            servers.setdefault(key, []).append(medians)
    out: dict[int, list[HourlyStats]] = {}
    for (series_id, hour), rows in sorted(buckets.items()):
        stats = hourly_stats(hour, rows, servers.get((series_id, hour), ()))
        if postgres:
            scaled = {name: value / 1000 for name in _DURATION_STATS if (value := getattr(stats, name)) is not None}
            stats = dataclasses.replace(stats, **scaled)
        out.setdefault(series_id, []).append(stats)
    return out


# Runs (with their samples) per statement when SQLite stores a batch (`Repository._save_sqlite`): each part's
# rows are made in one step of the probes' loop, 6-13 ms for 100 and 4-8.5 for 50 in the daemon (bench/daemon.py,
# a young collection often landing in one; the loop's lag p99 target is 5 ms).
SQLITE_SAVE_PART = 25


class Repository:
    """Results in one database. Holds no connection; every call takes one from the engine's pool."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        # Reads are single statements: on PostgreSQL skip BEGIN/ROLLBACK, two round trips per query.
        self._reader = engine.execution_options(isolation_level="AUTOCOMMIT") if self._postgres else engine
        # Series ids never change once committed; caching them saves a round trip per save.
        self._series_ids: dict[SeriesKey, int] = {}

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    def _insert(self, table: Table) -> Any:
        return upsert_insert(self._engine, table)

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with self._reader.connect() as connection:
            yield connection

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[AsyncConnection]:
        """A read of several statements on one snapshot: rows and chunks (cold.read_runs) as one moment saw
        them, never a series-day in both or neither while a compaction commits beside it."""
        async with self._engine.connect() as connection:
            if self._postgres:
                connection = await connection.execution_options(isolation_level="REPEATABLE READ")
            async with connection.begin():
                yield connection

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        async with write_transaction(self._engine) as connection:
            yield connection

    @asynccontextmanager
    async def _partition_change(self) -> AsyncIterator[AsyncConnection]:
        """PostgreSQL: a write transaction for dropping a day partition, after every other session's change of
        the partitions (`partitions.serialize`), waiting at most `partitions.DROP_LOCK_TIMEOUT` for a lock."""
        async with self._write() as connection:
            await connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{partitions.DROP_LOCK_TIMEOUT}'")
            await partitions.serialize(connection)
            yield connection

    async def ping(self) -> None:
        """Raises when the database cannot be reached."""
        async with self._read() as connection:
            await connection.execute(text("SELECT 1"))

    # ---------------------------------------------------------------- writing

    async def save_runs(self, batch: Batch) -> frozenset[uuid.UUID]:
        """Store runs with their samples in one transaction; returns the ids of the runs inserted.

        A run is skipped, with its samples, when its id is stored already (a replay) or when its
        series already has a run of the same job for the same scheduled time (`intended_at`): the
        second run of one tick, as two replicas that could not claim it both probe it. Ad-hoc runs
        (job `adhoc`) have no tick and are only skipped as replays. Both are ON CONFLICT DO NOTHING,
        so replaying any spool, in any order, stores each tick once.
        """
        if not batch:
            return frozenset()
        if not isinstance(batch, StorableBatch):
            # Spool records written by older versions, and runs made or changed by hand.
            batch = storable_batch(batch)
        if self._postgres:
            _check_aware(batch)  # SQLite's checks each part as it goes (`_save_sqlite`)
        learnt: dict[SeriesKey, int] = {}
        try:
            async with self._write() as connection:
                ids = await self._resolve_series(connection, {run.series for run, _ in batch}, learnt)
                if self._postgres:
                    hours = sorted({(ids[run.series], floor_hour(run.started_at)) for run, _ in batch})
                    inserted = await self._save_postgres(connection, batch, ids, hours)
                else:
                    inserted = await self._save_sqlite(connection, batch, ids)
        except BaseException:
            # Ids learnt in a transaction that did not commit may not exist; forget them all.
            self._series_ids.clear()
            raise
        self._series_ids.update(learnt)
        return inserted

    async def _save_sqlite(
        self, connection: AsyncConnection, batch: Batch, ids: dict[SeriesKey, int]
    ) -> frozenset[uuid.UUID]:
        inserted: set[uuid.UUID] = set()
        hours: set[tuple[int, datetime]] = set()
        # A part at a time, in the one transaction: the rows' parameters are made on the probes' loop, and a
        # job's 500 runs at once held it for about 10 ms (bench/daemon.py); between parts it runs the probes.
        # Each part's times are checked with it (a naive one rolls the whole transaction back), not the
        # batch's before the first: 1-2 ms more of one step for 500 runs.
        for start in range(0, len(batch), SQLITE_SAVE_PART):
            part = batch[start : start + SQLITE_SAVE_PART]
            _check_aware(part)
            hours.update((ids[run.series], floor_hour(run.started_at)) for run, _ in part)
            runs = [_run_row(run, ids[run.series]) for run, _ in part]
            new = frozenset(
                await connection.scalars(sqlite.insert(RUNS).on_conflict_do_nothing().returning(RUNS.c.id), runs)
            )
            inserted |= new
            samples = [_sample_row(sample, run) for run, members in part if run.run_id in new for sample in members]
            await _SQLITE_SAMPLES.executemany(connection, samples)
        now = datetime.now(UTC)
        await _SQLITE_MARK_PENDING.executemany(
            connection, [{"series_id": sid, "hour": hour, "marked_at": now} for sid, hour in sorted(hours)]
        )
        return frozenset(inserted)

    async def _save_postgres(
        self, connection: AsyncConnection, batch: Batch, ids: dict[SeriesKey, int], hours: list[tuple[int, datetime]]
    ) -> frozenset[uuid.UUID]:
        """Binary COPY into session-local staging tables, then INSERT ... ON CONFLICT DO NOTHING: several
        times faster than multi-row INSERTs for thousands of samples, and as idempotent."""
        # Through SQLAlchemy first: that begins the transaction the raw connection's COPY then joins.
        for statement in _PG_STAGE_TABLES:
            await connection.exec_driver_sql(statement)
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        if driver is None or not driver.is_in_transaction():
            raise RuntimeError("the bulk insert must run inside the save's transaction")
        await driver.copy_records_to_table(
            "ttft_stage_runs", records=[_run_copy_values(run, ids[run.series]) for run, _ in batch], columns=_RUN_COPY
        )
        await driver.copy_records_to_table(
            "ttft_stage_samples",
            records=[_sample_copy_values(sample, run) for run, members in batch for sample in members],
            columns=_SAMPLE_COPY,
        )
        inserted = frozenset(row[0] for row in await driver.fetch(_PG_MERGE))
        await driver.execute(
            _PG_MARK_PENDING, [sid for sid, _ in hours], [hour for _, hour in hours], datetime.now(UTC)
        )
        return inserted

    async def _resolve_series(
        self, connection: AsyncConnection, keys: set[SeriesKey], learnt: dict[SeriesKey, int]
    ) -> dict[SeriesKey, int]:
        ids = {key: self._series_ids[key] for key in keys if key in self._series_ids}
        missing = sorted(key for key in keys if key not in ids)
        if not missing:
            return ids
        table = SERIES
        rows = [{name: getattr(key, name) for name in SERIES_COLUMNS} for key in missing]
        await connection.execute(self._insert(table).on_conflict_do_nothing(index_elements=list(SERIES_COLUMNS)), rows)
        columns = [table.c[name] for name in SERIES_COLUMNS]
        found = await connection.execute(
            select(table.c.id, *columns).where(tuple_(*columns).in_([tuple(row.values()) for row in rows]))
        )
        for row in found:
            key = SeriesKey(*row[1:])
            ids[key] = learnt[key] = row.id
        return ids

    # ---------------------------------------------------------------- reading

    async def series_list(self) -> list[SeriesKey]:
        table = SERIES
        columns = [table.c[name] for name in SERIES_COLUMNS]
        async with self._read() as connection:
            rows = await connection.execute(select(*columns).order_by(*columns))
            return [SeriesKey(*row) for row in rows]

    async def tokens_seen(self, location: str, since: datetime) -> dict[tuple[str, str], Seen]:
        """The mean tokens per successful probe since `since` at `location`, by (target, prompt), warm-ups
        included (they cost the same): what the cost projection uses once history exists."""
        samples, runs, series = SAMPLES.c, RUNS.c, SERIES.c
        statement = (
            select(
                series.target,
                series.prompt,
                func.count(),
                func.avg(samples.prompt_tokens),
                func.avg(samples.cached_tokens),
                func.avg(samples.completion_tokens),
                func.avg(samples.reasoning_tokens),
            )
            .select_from(SAMPLES.join(RUNS, runs.id == samples.run_id).join(SERIES, series.id == runs.series_id))
            .where(
                series.location == location,
                samples.error.is_(None),
                samples.completion_tokens.is_not(None),
                runs.started_at >= since,
            )
            .group_by(series.target, series.prompt)
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()

        def number(value: Any) -> float | None:
            return None if value is None else float(value)

        return {
            (target, prompt): Seen(int(count), number(p), number(c), number(o), number(r))
            for target, prompt, count, p, c, o, r in rows
        }

    async def tokens_spent(
        self, location: str, since: datetime
    ) -> tuple[dict[tuple[str, str], Tokens], datetime | None]:
        """The tokens every request since `since` at `location` spent, by (job, target), warm-ups and failures
        included, and when the first of those runs started (None: none)."""
        samples, runs, series = SAMPLES.c, RUNS.c, SERIES.c
        statement = (
            select(
                runs.job,
                series.target,
                func.sum(samples.prompt_tokens),
                func.sum(samples.cached_tokens),
                func.sum(samples.completion_tokens),
                func.sum(samples.reasoning_tokens),
                func.min(runs.started_at),
            )
            .select_from(SAMPLES.join(RUNS, runs.id == samples.run_id).join(SERIES, series.id == runs.series_id))
            .where(series.location == location, runs.started_at >= since)
            .group_by(runs.job, series.target)
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        out: dict[tuple[str, str], Tokens] = {}
        first: datetime | None = None
        for job, target, prompt, cached, completion, reasoning, started in rows:
            completion, reasoning = float(completion or 0), float(reasoning or 0)
            out[job, target] = Tokens(
                float(prompt or 0), float(cached or 0), max(completion - reasoning, 0.0), reasoning
            )
            if isinstance(started, str):  # an aggregate SQLite hands back as text
                started = datetime.fromisoformat(started)
            if started.tzinfo is None:
                started = started.replace(tzinfo=UTC)
            first = started if first is None or started < first else first
        return out, first

    async def _series_id(self, connection: AsyncConnection, series: SeriesKey) -> int | None:
        known = self._series_ids.get(series)
        if known is not None:
            return known
        found = await find_series_id(connection, series)
        if found is not None:
            self._series_ids[series] = found
        return found

    async def _series_rows(
        self,
        series: SeriesKey,
        statement: Executable | DirectStatement,
        *,
        connection: AsyncConnection | None = None,
        **params: Any,
    ) -> Sequence[Any]:
        """The rows of `statement` (which binds `:series_id`) for `series`; none for a series never stored.
        On `connection` when given (a transaction's), else on a reading connection of its own. A
        `DirectStatement` gives each row as a tuple (store/direct.py)."""
        if connection is not None:
            series_id = await self._series_id(connection, series)
            if series_id is None:
                return []
            values = {"series_id": series_id, **params}
            if isinstance(statement, DirectStatement):
                return await statement.rows(connection, values)
            return (await connection.execute(statement, values)).all()
        async with self._read() as reading:
            return await self._series_rows(series, statement, connection=reading, **params)

    async def last_runs(self, series: SeriesKey, n: int) -> list[RunRecord]:
        """The `n` most recent runs of `series` (by start), oldest first, from rows and cold chunks alike."""
        async with self._snapshot() as connection:
            rows = await self._series_rows(series, _LAST_RUNS, connection=connection, n=n)
            found = [_run_record(row, series) for row in reversed(rows)]
            series_id = await self._series_id(connection, series)
            # Every run since the n-th newest row is a row or in a chunk: read them all when a chunk may hold some.
            floor = found[0].started_at if len(found) == n and found else datetime.min.replace(tzinfo=UTC)
            if series_id is None or n <= 0 or not await cold.any_chunk(connection, [series_id], floor, _FAR):
                return found
            read = await cold.read_runs(connection, [series_id], floor, _FAR, samples=False)
            return [_run_of(run, series) for run in read.runs[-n:]]

    async def runs_between(
        self, series: SeriesKey, start: datetime, end: datetime, *, connection: AsyncConnection | None = None
    ) -> list[RunRecord]:
        """Runs of `series` started in [start, end), oldest first (on `connection`, when given), from rows and
        cold chunks alike."""
        if connection is None:
            async with self._snapshot() as reading:
                return await self.runs_between(series, start, end, connection=reading)
        series_id = await self._series_id(connection, series)
        if series_id is None:
            return []
        if await cold.any_chunk(connection, [series_id], start, end):
            read = await cold.read_runs(connection, [series_id], start, end, samples=False)
            return [_run_of(run, series) for run in read.runs]
        rows = await self._series_rows(series, _RUNS_BETWEEN, connection=connection, start=start, end=end)
        return [_run_record(row, series) for row in rows]

    async def history_rows(
        self, series: SeriesKey, start: datetime, end: datetime, *, connection: AsyncConnection | None = None
    ) -> HistoryRead:
        """What the detector reads of the runs of `series` started in [start, end), oldest first, from rows and
        cold chunks alike: (started_at, ttft_p50_ms, error, ok, errors, rounds, canary, server_build), and which
        came from a chunk. On `connection` when given."""
        if connection is None:
            async with self._read() as reading:
                return await self.history_rows(series, start, end, connection=reading)
        # The rows first, then whether a chunk may hold some of the range: a compaction committing between the
        # two is then seen by the second (and the range read again through the chunks), never by neither.
        rows = await self._series_rows(series, HISTORY_FROM, connection=connection, start=start, end=end)
        series_id = await self._series_id(connection, series)
        if series_id is None or not await cold.any_chunk_of_series(connection, series_id, start, end):
            return HistoryRead([tuple(row) for row in rows], None)
        return HistoryRead(*await cold.history_runs(connection, series_id, rows, start, end, _HISTORY_KEYS))

    async def history_since_span(
        self,
        series: SeriesKey,
        start: datetime,
        last: datetime,
        end: datetime,
        *,
        connection: AsyncConnection | None = None,
    ) -> tuple[HistorySpan, list[tuple[Any, ...]]]:
        """What the rows and the chunks hold of `series` up to `last` (`HistorySpan`), and what `history_rows` reads
        of the runs started in (last, end) as rows, on one connection (`connection` when given): a detector's kept
        history checked and brought up to date."""
        if connection is None:
            async with self._read() as reading:
                return await self.history_since_span(series, start, last, end, connection=reading)
        # The new rows first: a commit the first statement sees, the second sees too, so a transaction
        # storing runs on both sides of `last` cannot be half seen without the span telling.
        rows = await self._series_rows(series, HISTORY_AFTER, connection=connection, after=last, end=end)
        span = await self._series_rows(
            series, RUN_SPAN, connection=connection, start=start, end=last, recent=cold.day_of(last) - cold.DAY
        )
        count, first, newest, oldest_chunk, newest_chunk = span[0] if span else (0, None, None, None, None)
        return HistorySpan(int(count), first, newest, oldest_chunk, newest_chunk), list(rows)

    async def load_runs(
        self, series: SeriesKey, start: datetime, end: datetime
    ) -> list[tuple[RunRecord, list[Sample]]]:
        """Runs of `series` started in [start, end) with every sample, in the shape `save_runs` takes, from rows
        and cold chunks alike (one snapshot: a compaction committing meanwhile is seen whole or not at all)."""
        async with self._snapshot() as connection:
            series_id = await self._series_id(connection, series)
            if series_id is None:
                return []
            if await cold.any_chunk(connection, [series_id], start, end):
                read = await cold.read_runs(connection, [series_id], start, end)
                out = []
                for row in read.runs:
                    run = _run_of(row, series)
                    out.append((run, [_sample(sample, run) for sample in read.samples.get(run.run_id, ())]))
                return out
            rows = await self._series_rows(series, _RUNS_BETWEEN, connection=connection, start=start, end=end)
            by_id: dict[uuid.UUID, tuple[RunRecord, list[Sample]]] = {}
            for row in rows:
                run = _run_record(row, series)
                by_id[run.run_id] = (run, [])
            ids = list(by_id)
            for offset in range(0, len(ids), 500):
                chunk = ids[offset : offset + 500]
                ticks = [by_id[run_id][0].intended_at for run_id in chunk]
                found = await connection.execute(
                    select(SAMPLES)
                    .where(
                        SampleRow.run_id.in_(chunk),
                        # The days these runs are kept in: PostgreSQL reads only those partitions.
                        SampleRow.intended_at >= min(ticks),
                        SampleRow.intended_at <= max(ticks),
                    )
                    .order_by(SampleRow.run_id, SampleRow.round)
                )
                for sample in found:
                    run, members = by_id[sample.run_id]
                    members.append(_sample(sample._mapping, run))
        return list(by_id.values())

    async def hourly_percentiles(self, series: SeriesKey, start: datetime, end: datetime) -> list[HourlyStats]:
        """Per UTC hour of run start in [start, end): measured samples, errors, TTFT p50/p90/p99/min/max
        and the median decode rate, computed from raw samples. Hours without samples are left out."""
        async with self._snapshot() as connection:
            series_id = await self._series_id(connection, series)
            if series_id is None:
                return []
            return (await self._hourly(connection, [series_id], start, end)).get(series_id, [])

    async def hourly_of(
        self, series_ids: Sequence[int], start: datetime, end: datetime
    ) -> dict[int, list[HourlyStats]]:
        """`hourly_percentiles` of several series by id in one query: per series id, its hours in
        [start, end) computed from raw samples."""
        if not series_ids:
            return {}
        async with self._snapshot() as connection:
            return await self._hourly(connection, list(series_ids), start, end)

    async def rollups_between(self, series: SeriesKey, start: datetime, end: datetime) -> list[HourlyStats]:
        """Stored hourly rollups of `series` for hours starting in [start, end) (kept after raw samples)."""
        rows = await self._series_rows(series, _ROLLUPS_BETWEEN, start=start, end=end)
        return [HourlyStats(*row) for row in rows]

    async def _hourly(
        self, connection: AsyncConnection, series_ids: Sequence[int], start: datetime, end: datetime
    ) -> dict[int, list[HourlyStats]]:
        """Hourly statistics of several series in one query (rollups compute a whole hour at once); computed
        here from `cold.read_runs` when a cold chunk may hold some of their runs (a late run for a compacted day
        marks its hour for a new rollup)."""
        window = {"series_ids": list(series_ids), "start": start, "end": end}
        out: dict[int, list[HourlyStats]] = {}
        if await cold.any_chunk(connection, series_ids, start, end):
            read = await cold.read_runs(
                connection,
                series_ids,
                start,
                end,
                run_keys=ROLLUP_RUN_MEDIANS,
                sample_keys=("warmup", *_HOURLY_SAMPLE_VALUES),
            )
            return _hourly_of_read(read, postgres=self._postgres)
        if not self._postgres:
            # SQLite has no percentile aggregate: stream the window's values and compute them here.
            buckets: dict[tuple[int, str], list[Sequence[Any]]] = {}
            for series_id, hour_key, *values in await connection.execute(_HOURLY_VALUES, window):
                bucket = buckets.get((series_id, hour_key))
                if bucket is None:
                    bucket = buckets[(series_id, hour_key)] = []
                bucket.append(values)
            runs: dict[tuple[int, str], list[Sequence[float | None]]] = {}
            for series_id, hour_key, *values in await connection.execute(_HOURLY_RUN_VALUES, window):
                runs.setdefault((series_id, hour_key), []).append(values)
            for (series_id, key), rows in buckets.items():
                hour = datetime.strptime(key, "%Y-%m-%d %H").replace(tzinfo=UTC)
                out.setdefault(series_id, []).append(hourly_stats(hour, rows, runs.get((series_id, key), ())))
            return out
        servers = {
            (series_id, hour): values
            for series_id, hour, *values in await connection.execute(_hourly_run_medians_statement(), window)
        }
        no_server = (None,) * len(ROLLUP_RUN_MEDIANS)
        found = await connection.execute(_hourly_percentiles_statement(), window)
        for series_id, hour, count, errors, quantiles, low, high, rate, *medians in found:
            p10, p50, p90, p99 = quantiles if quantiles is not None else (None, None, None, None)
            server = servers.get((series_id, hour), no_server)
            out.setdefault(series_id, []).append(
                HourlyStats(
                    hour, count, errors, p50, p90, p99, low, high, rate, p10,
                    *medians, *server,
                )
            )  # fmt: skip
        return out

    # ---------------------------------------------------------------- budget holds

    async def load_budget_holds(self, location: str) -> list[BudgetHoldRecord]:
        """The location's stored holds (expired ones included: the caller judges them)."""
        table = BUDGET_HOLDS
        async with self._read() as connection:
            rows = await connection.execute(
                select(table.c.job, table.c.action, table.c.budget, table.c.per, table.c.since, table.c.until).where(
                    table.c.location == location
                )
            )
            return [BudgetHoldRecord(*row) for row in rows]

    async def save_budget_hold(self, location: str, hold: BudgetHoldRecord) -> None:
        """The job's hold, replacing the one it had."""
        table = BUDGET_HOLDS
        values = {
            "action": hold.action,
            "budget": hold.budget,
            "per": hold.per,
            "since": hold.since,
            "until": hold.until,
        }
        statement = self._insert(table).values(location=location, job=hold.job, **values)
        statement = statement.on_conflict_do_update(index_elements=["location", "job"], set_=values)
        async with self._write() as connection:
            await connection.execute(statement)

    async def delete_budget_holds(self, location: str, jobs: Sequence[str]) -> None:
        if not jobs:
            return
        table = BUDGET_HOLDS
        async with self._write() as connection:
            await connection.execute(table.delete().where(table.c.location == location, table.c.job.in_(list(jobs))))

    # ---------------------------------------------------------------- prompt calibration

    async def load_calibration(self) -> dict[tuple[str, str], tuple[float, float]]:
        """Every stored fit: (target, prompt) -> (chars_per_token, overhead_tokens)."""
        table = CALIBRATION
        async with self._read() as connection:
            rows = await connection.execute(
                select(table.c.target, table.c.prompt, table.c.chars_per_token, table.c.overhead_tokens)
            )
            return {(row.target, row.prompt): (row.chars_per_token, row.overhead_tokens) for row in rows}

    async def save_calibration(self, key: tuple[str, str], chars_per_token: float, overhead_tokens: float) -> None:
        await self.save_calibrations({key: (chars_per_token, overhead_tokens)})

    async def save_calibrations(self, fits: Mapping[tuple[str, str], tuple[float, float]]) -> None:
        """Store (target, prompt) -> (characters per token, overhead tokens), replacing what was stored, in one
        transaction: a new daemon's first tick fits every series at once (500 transactions, each a sync
        of the file, were a tenth of that tick's CPU on SQLite)."""
        if not fits:
            return
        statement = self._insert(CALIBRATION)
        statement = statement.on_conflict_do_update(
            index_elements=["target", "prompt"],
            set_={
                "chars_per_token": statement.excluded.chars_per_token,
                "overhead_tokens": statement.excluded.overhead_tokens,
                "updated_at": statement.excluded.updated_at,
            },
        )
        now = datetime.now(UTC)
        rows = [
            {"target": target, "prompt": prompt, "chars_per_token": cpt, "overhead_tokens": overhead, "updated_at": now}
            for (target, prompt), (cpt, overhead) in sorted(fits.items())
        ]
        async with self._write() as connection:
            await connection.execute(statement, rows)

    # ---------------------------------------------------------------- retention

    async def rollup(self, now: datetime, *, batch_size: int = 500) -> int:
        """(Re)compute the hourly rollups of every complete hour that received runs since its last
        rollup, `batch_size` hours per transaction. Returns the number of hours computed."""
        boundary = floor_hour(now)
        pending, rollups = ROLLUP_PENDING, ROLLUPS
        done = 0
        while True:
            async with self._write() as connection:
                claim = select(pending.c.series_id, pending.c.hour).where(pending.c.hour < boundary)
                claim = claim.order_by(pending.c.hour).limit(batch_size)
                if self._postgres:
                    # Several daemons may run maintenance; each takes different hours.
                    claim = claim.with_for_update(skip_locked=True)
                hours = [(row.series_id, row.hour) for row in await connection.execute(claim)]
                if not hours:
                    break
                await connection.execute(delete(pending).where(tuple_(pending.c.series_id, pending.c.hour).in_(hours)))
                await connection.execute(delete(rollups).where(tuple_(rollups.c.series_id, rollups.c.hour).in_(hours)))
                by_hour: dict[datetime, list[int]] = {}
                for series_id, hour in hours:
                    by_hour.setdefault(hour, []).append(series_id)
                rows = []
                if self._postgres:
                    # No compaction of these series commits while their hours are read (it tries the same
                    # locks and leaves them to its next pass): each hour sees its runs as rows or as a chunk.
                    await connection.execute(
                        text(
                            "SELECT pg_advisory_xact_lock(:key, series_id) "
                            "FROM (SELECT DISTINCT unnest(CAST(:ids AS integer[])) AS series_id ORDER BY 1) AS chosen"
                        ),
                        {"key": cold.COLD_LOCK_KEY, "ids": sorted({series_id for series_id, _ in hours})},
                    )
                for hour, series_ids in by_hour.items():
                    computed = await self._hourly(connection, series_ids, hour, hour + _HOUR)
                    for series_id, [stats] in computed.items():
                        rows.append({"series_id": series_id, **dataclasses.asdict(stats)})
                if rows:
                    await connection.execute(rollups.insert(), rows)
                # The overview's summary read the rollups as they were; housekeeping makes a new one next.
                await overview_summary.invalidate(connection)
            done += len(hours)
            if len(hours) < batch_size:
                break
            await asyncio.sleep(0)
        return done

    async def refresh_overview_summary(self, now: datetime) -> int:
        """Store the overview's reading of the rollups for the current hour (monitor/store/
        overview_summary.py), replacing the last; returns the series summarised. Run after `rollup`."""
        async with self._write() as connection:
            return await overview_summary.refresh(connection, now)

    async def prune(self, now: datetime, raw_days: int, rollup_days: int, batch_size: int = 1000) -> PruneResult:
        """Delete what is past retention, at most `batch_size` rows per short transaction:

        - runs (with their samples) older than `raw_days`; raw data of an hour whose rollup is still
          pending is kept until `rollup` has computed it;
        - job tick claims scheduled more than `raw_days` ago (kept as long as the runs they made);
        - rollups older than `rollup_days`;
        - incidents resolved more than `rollup_days` ago that no notification refers to any more
          (the alert dispatcher prunes its own finished rows, after 30 days); open ones are kept,
          and their triage (acknowledgements, labels, notes) goes with them;
        - incident groups resolved more than `rollup_days` ago once no incident is in them any more;
        - change markers (`annotate`) older than `rollup_days`: the incidents they explained are gone.

        Series, detector state and calibration are one row per configured series or target: they
        do not grow with time and are kept (a running daemon caches series ids).
        """
        pending, rollups = ROLLUP_PENDING, ROLLUPS
        runs: TableClause = RUNS
        samples: TableClause = SAMPLES
        raw_cutoff = now - timedelta(days=raw_days)
        rollup_cutoff = now - timedelta(days=rollup_days)
        async with self._read() as connection:
            oldest_pending = await connection.scalar(select(func.min(pending.c.hour)))
        runs_cutoff = min(raw_cutoff, oldest_pending) if oldest_pending is not None else raw_cutoff
        deleted_runs = deleted_samples = days_dropped = 0
        if self._postgres:
            # Whole days go as partitions; rows are deleted one by one only from the default partitions
            # (history older than the partitions, or written before housekeeping made its day).
            for dropped in await self._drop_aged_days(runs_cutoff):
                deleted_runs += dropped.runs
                deleted_samples += dropped.samples
                days_dropped += 1
            runs = table(partitions.default_name("runs"), column("id"), column("started_at"))
            samples = table(partitions.default_name("samples"), column("run_id"))
        while True:
            async with self._write() as connection:
                ids = list(
                    await connection.scalars(
                        select(runs.c.id)
                        .where(runs.c.started_at < runs_cutoff)
                        .order_by(runs.c.started_at)
                        .limit(batch_size)
                    )
                )
                if ids:
                    deleted_samples += (
                        await connection.execute(delete(samples).where(samples.c.run_id.in_(ids)))
                    ).rowcount
                    deleted_runs += (await connection.execute(delete(runs).where(runs.c.id.in_(ids)))).rowcount
            if len(ids) < batch_size:
                break
            await asyncio.sleep(0)  # let probes and saves in between
        cold_days = 0
        while True:
            # The cold tier's series-days whose every run started before the cutoff, as rows are dropped.
            async with self._write() as connection:
                keys = list(
                    await connection.execute(
                        select(COLD_CHUNKS.c.series_id, COLD_CHUNKS.c.day, COLD_CHUNKS.c.runs, COLD_CHUNKS.c.samples)
                        .where(COLD_CHUNKS.c.last_started_at < type_coerce(runs_cutoff, UtcDateTime()))
                        .order_by(COLD_CHUNKS.c.last_started_at)
                        .limit(batch_size)
                    )
                )
                for series_id, day, runs_held, samples_held in keys:
                    gone = await connection.execute(
                        delete(COLD_CHUNKS).where(
                            COLD_CHUNKS.c.series_id == series_id, COLD_CHUNKS.c.day == type_coerce(day, UtcDateTime())
                        )
                    )
                    if gone.rowcount:
                        cold_days += 1
                        deleted_runs += runs_held
                        deleted_samples += samples_held
            if len(keys) < batch_size:
                break
            await asyncio.sleep(0)
        ticks, incidents, outbox = table_of(JobTickRow), table_of(IncidentRow), table_of(AlertOutboxRow)
        groups, marks = table_of(IncidentGroupRow), table_of(AnnotationRow)
        unreferenced = ~select(outbox.c.id).where(outbox.c.incident_id == incidents.c.id).exists()
        empty = ~select(incidents.c.id).where(incidents.c.group_id == groups.c.id).exists()
        # Each `PruneResult` field's table: its key, the column that ages it and which rows are old enough,
        # in this order (groups are pruned once their incidents are).
        aged: tuple[tuple[str, Table, tuple[Any, ...], Any, Any], ...] = (
            ("job_ticks", ticks, (ticks.c.id,), ticks.c.scheduled_at, ticks.c.scheduled_at < raw_cutoff),
            ("rollups", rollups, (rollups.c.series_id, rollups.c.hour), rollups.c.hour, rollups.c.hour < rollup_cutoff),
            (
                "incidents",
                incidents,
                (incidents.c.id,),
                incidents.c.resolved_at,
                (incidents.c.resolved_at < rollup_cutoff) & unreferenced,
            ),
            (
                "incident_groups",
                groups,
                (groups.c.id,),
                groups.c.resolved_at,
                (groups.c.resolved_at < rollup_cutoff) & empty,
            ),
            ("annotations", marks, (marks.c.id,), marks.c.at, marks.c.at < rollup_cutoff),
        )
        deleted = {
            name: await self._delete_oldest(table, key, age, condition, batch_size)
            for name, table, key, age, condition in aged
        }
        return PruneResult(
            runs=deleted_runs, samples=deleted_samples, days_dropped=days_dropped, cold_days=cold_days, **deleted
        )

    async def compact(
        self,
        now: datetime,
        *,
        cold_after_days: int,
        keep_runs: int | None = None,
        limit: int | None = None,
    ) -> CompactResult:
        """Move every series' day of runs and samples whose whole day (by scheduled time) ended
        `cold_after_days` or more before `now`, and whose hours are rolled up, into the cold tier
        (monitor/store/cold.py): one transaction per series-day, writing its chunk and deleting its rows.
        With `keep_runs`, also only a day that ended before the series' `keep_runs`-th newest run (a series
        with fewer runs than that as rows keeps them all): the overview's note on a series without a baseline
        counts that many from rows (a series retired a week ago would decode its chunks on every overview).
        A day compacted before that received late runs is compacted again (its chunk joined by them). On
        PostgreSQL the day partitions left empty are dropped after. At most `limit` series-days, oldest first (a
        database upgraded with weeks of rows is compacted over several passes). Every reader reads chunks and
        rows alike; the days `cold_after_days` keeps as rows are for the few that read rows only (the burn
        rates, check-config's token history: `Config.cold_minimum`)."""
        before = now - timedelta(days=cold_after_days)
        async with self._read() as connection:
            oldest_pending = await connection.scalar(select(func.min(ROLLUP_PENDING.c.hour)))
            pairs = await cold.compactable(connection, before=before, held_from=oldest_pending)
            pairs = sorted(pairs, key=lambda pair: (pair[1], pair[0]))
            if keep_runs is not None:
                pairs = await self._past_newest_runs(connection, pairs, now, keep_runs, limit)
        pairs = pairs[:limit]
        totals = {"series_days": 0, "runs": 0, "samples": 0, "duplicates": 0, "skipped": 0}
        for series_id, day in pairs:
            async with self._write() as connection:
                if not await cold.lock_series(connection, series_id):
                    totals["skipped"] += 1
                    continue
                done = await cold.compact_series_day(connection, series_id, day)
            totals["series_days"] += 1
            totals["runs"] += done.runs
            totals["samples"] += done.samples
            totals["duplicates"] += done.duplicates
            await asyncio.sleep(0)  # let probes and saves in between
        dropped = len(await self._drop_empty_days(cold.day_of(before))) if self._postgres else 0
        return CompactResult(**totals, days_dropped=dropped)

    @staticmethod
    async def _past_newest_runs(
        connection: AsyncConnection,
        pairs: Sequence[tuple[int, datetime]],
        now: datetime,
        keep_runs: int,
        limit: int | None,
    ) -> list[tuple[int, datetime]]:
        """The (series, day) pairs, in order, whose day ended before the series' `keep_runs`-th newest run as
        rows. Each series' is looked up once (the runs index, newest first), `REACH_BATCH` series a statement,
        and only until `limit` pairs are found."""
        reach: dict[int, datetime | None] = {}
        kept: list[tuple[int, datetime]] = []
        order = list(dict.fromkeys(series_id for series_id, _ in pairs))
        looked = 0
        # A statement for each series cost 13-20 s a pass at 5,000 series on PostgreSQL, its planning over every
        # day partition (plan_cache_mode force_custom_plan) each time, and 5-7 s on SQLite; 100 a statement, 1 s.
        newest = (
            select(RunRow.started_at)
            .where(RunRow.series_id == SERIES.c.id, RunRow.started_at < type_coerce(now, UtcDateTime()))
            .order_by(RunRow.started_at.desc())
            .offset(keep_runs - 1)
            .limit(1)
            .correlate(SERIES)
            .scalar_subquery()
        )
        for series_id, day in pairs:
            if series_id not in reach:
                batch = order[looked : looked + REACH_BATCH]
                looked += len(batch)
                found = await connection.execute(select(SERIES.c.id, newest).where(SERIES.c.id.in_(batch)))
                reach.update({one: at for one, at in found})
                reach.setdefault(series_id, None)
            edge = reach[series_id]
            if edge is not None and day + cold.DAY <= edge:
                kept.append((series_id, day))
                if limit is not None and len(kept) >= limit:
                    break
        return kept

    async def _drop_empty_days(self, before: datetime) -> list[str]:
        """PostgreSQL: drop the day partitions (runs and samples) of days before `before` left without a row by
        compaction. Each is locked before it is looked at, so a late run cannot land in it between the look
        and the drop (it lands in the default partition afterwards, and is read beside the chunk)."""
        async with self._read() as connection:
            names = await partitions.existing(connection, "runs")
        days = sorted(
            day for name in names if (day := partitions.day_of(name)) and partitions.day_bounds(day)[1] <= before
        )
        dropped: list[str] = []
        for day in days:
            runs_name, samples_name = partitions.partition_name("runs", day), partitions.partition_name("samples", day)
            try:
                async with self._partition_change() as connection:
                    if not await partitions.exists(connection, runs_name):
                        continue
                    present = [runs_name]
                    if await partitions.exists(connection, samples_name):
                        present.append(samples_name)
                    await connection.exec_driver_sql(f"LOCK TABLE {', '.join(present)} IN ACCESS EXCLUSIVE MODE")
                    held = [await connection.scalar(text(f"SELECT EXISTS (SELECT 1 FROM {name})")) for name in present]
                    if any(held):
                        continue
                    for name in reversed(present):
                        await connection.exec_driver_sql(f"DROP TABLE {name}")
            except DBAPIError as exc:
                if _sqlstate(exc) == LOCK_NOT_AVAILABLE:
                    continue
                raise
            dropped.append(runs_name)
        return dropped

    async def ensure_partitions(self, now: datetime) -> list[str]:
        """PostgreSQL: create the day partitions of runs and samples from yesterday to
        `partitions.AHEAD_DAYS` ahead that are missing, moving any of their rows out of the default
        partitions; returns the names created. Nothing on SQLite (one table each)."""
        if not self._postgres:
            return []
        return await partitions.ensure_days(self._engine, partitions.days_around(now))

    async def analyze_partitions(self) -> list[str]:
        """PostgreSQL: ANALYZE the day partitions whose statistics lag their rows (autovacuum had not
        got there); returns their names. Run before `rollup`. Nothing on SQLite."""
        if not self._postgres:
            return []
        return await partitions.analyze_stale(self._engine)

    async def _drop_aged_days(self, cutoff: datetime) -> list[partitions.Dropped]:
        """Drop the day partitions (runs and samples together) whose every run started before `cutoff`,
        oldest first; stops at the first day that still holds a younger run, or whose tables another
        session holds for longer than `partitions.DROP_LOCK_TIMEOUT` (the next pass retries it)."""
        async with self._read() as connection:
            names = await partitions.existing(connection, "runs")
        days = partitions.droppable_days([day for name in names if (day := partitions.day_of(name))], cutoff=cutoff)
        dropped: list[partitions.Dropped] = []
        for day in days:
            runs_name, samples_name = partitions.partition_name("runs", day), partitions.partition_name("samples", day)
            try:
                async with self._partition_change() as connection:
                    if not await partitions.exists(connection, runs_name):
                        continue  # another daemon's housekeeping dropped it first
                    latest = await connection.scalar(text(f"SELECT max(started_at) FROM {runs_name}"))
                    if latest is not None and latest >= cutoff:
                        break  # a run of that day started late; its day waits for it
                    runs_count = int(await connection.scalar(text(f"SELECT count(*) FROM {runs_name}")) or 0)
                    samples_count = 0
                    if await partitions.exists(connection, samples_name):
                        samples_count = int(await connection.scalar(text(f"SELECT count(*) FROM {samples_name}")) or 0)
                        await connection.exec_driver_sql(f"DROP TABLE {samples_name}")
                    await connection.exec_driver_sql(f"DROP TABLE {runs_name}")
            except DBAPIError as exc:
                if _sqlstate(exc) == LOCK_NOT_AVAILABLE:
                    break
                raise
            dropped.append(partitions.Dropped(day, runs_count, samples_count))
        return dropped

    async def _delete_oldest(self, table: Table, key: Sequence[Any], age: Any, condition: Any, batch_size: int) -> int:
        """Delete the rows matching `condition`, oldest (by `age`) first, `batch_size` per transaction."""
        deleted = 0
        while True:
            async with self._write() as connection:
                keys = [
                    tuple(row)
                    for row in await connection.execute(select(*key).where(condition).order_by(age).limit(batch_size))
                ]
                if keys:
                    result = await connection.execute(delete(table).where(tuple_(*key).in_(keys)))
                    deleted += result.rowcount
            if len(keys) < batch_size:
                return deleted
            await asyncio.sleep(0)
