"""What the overview reads of the hourly rollups, and the summary of it that housekeeping keeps.

The overview (monitor/web/queries.py `overview`) shows, per series, availability over 24 h / 7 d / 30 d,
a baseline (the median of the hourly p50s over the week before the last hour) and a 24 h sparkline.
Whole past hours come from the rollups; scanning a month of them costs as much as the series have hours
(5,000 series x 720 hours is 3.6M rows), so it grew with history until the month was full.

Housekeeping therefore computes that reading once per hour, after the rollup (`refresh`), with each
series' last run in the month (later runs are all in hours the overview reads from runs), and stores it
per series (`overview_summary`, with its key in `overview_summary_state`, migration 0019); the
overview reads those rows (`load`): one row per series, whatever the history. A reading is valid for the
hour it was made in. Hours whose rollup became pending since (a late run arrived: the overview counts
their runs instead) are taken out again with their own rollups, so the summary gives
exactly what a fresh scan would: both are built by `read_rollups`, and the tests compare them.
A rollup invalidates the summary in its own transaction (the next housekeeping pass, which follows
the rollup, makes a new one); until then, and before the first, the overview scans as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Integer, and_, case, delete, func, insert, select, text, tuple_, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import NullType

from monitor.quantile import quantile
from monitor.store import cold
from monitor.store.models import (
    COLD_CHUNKS,
    OverviewSummaryRow,
    OverviewSummaryStateRow,
    RollupPendingRow,
    RollupRow,
    RunRow,
    SeriesRow,
)
from monitor.store.records import floor_hour
from monitor.store.types import UtcDateTime

# The overview's availability windows, newest first: a day, a week, a month before now (the month from the top of
# its first hour: OverviewHours.at).
WINDOWS = (timedelta(days=1), timedelta(days=7), timedelta(days=30))
SPARK_HOURS = 24
_STATE_ID = 1
SUMMARY_LOCK_KEY = 0x7474_666F  # "ttfo": held while the summary is replaced


@dataclass(frozen=True)
class OverviewHours:
    """The hours the overview reads at `now`: its windows' starts (newest first), the current hour
    (not whole yet: read from runs) and the sparkline's first hour."""

    now: datetime
    windows: tuple[datetime, ...]
    current: datetime
    spark_from: datetime

    @classmethod
    def at(cls, now: datetime) -> OverviewHours:
        current = floor_hour(now)
        day, week, month = (now - span for span in WINDOWS)
        # The week and the month start at the top of their first hour: its rollup holds that hour whole, so no
        # runs are read at their start, where they are in the cold tier's chunks (a chunk a series on every call
        # otherwise: the cold tier takes every day past 3). The day's start is exact (its runs are rows).
        windows = (day, floor_hour(week), floor_hour(month))
        return cls(now, windows, current, current - timedelta(hours=SPARK_HOURS - 1))

    def key(self) -> tuple[datetime, tuple[datetime, ...]]:
        """Two moments with equal keys read the same whole hours of the rollups."""
        return self.current, tuple(ceil_hour(w) for w in self.windows)


@dataclass(frozen=True, slots=True)
class RolledHours:
    """What the overview reads from the hourly rollups of whole past hours, per series: ok samples and
    errors in each window (hours up to date only: a pending hour is counted from its runs), the
    baseline (median of the hourly p50s of the week before the last hour) and the sparkline: its hourly
    p50s by slot, SPARK_HOURS long, rounded as the overview shows them, None where no up-to-date rollup
    (a series without any has no entry). From the summary also each series' last run in the month
    when it was made (start, ok samples; None from a scan).

    The sparkline is kept drawn, not as hour -> p50: the overview copies it per series and call, and
    rounding 5,000 series x 24 slots on every call took a third of its time."""

    counts: dict[int, list[int]]
    medians: dict[int, float]
    sparks: dict[int, list[float | None]]
    last_runs: dict[int, tuple[datetime, int]] | None = None


def ceil_hour(moment: datetime) -> datetime:
    floor = floor_hour(moment)
    return floor if floor == moment else floor + timedelta(hours=1)


async def pending_hours(
    connection: AsyncConnection, *, since: datetime, until: datetime
) -> frozenset[tuple[int, datetime]]:
    """(series, hour) marked pending in [since, until): runs arrived since the hour's rollup."""
    rows = await connection.execute(
        select(RollupPendingRow.series_id, RollupPendingRow.hour).where(
            RollupPendingRow.hour >= type_coerce(since, UtcDateTime()),
            RollupPendingRow.hour < type_coerce(until, UtcDateTime()),
        )
    )
    return frozenset((series_id, _aware(hour)) for series_id, hour in rows)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _moment(value: datetime | str) -> datetime:
    # max() of a timestamp comes back from SQLite as text, without the column's type.
    return _aware(datetime.fromisoformat(value) if isinstance(value, str) else value)


def _cast_to_int(value: Any) -> Any:
    return type_coerce(func.floor(value), Integer).cast(Integer)


async def read_rollups(
    connection: AsyncConnection, hours: OverviewHours, pending: frozenset[tuple[int, datetime]]
) -> RolledHours:
    """One scan of the rollups of whole hours in [oldest window, current) (an index-only scan of
    ix_rollups_hourly_overview on PostgreSQL): per series, ok samples and errors of the up-to-date
    hours in each window; on PostgreSQL also the baseline's median and the sparkline's hourly p50s."""
    windows, current, spark_from = hours.windows, hours.current, hours.spark_from
    hour = RollupRow.hour
    ok = RollupRow.samples - RollupRow.errors
    up_to_date = RollupPendingRow.hour.is_(None)
    postgres = connection.dialect.name == "postgresql"

    def total(since: datetime, column: Any) -> Any:
        return func.sum(case((and_(hour >= type_coerce(since, UtcDateTime()), up_to_date), column), else_=0))

    columns = [total(since, column) for since in windows for column in (ok, RollupRow.errors)]
    if postgres:
        week, last_hour = windows[1], current - timedelta(hours=1)
        in_week = and_(
            hour >= type_coerce(week, UtcDateTime()),
            hour < type_coerce(last_hour, UtcDateTime()),
            RollupRow.ttft_p50_ms.is_not(None),
        )
        in_spark = and_(hour >= type_coerce(spark_from, UtcDateTime()), up_to_date, RollupRow.ttft_p50_ms.is_not(None))
        # The sparkline's slots as whole numbers: 24 small ints per series decode faster than timestamps.
        slot = _cast_to_int((func.extract("epoch", hour) - spark_from.timestamp()) / 3600)
        columns += [
            func.percentile_cont(0.5).within_group(RollupRow.ttft_p50_ms).filter(in_week),
            func.array_agg(slot).filter(in_spark),
            func.array_agg(RollupRow.ttft_p50_ms).filter(in_spark),
        ]
    marked = and_(RollupPendingRow.series_id == RollupRow.series_id, RollupPendingRow.hour == hour)
    rows = await connection.execute(
        select(RollupRow.series_id, *columns)
        .select_from(RollupRow.__table__.outerjoin(RollupPendingRow.__table__, marked))
        .where(hour >= type_coerce(min(windows), UtcDateTime()), hour < type_coerce(current, UtcDateTime()))
        .group_by(RollupRow.series_id)
    )
    counts: dict[int, list[int]] = {}
    medians: dict[int, float] = {}
    sparks: dict[int, list[float | None]] = {}
    for series_id, *values in rows:
        counts[series_id] = [int(v or 0) for v in values[:6]]
        if postgres:
            median, slots, p50s = values[6:]
            if median is not None:
                medians[series_id] = median
            if slots:
                for slot, p50 in zip(slots, p50s, strict=True):
                    _draw(sparks, series_id, slot, p50)
    if not postgres:
        for series_id, at, p50 in await connection.execute(
            select(RollupRow.series_id, hour, RollupRow.ttft_p50_ms).where(
                hour >= type_coerce(spark_from, UtcDateTime()),
                hour < type_coerce(current, UtcDateTime()),
                RollupRow.ttft_p50_ms.is_not(None),
            )
        ):
            if (series_id, at) not in pending:
                _draw(sparks, series_id, spark_slot(spark_from, at), cast(float, p50))
        # SQLite has no percentile aggregate: the week's hourly p50s, and their medians here (the same
        # interpolation as percentile_cont), so the summary holds the baselines on SQLite too.
        week_p50s: dict[int, list[float]] = {}
        for series_id, p50 in await connection.execute(
            select(RollupRow.series_id, RollupRow.ttft_p50_ms).where(
                hour >= type_coerce(windows[1], UtcDateTime()),
                hour < type_coerce(current - timedelta(hours=1), UtcDateTime()),
                RollupRow.ttft_p50_ms.is_not(None),
            )
        ):
            week_p50s.setdefault(series_id, []).append(cast(float, p50))
        for series_id, values in week_p50s.items():
            median = quantile(values, 0.5)
            if median is not None:
                medians[series_id] = median
    return RolledHours(counts, medians, sparks)


def spark_slot(spark_from: datetime, hour: datetime) -> int:
    """The sparkline's slot of `hour` (0 the first hour, SPARK_HOURS - 1 the current one)."""
    return int((hour - spark_from).total_seconds()) // 3600


def _draw(sparks: dict[int, list[float | None]], series_id: int, slot: int, p50: float) -> None:
    if 0 <= slot < SPARK_HOURS:
        line = sparks.get(series_id)
        if line is None:
            line = sparks[series_id] = [None] * SPARK_HOURS
        line[slot] = round(p50, 2)


async def last_runs(
    connection: AsyncConnection, *, now: datetime, month: datetime, series_ids: Sequence[int] | None = None
) -> dict[int, tuple[datetime | None, int | None]]:
    """Per series (of `series_ids`, else every one): its last run's start in [month, now) and that run's
    ok samples ((None, None) without one)."""
    started = RunRow.started_at
    # One backward step of the runs index (series_id, started_at) per series (and day partition).
    last = (
        select(func.max(started))
        .where(
            RunRow.series_id == SeriesRow.id,
            started >= type_coerce(month, UtcDateTime()),
            started < type_coerce(now, UtcDateTime()),
        )
        .scalar_subquery()
    )
    chosen = select(SeriesRow.id.label("series_id"), last.label("at"))
    if series_ids is not None:
        chosen = chosen.where(SeriesRow.id.in_(list(series_ids)))
    latest = chosen.subquery()
    rows = await connection.execute(
        select(latest.c.series_id, latest.c.at, RunRow.ok).select_from(
            latest.outerjoin(RunRow, and_(RunRow.series_id == latest.c.series_id, started == latest.c.at))
        )
    )
    found = {series_id: (at, ok) for series_id, at, ok in rows}
    # A series whose last run in the month is kept in the cold tier (it has not run for days): its newest chunk,
    # read with the rows after it (monitor/store/cold.py). Only where a chunk ends after the newest row: every
    # series that ran in the last 3 days has its last run as a row, and reading its chunk and days of rows after
    # it cost the summary a read per series.
    newest = await connection.execute(
        select(
            COLD_CHUNKS.c.series_id, func.max(COLD_CHUNKS.c.first_started_at), func.max(COLD_CHUNKS.c.last_started_at)
        )
        .where(
            COLD_CHUNKS.c.last_started_at >= type_coerce(month, UtcDateTime()),
            COLD_CHUNKS.c.first_started_at < type_coerce(now, UtcDateTime()),
            *([COLD_CHUNKS.c.series_id.in_(list(series_ids))] if series_ids is not None else []),
        )
        .group_by(COLD_CHUNKS.c.series_id)
    )
    for series_id, since, until in list(newest):
        row_at = found.get(series_id, (None, None))[0]
        if row_at is not None and _moment(row_at) > _moment(until):
            continue  # its newest row is newer than every run of its chunks
        first = _moment(since)
        read = await cold.read_runs(connection, [series_id], max(first, month), now, samples=False, run_keys=("ok",))
        if read.runs:
            newest_run = read.runs[-1]
            found[series_id] = (newest_run["started_at"], newest_run["ok"])
    return found


async def refresh(connection: AsyncConnection, now: datetime) -> int:
    """Housekeeping: read the rollups as the overview would at `now` and store it as the summary,
    replacing the last one (in the caller's transaction). Returns the series summarised."""
    if connection.dialect.name == "postgresql":
        # Two daemons' housekeeping at once: the second waits, then replaces the first's rows (its
        # delete, a statement after the lock, sees them) instead of colliding with them on the key.
        await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SUMMARY_LOCK_KEY})
    hours = OverviewHours.at(now)
    pending = await pending_hours(connection, since=floor_hour(min(hours.windows)), until=hours.current)
    rolled = await read_rollups(connection, hours, pending)
    last = {
        sid: (at, ok)
        for sid, (at, ok) in (await last_runs(connection, now=now, month=min(hours.windows))).items()
        if at
    }
    generation = uuid.uuid4()
    series_ids = set(rolled.counts) | set(rolled.sparks) | set(rolled.medians) | set(last)
    rows = []
    for series_id in sorted(series_ids):
        ok_day, errors_day, ok_week, errors_week, ok_month, errors_month = rolled.counts.get(series_id, [0] * 6)
        rows.append(
            {
                "series_id": series_id,
                "generation": generation,
                "ok_day": ok_day,
                "errors_day": errors_day,
                "ok_week": ok_week,
                "errors_week": errors_week,
                "ok_month": ok_month,
                "errors_month": errors_month,
                "baseline_ms": rolled.medians.get(series_id),
                "sparkline": rolled.sparks.get(series_id) or [None] * SPARK_HOURS,
                "last_run_at": last.get(series_id, (None, None))[0],
                "last_run_ok": last.get(series_id, (None, None))[1],
            }
        )
    await connection.execute(delete(OverviewSummaryRow))
    await connection.execute(delete(OverviewSummaryStateRow))
    if rows:
        await connection.execute(insert(OverviewSummaryRow), rows)
    current, starts = hours.key()
    await connection.execute(
        insert(OverviewSummaryStateRow).values(
            id=_STATE_ID,
            generation=generation,
            hour=current,
            window_starts=[s.isoformat() for s in starts],
            pending=sorted([series_id, hour.isoformat()] for series_id, hour in pending),
            series=len(rows),
            computed_at=now,
        )
    )
    return len(rows)


async def load(
    connection: AsyncConnection, hours: OverviewHours, pending: frozenset[tuple[int, datetime]]
) -> RolledHours | None:
    """The stored summary as `read_rollups(connection, hours, pending)` would read it now, or None when
    there is none for these hours (housekeeping has not run this hour, or was replacing it meanwhile)."""
    state = (
        await connection.execute(
            select(
                OverviewSummaryStateRow.generation,
                OverviewSummaryStateRow.hour,
                OverviewSummaryStateRow.window_starts,
                OverviewSummaryStateRow.pending,
                OverviewSummaryStateRow.series,
                OverviewSummaryStateRow.computed_at,
            ).where(OverviewSummaryStateRow.id == _STATE_ID)
        )
    ).first()
    if state is None:
        return None
    generation, hour, window_starts, pending_then_json, series, computed_at = state
    current, starts = hours.key()
    if _aware(hour) != current or [datetime.fromisoformat(s) for s in window_starts] != list(starts):
        return None
    if hours.now < _aware(computed_at):  # its last runs may be later than the moment asked about
        return None
    summary = OverviewSummaryRow
    postgres = connection.dialect.name == "postgresql"
    rows = (
        await connection.execute(
            select(
                summary.series_id,
                summary.ok_day,
                summary.errors_day,
                summary.ok_week,
                summary.errors_week,
                summary.ok_month,
                summary.errors_month,
                summary.baseline_ms,
                # PostgreSQL: the list asyncpg decoded, not visited again item by item by SQLAlchemy's
                # ARRAY (5,000 series x 24 slots per call); SQLite: the JSON decoded.
                type_coerce(summary.sparkline, NullType()) if postgres else summary.sparkline,
                summary.last_run_at,
                summary.last_run_ok,
            ).where(summary.generation == generation)
        )
    ).all()
    if len(rows) != series:  # replaced between the two reads: the caller scans instead
        return None
    counts: dict[int, list[int]] = {}
    medians: dict[int, float] = {}
    sparks: dict[int, list[float | None]] = {}
    last: dict[int, tuple[datetime, int]] = {}
    for series_id, *totals, baseline, sparkline, last_at, last_ok in rows:
        counts[series_id] = totals
        if last_at is not None:
            last[series_id] = (_aware(last_at), last_ok)
        if baseline is not None:
            medians[series_id] = baseline
        if sparkline and sparkline.count(None) < len(sparkline):  # some slot drawn
            sparks[series_id] = list(sparkline)
    rolled = RolledHours(counts, medians, sparks, last)
    pending_then = frozenset((int(sid), datetime.fromisoformat(at)) for sid, at in pending_then_json)
    if pending_then - pending:
        return None  # rolled up since (`invalidate` missed? retention?): the caller scans instead
    await _leave_out(connection, rolled, hours, pending - pending_then)
    return rolled


async def invalidate(connection: AsyncConnection) -> None:
    """Forget the stored summary (in the caller's transaction): rollups changed under it."""
    await connection.execute(delete(OverviewSummaryStateRow))


async def _leave_out(
    connection: AsyncConnection,
    rolled: RolledHours,
    hours: OverviewHours,
    now_pending: Collection[tuple[int, datetime]],
) -> None:
    """Bring a stored reading up to date: hours marked pending since it was made (a late run arrived)
    leave the counts and the sparkline, as a scan leaves them out (the overview counts their runs).
    Their rollups are the ones the summary read: a rollup since would have invalidated it."""
    if not now_pending:
        return
    found: dict[tuple[int, datetime], tuple[int, int]] = {}
    columns = (RollupRow.series_id, RollupRow.hour, RollupRow.samples, RollupRow.errors)
    for chunk in _chunks(list(now_pending), 500):
        rows = await connection.execute(select(*columns).where(tuple_(RollupRow.series_id, RollupRow.hour).in_(chunk)))
        for series_id, hour, samples, errors in rows:
            found[(series_id, _aware(hour))] = (samples, errors)
    starts = hours.key()[1]
    for (series_id, hour), (samples, errors) in found.items():
        totals = rolled.counts.setdefault(series_id, [0] * 6)
        for index, start in enumerate(starts):
            if start <= hour < hours.current:
                totals[2 * index] -= samples - errors
                totals[2 * index + 1] -= errors
        line = rolled.sparks.get(series_id)
        if line is not None and hours.spark_from <= hour < hours.current:
            line[spark_slot(hours.spark_from, hour)] = None


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
