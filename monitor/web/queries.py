"""What the pages, the JSON API and the reports show, read from the store. Read-only.

Each function takes an engine and plain parameters and returns JSON-ready dicts with stable field
names (docs/api.md); the aggregation itself lives in pure functions below them and in `stats`.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import operator
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, NotRequired, TypedDict, cast

from sqlalchemy import Integer, and_, func, not_, or_, select, text, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.types import NullType

from monitor.config.series import WARM_TWIN_SUFFIX, warm_twin
from monitor.detect.attribution import ServerSplit, classify, split_text
from monitor.detect.burn_service import ALL_PROMPTS
from monitor.detect.cache_health import PairRun
from monitor.detect.detector import Detector, Rules, RunPoint
from monitor.detect.figures import figures_of
from monitor.detect.noise import NoiseModel
from monitor.detect.noise import describe as describe_noise
from monitor.quantile import mixture_quantile, quantile
from monitor.store import cold, overview_summary
from monitor.store.models import (
    SAMPLES_OF_RUN,
    AlertDeliveryRow,
    AlertOutboxRow,
    IncidentGroupRow,
    IncidentRow,
    RollupRow,
    RunRow,
    SampleRow,
    SeriesRow,
)
from monitor.store.overview_summary import SPARK_HOURS, OverviewHours, RolledHours, ceil_hour, spark_slot
from monitor.store.records import SERVER_RUN_FIELDS, HourlyStats, floor_hour
from monitor.store.repository import Repository
from monitor.store.triage import ANNOTATION_WINDOW, TriageStore, related_annotations
from monitor.store.types import UtcDateTime
from monitor.timefmt import iso
from monitor.web import stats
from monitor.web.errors import NotFound as NotFound  # re-exported: callers catch them from here too
from monitor.web.errors import TooBroad as TooBroad
from monitor.web.payloads import triage_json

MAX_POINTS = 1500
# The detector evaluates about 15,000 runs a second on this machine (4,320 runs in 0.3 s); beyond this many in a view
# it is replayed over the hourly rollups instead (a 7-day view of 5-minute runs steps 2,300 runs).
MAX_REPLAYED_RUNS = 1500
# Raw samples are kept this long by default (database.retention.raw_days); longer views use rollups.
RAW_RANGE = timedelta(days=7)
STATUS_ORDER = ("page", "down", "ticket", "no data", "ok")
_BUCKET_STEPS_S = (1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
PHASES = ("dns_ms", "connect_ms", "tls_ms", "ttfb_ms", "first_event_ms", "ttft_ms", "ttfa_ms")
# What the server said about itself over each run (migration 0006), as the points name it.
SERVER_FIELDS = SERVER_RUN_FIELDS


async def _cold_read(
    connection: AsyncConnection,
    series_ids: Sequence[int],
    *,
    start: datetime,
    end: datetime,
    samples: bool = False,
    run_keys: Collection[str] = (),
    sample_keys: Collection[str] = (),
) -> cold.Read | None:
    """The runs of `series_ids` started in [start, end) (with their samples when `samples`) through the cold
    tier's one read, rows and chunks alike (monitor/store/cold.py), when a chunk may hold some of them; None
    when none does, and the caller's own statements read the rows. Each view reads on one snapshot
    (`_snapshot`), so a compaction committing meanwhile is seen whole or not at all."""
    if not await cold.any_chunk(connection, series_ids, start, end):
        return None
    return await cold.read_runs(
        connection, series_ids, start, end, samples=samples, run_keys=run_keys, sample_keys=sample_keys
    )


async def _snapshot(connection: AsyncConnection) -> AsyncConnection:
    """`connection` reading on one snapshot for its whole transaction (PostgreSQL: REPEATABLE READ; SQLite's
    read transaction is one already): call before its first statement."""
    if connection.dialect.name == "postgresql":
        return await connection.execution_options(isolation_level="REPEATABLE READ")
    return connection


async def _one_worker(connection: AsyncConnection) -> None:
    """No parallel workers for the rest of `connection`'s transaction (PostgreSQL; nothing on SQLite): its
    statements are small. For a series view's day of samples over 22 day partitions PostgreSQL started two (its
    estimate of the runs a `started_at` window finds, in tables partitioned by `intended_at`, is high), and
    starting them took 8-15 ms of a statement that runs in 0.6 ms alone (EXPLAIN ANALYZE, 13 days of history).
    The compares keep them: over a week of samples two workers take a third off (bench/scale.py)."""
    if connection.dialect.name == "postgresql":
        await connection.execute(text("SET LOCAL max_parallel_workers_per_gather = 0"))


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    id: int
    target: str
    provider: str
    model: str
    prompt: str
    location: str


def _median(values: Sequence[float]) -> float | None:
    return quantile(values, 0.5)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


# A compare reads every measured sample of its window; past this many runs it is refused, not answered
# slowly: on a production-size history a 400-day compare held a connection and a core for seconds
# per request, and fifty of them took the process to 1.7 GB.
MAX_COMPARE_RUNS = 100_000
# What a run kept in the cold tier costs a compare by samples, in runs read as rows: bench/cold.py measured the
# compare of 100 series over 11 compacted days 578 ms as rows, 3.75 s from chunks (2026-12-07, PostgreSQL).
COLD_RUN_COST = 6
# Beyond MAX_COMPARE_RUNS runs, or where retention has removed the window's raw samples, a compare reads
# the hourly rollups instead (`resolution` "hour"); it reads at most this many series-hours.
MAX_COMPARE_HOURS = 250_000


async def _series(connection: AsyncConnection, ids: Iterable[int] | None = None) -> dict[int, SeriesInfo]:
    query = select(
        SeriesRow.id, SeriesRow.target, SeriesRow.provider, SeriesRow.model, SeriesRow.prompt, SeriesRow.location
    )
    if ids is not None:
        query = query.where(SeriesRow.id.in_(list(ids)))
    return {row[0]: SeriesInfo(*row) for row in await connection.execute(query)}


# ---------------------------------------------------------------- overview


def series_status(*, open_severities: Sequence[tuple[str, str]], runs_24h: int, last_run_failed: bool) -> str:
    """ok, ticket, page, down or no data, from the open incidents (kind, severity) and recent runs."""
    if not open_severities:  # most series, on every overview of thousands
        return "down" if runs_24h and last_run_failed else "ok" if runs_24h else "no data"
    if any(kind == "availability" for kind, _ in open_severities) or (runs_24h and last_run_failed):
        return "down"
    if any(severity == "page" for _, severity in open_severities):
        return "page"
    if any(severity == "ticket" for _, severity in open_severities):
        return "ticket"
    if runs_24h == 0:
        return "no data"
    return "ok"


def _status_rank(item: dict[str, Any]) -> tuple[int, float, str, str, str]:
    ratio = item["ratio"] if item["ratio"] is not None else 0.0
    return (STATUS_ORDER.index(item["status"]), -ratio, item["provider"], item["target"], item["prompt"])


class OverviewCache:
    """The overview's reading of the rollups, kept between calls while it cannot have changed.

    Rollups of past hours change only when the rollup job recomputes an hour, which removes that
    hour's pending mark in the same transaction, or when a late run marks one pending: so the reading
    stays valid while the hour, the windows' starting hours and the set of pending hours are those it
    was made with. `max_age_s` bounds what nothing marks (retention deleting old rollups, manual edits).
    One entry: the overview always asks for "now".
    """

    def __init__(self, *, max_age_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._entry: tuple[Any, float, RolledHours] | None = None
        self.hits = 0

    def get(self, key: Any) -> RolledHours | None:
        if self._entry is None:
            return None
        stored_key, at, value = self._entry
        if stored_key != key or self._clock() - at > self._max_age_s:
            return None
        self.hits += 1
        return value

    def put(self, key: Any, value: RolledHours) -> None:
        self._entry = (key, self._clock(), value)


def baseline_note(*, runs: int, first_run_at: datetime | None, min_history_runs: int, now: datetime) -> str:
    """Why a series has no baseline yet: the detector is still learning (fewer valid runs than it needs
    before a verdict), or the overview's baseline (the runs before the last hour) has nothing yet."""
    if runs == 0 or first_run_at is None:
        return "no runs yet"
    if runs < min_history_runs:
        return f"learning, {runs} of {min_history_runs} runs"
    ready = first_run_at + timedelta(hours=1)
    if ready <= now:  # runs, but none with a TTFT in the day before the last hour
        return "no runs in the day before the last hour"
    return f"first hour: from {ready.astimezone(UTC):%H:%M} UTC"


async def _run_counts(
    connection: AsyncConnection,
    series_ids: Sequence[int],
    *,
    since: datetime,
    until: datetime,
    enough: int | None = None,
) -> dict[int, tuple[int, datetime]]:
    """Per series: its runs with a TTFT in [since, until) and the first one's start. With `enough`, a series
    whose count reaches it may be counted short of the rest (at least `enough`, and its first start then one
    before every run counted, or before every run in the range where that would be in the last hour before
    `until`), so a series whose older days are in the cold tier decodes only its newest chunks, if any: what
    `baseline_note` needs."""
    if not series_ids:
        return {}
    counted = await _rows_run_counts(connection, series_ids, since=since, until=until)
    if not await cold.any_chunk(connection, series_ids, since, until):
        return counted
    if enough is None:
        read = await cold.read_runs(connection, series_ids, since, until, samples=False, run_keys=("ttft_p50_ms",))
        return _counted(read.runs, {})
    # The runs rows count is exact where no chunk is in the range, and enough where it reaches `enough` (its
    # last hour's runs are rows: more than `enough` of them could only be read short of what chunks add before).
    for series_id in series_ids:
        rows, first = counted.get(series_id, (0, since))
        if rows >= enough:
            # Rows' first in the last hour: `baseline_note` tells a series' first hour by it, so it is a chunk's
            # when one holds a run with a TTFT before (a series back after its older days were compacted), older
            # than any row, as below. An older first says the same whatever the chunks hold: none is decoded.
            if first > until - timedelta(hours=1) and await _counted_in_chunks_before(
                connection, series_id, since, first
            ):
                counted[series_id] = (rows, since)
            continue
        if not await cold.any_chunk(connection, [series_id], since, until):
            continue
        newest = await cold.newest_start(connection, series_id, since, until)
        own: dict[int, tuple[int, datetime]] = {}
        end = until if newest is None else min(until, newest + timedelta(microseconds=1))
        # A UTC day at a time (a chunk's), newest first: most series reach `enough` in their newest one.
        while end > since:
            start = max(since, cold.day_of(end - timedelta(microseconds=1)))
            read = await cold.read_runs(connection, [series_id], start, end, samples=False, run_keys=("ttft_p50_ms",))
            own = _counted(read.runs, own)
            end = start
            if own.get(series_id, (0, since))[0] >= enough and end > since:
                own[series_id] = (own[series_id][0], since)  # runs before it are not counted: older than any
                break
        if series_id in own:
            counted[series_id] = own[series_id]
        else:
            counted.pop(series_id, None)
    return counted


async def _counted_in_chunks_before(
    connection: AsyncConnection, series_id: int, since: datetime, end: datetime
) -> bool:
    """Whether the series' chunks hold a run with a TTFT started in [since, end): decoded newest day first, until
    one is found (nearly always in the first)."""
    chunks = await cold.chunks_touching(connection, [series_id], since, end, samples=False)
    for chunk in reversed(chunks):
        runs, _ = cold.decode_chunk(chunk.layout, chunk.runs_chunk, None, run_keys=("ttft_p50_ms", "started_at"))
        if any(run["ttft_p50_ms"] is not None and since <= run["started_at"] < end for run in runs):
            return True
    return False


def _counted(
    runs: Iterable[Mapping[str, Any]], counted: dict[int, tuple[int, datetime]]
) -> dict[int, tuple[int, datetime]]:
    for run in runs:
        if run["ttft_p50_ms"] is not None:
            number, first = counted.get(run["series_id"], (0, run["started_at"]))
            counted[run["series_id"]] = (number + 1, min(first, run["started_at"]))
    return counted


async def _rows_run_counts(
    connection: AsyncConnection, series_ids: Sequence[int], *, since: datetime, until: datetime
) -> dict[int, tuple[int, datetime]]:
    rows = await connection.execute(
        select(RunRow.series_id, func.count(), func.min(RunRow.started_at))
        .where(
            RunRow.series_id.in_(list(series_ids)),
            RunRow.ttft_p50_ms.is_not(None),
            RunRow.started_at >= type_coerce(since, UtcDateTime()),
            RunRow.started_at < type_coerce(until, UtcDateTime()),
        )
        .group_by(RunRow.series_id)
    )
    return {sid: (count, _aware(first)) for sid, count, first in rows if first is not None}


def _aware(moment: datetime | str) -> datetime:
    # min() of a timestamp comes back from SQLite as text, without the column's type.
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def overview(
    engine: AsyncEngine, *, now: datetime, cache: OverviewCache | None = None, min_history_runs: int | None = None
) -> list[dict[str, Any]]:
    """Every series with status, last-hour p50, baseline, ratio, a 24 h sparkline and availability;
    what is on fire first (page, down, ticket, no data, ok; then by ratio). A series without a
    baseline says why in `baseline_note` (`min_history_runs`: the detector's, default rules' if None).

    Whole past hours come from the hourly rollups (housekeeping's summary of them for this hour, else
    one scan for availability, baselines and sparklines; kept in `cache` between calls while valid,
    monitor/store/overview_summary.py), the rest from one read of the runs that no
    rollup holds yet: the current hour, the last hour, the part hour at each window's start, and hours
    whose rollup is pending (runs arrived since it was computed). Every hour with runs has a rollup or
    a pending mark (Repository.save_runs writes the mark in the runs' transaction), so each run counts
    once; hours whose raw runs retention has deleted still count through their rollups.
    """
    hours = OverviewHours.at(now)
    windows, current, spark_from = hours.windows, hours.current, hours.spark_from
    postgres = engine.dialect.name == "postgresql"

    async def read_rolled(c: AsyncConnection, pending: frozenset[tuple[int, datetime]]) -> RolledHours:
        key = (*hours.key(), pending)
        found = cache.get(key) if cache is not None else None
        if found is None:
            # Housekeeping's summary of this hour (a row per series), else a scan of the month's hours.
            found = await overview_summary.load(c, hours, pending)
            if found is None:
                found = await overview_summary.read_rollups(c, hours, pending)
            if cache is not None:
                cache.put(key, found)
        return found

    async def on_own_connection(pending: frozenset[tuple[int, datetime]]) -> RolledHours:
        async with engine.connect() as other:
            return await read_rolled(other, pending)

    async with engine.connect() as connection:
        connection = await _snapshot(connection)
        pending = await overview_summary.pending_hours(connection, since=floor_hour(windows[-1]), until=current)
        # PostgreSQL: the rollups' scan runs on its own connection, beside the small reads.
        apart = asyncio.ensure_future(on_own_connection(pending)) if postgres else None
        try:
            series = await _series(connection)
            fresh = await _fresh_runs(connection, now=now, windows=windows, pending=pending, grouped=postgres)
            open_by_series = await _open_incidents(connection)
            rolled = await (apart if apart is not None else read_rolled(connection, pending))
            if rolled.last_runs is not None:
                # The summary's last runs, and the runs saved since it was made: each of those is in
                # the current hour or in a pending one, all in the fresh runs.
                last_runs: dict[int, tuple[datetime | None, int | None]] = dict(rolled.last_runs)
                last_runs.update(_latest_of(fresh.latest(), since=windows[-1], after=rolled.last_runs))
            else:
                # The fresh runs hold every run of the last hour: a series that ran then has its last
                # run there; only the others need the runs index.
                last_runs = _latest_of(fresh.latest(), since=now - timedelta(hours=1))
                quiet = [series_id for series_id in series if series_id not in last_runs]
                if quiet:
                    last_runs.update(
                        await overview_summary.last_runs(connection, now=now, month=windows[-1], series_ids=quiet)
                    )
            baselines = await _baselines(
                connection,
                week=windows[1],
                hour=now - timedelta(hours=1),
                series_ids=list(series),
                rolled=rolled.medians,
            )
            unknown = [sid for sid, info in series.items() if info.prompt != ALL_PROMPTS and sid not in baselines]
            needed = min_history_runs if min_history_runs is not None else Rules().min_history_runs
            young = await _run_counts(connection, unknown, since=windows[-1], until=now, enough=needed)
        finally:
            if apart is not None and not apart.done():
                apart.cancel()
    counts = {series_id: list(values) for series_id, values in rolled.counts.items()}
    last_hour: dict[int, list[float]] = defaultdict(list)
    fresh_sparks: dict[int, dict[int, list[float]]] = defaultdict(dict)
    hour_ago = now - timedelta(hours=1)
    current_slot = spark_slot(spark_from, current)
    for grouped in fresh.series:  # none pending: each run's hour is rolled up unless it is the current one
        totals = counts.setdefault(grouped.series_id, [0] * 6)
        for index, (ok, errors) in enumerate(grouped.windows):
            totals[2 * index] += ok
            totals[2 * index + 1] += errors
        if grouped.last_hour_p50s:
            last_hour[grouped.series_id].extend(grouped.last_hour_p50s)
        if grouped.current_p50s and 0 <= current_slot < SPARK_HOURS:
            fresh_sparks[grouped.series_id].setdefault(current_slot, []).extend(grouped.current_p50s)
    for series_id, at, p50, ok, errors in fresh.runs:
        hour = floor_hour(at)
        unrolled = hour >= current or (series_id, hour) in pending
        totals = counts.setdefault(series_id, [0] * 6)
        for index, since in enumerate(windows):
            # A run is counted here when its window does not hold its whole hour from a rollup.
            if at >= since and (hour < since or unrolled):
                totals[2 * index] += ok
                totals[2 * index + 1] += errors
        if p50 is not None:
            if at >= hour_ago:
                last_hour[series_id].append(p50)
            if unrolled and hour >= spark_from:
                fresh_sparks[series_id].setdefault(spark_slot(spark_from, hour), []).append(p50)
    # A target's SLO burn incidents live on a row with the prompt `*` that never has runs of its own:
    # it is the target's objective across its prompts, and ran when any of its prompts did.
    target_last: dict[tuple[str, str], datetime] = {}
    for series_id, info in series.items():
        last = last_runs.get(series_id, (None, None))[0]
        key = (info.target, info.location)
        if info.prompt != ALL_PROMPTS and last is not None and (key not in target_last or last > target_last[key]):
            target_last[key] = last
    out = []
    for series_id, info in series.items():
        ok_d, err_d, ok_w, err_w, ok_m, err_m = counts.get(series_id, (0,) * 6)
        last_at, last_ok = last_runs.get(series_id, (None, None))
        whole_target = info.prompt == ALL_PROMPTS
        if whole_target:
            last_at, last_ok = target_last.get((info.target, info.location)), 1
        ran_24h = last_at is not None and last_at >= windows[0]
        opened = open_by_series.get(series_id, ())
        baseline = baselines.get(series_id)
        for kind, _, opened_on in opened:  # an open regression keeps the baseline it opened against
            if kind == "regression" and opened_on is not None:
                baseline = opened_on
                break
        note = None
        if baseline is None and not whole_target:
            runs, first = young.get(series_id, (0, None))
            note = baseline_note(runs=runs, first_run_at=first, min_history_runs=needed, now=now)
        p50 = _median(last_hour.get(series_id, []))
        # An hour's runs not rolled up yet stand for it; else its rollup's p50 (drawn and rounded).
        drawn = rolled.sparks.get(series_id)
        sparkline: list[float | None] = list(drawn) if drawn is not None else [None] * SPARK_HOURS
        for slot, runs_of_hour in fresh_sparks.get(series_id, {}).items():
            if 0 <= slot < SPARK_HOURS:
                sparkline[slot] = _round(_median(runs_of_hour))
        status = series_status(
            open_severities=[(kind, severity) for kind, severity, _ in opened],
            # Only whether the series ran in the last 24 h matters here.
            runs_24h=int(ran_24h),
            last_run_failed=ran_24h and last_ok == 0,
        )
        out.append(
            {
                "id": info.id,
                "target": info.target,
                "provider": info.provider,
                "model": info.model,
                "prompt": info.prompt,
                # "target": the row of the target's TTFT objective over all its prompts (SLO burn
                # rate; prompt `*`), without latency figures of its own; "series": one prompt's.
                "scope": "target" if whole_target else "series",
                "location": info.location,
                "status": status,
                "open_incidents": [{"kind": kind, "severity": severity} for kind, severity, _ in opened],
                "p50_last_hour_ms": _round(p50),
                "baseline_ms": _round(baseline),
                "baseline_note": note,
                "ratio": _round(p50 / baseline, 3) if p50 is not None and baseline else None,
                "sparkline_ms": sparkline,
                "availability_24h": _fraction(ok_d, err_d),
                "availability_7d": _fraction(ok_w, err_w),
                "availability_30d": _fraction(ok_m, err_m),
                "last_run_at": iso(last_at),
            }
        )
    out.sort(key=_status_rank)
    return out


class SeriesFresh(NamedTuple):
    """One series' runs that no up-to-date rollup holds and no pending hour: what the overview adds of
    them, summed in the database."""

    series_id: int
    windows: list[tuple[int, int]]  # (ok samples, errors) per window, of the runs its rollups lack
    last_hour_p50s: list[float]  # of the runs since an hour ago
    current_p50s: list[float]  # of the runs in the current hour (the sparkline's last slot)
    last_at: datetime
    last_ok: int


FreshRun = tuple[int, datetime, float | None, int, int]  # series id, start, p50, ok samples, errors


@dataclass(frozen=True)
class Fresh:
    """The runs no up-to-date rollup holds: summed per series (`series`, PostgreSQL, except those in
    pending hours) and one by one (`runs`: the pending hours' on PostgreSQL, all on SQLite)."""

    series: list[SeriesFresh]
    runs: list[FreshRun]

    def latest(self) -> Iterable[tuple[int, datetime, int]]:
        """(series id, start, ok samples) of each series' latest grouped run and of every single one."""
        for grouped in self.series:
            yield grouped.series_id, grouped.last_at, grouped.last_ok
        for series_id, at, _p50, ok, _errors in self.runs:
            yield series_id, at, ok


async def _fresh_runs(
    connection: AsyncConnection,
    *,
    now: datetime,
    windows: Sequence[datetime],
    pending: frozenset[tuple[int, datetime]],
    grouped: bool = False,
) -> Fresh:
    """The runs in [oldest window, now) that no up-to-date rollup holds (the current hour, part hours
    at the windows' starts, pending hours) or that started in the last hour.

    `grouped` (PostgreSQL): those outside pending hours summed per series in the database, one row per
    series however often it runs. One by one, at 5-minute runs the last hour alone was 60,000 rows at
    5,000 series, each decoded and looped over in Python on every call."""
    current = floor_hour(now)
    hour_ago = now - timedelta(hours=1)
    started = RunRow.started_at

    def at_or_after(moment: datetime) -> Any:
        return started >= type_coerce(moment, UtcDateTime())

    def before(moment: datetime) -> Any:
        return started < type_coerce(moment, UtcDateTime())

    segments: list[Any] = [at_or_after(min(current, hour_ago))]
    segments += [and_(at_or_after(w), before(ceil_hour(w))) for w in windows if ceil_hour(w) != w]
    by_hour: dict[datetime, list[int]] = defaultdict(list)
    for series_id, hour in sorted(pending):
        by_hour[hour].append(series_id)
    pending_segments = [
        and_(at_or_after(hour), before(hour + timedelta(hours=1)), RunRow.series_id.in_(series_ids))
        for hour, series_ids in by_hour.items()
    ]
    columns = (RunRow.series_id, started, RunRow.ttft_p50_ms, RunRow.ok, RunRow.errors)
    in_range = (at_or_after(min(windows)), before(now))
    # The part hours and pending hours of days in the cold tier are read through it (rows and chunks alike,
    # one by one), and left out of the statements below; the current and last hour never are in it.
    everyone = list(await connection.scalars(select(SeriesRow.id)))
    parts = [(w, ceil_hour(w), everyone) for w in windows if ceil_hour(w) != w]
    parts += [(hour, hour + timedelta(hours=1), sorted(ids)) for hour, ids in by_hour.items()]
    cold_runs: list[FreshRun] = []
    cold_segments: list[Any] = []
    for part_start, part_end, ids in parts:
        part_start = max(part_start, min(windows))
        read = await _cold_read(
            connection, ids, start=part_start, end=min(part_end, now), run_keys=("ttft_p50_ms", "ok", "errors")
        )
        if read is None:
            continue
        cold_runs += [(r["series_id"], r["started_at"], r["ttft_p50_ms"], r["ok"], r["errors"]) for r in read.runs]
        cold_segments.append(and_(at_or_after(part_start), before(part_end), RunRow.series_id.in_(ids)))
    warm = [not_(or_(*cold_segments))] if cold_segments else []
    if not grouped:
        rows = await connection.execute(select(*columns).where(*in_range, or_(*segments, *pending_segments), *warm))
        return Fresh([], [cast(FreshRun, tuple(row)) for row in rows] + cold_runs)
    single: list[FreshRun] = list(cold_runs)
    if pending_segments:
        rows = await connection.execute(select(*columns).where(*in_range, or_(*pending_segments), *warm))
        single += [tuple(row) for row in rows]  # type: ignore[misc]
    # Imported here, where only PostgreSQL comes: on SQLite the dialect (2.3 MB resident) is never loaded.
    from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by

    # Outside pending hours a run's hour is rolled up unless it is the current one: a window counts
    # the run when its rollups lack it, in the part hour at the window's start or in the current hour.
    sums = []
    for since in windows:
        lacking = and_(at_or_after(since), or_(before(ceil_hour(since)), at_or_after(current)))
        sums += [func.coalesce(func.sum(column).filter(lacking), 0) for column in (RunRow.ok, RunRow.errors)]
    has_p50 = RunRow.ttft_p50_ms.is_not(None)
    groups = await connection.execute(
        select(
            RunRow.series_id,
            *sums,
            # Lists of floats as asyncpg decodes them: SQLAlchemy's ARRAY would visit every item again
            # in Python, which took longer than the rest of the overview together.
            func.array_agg(RunRow.ttft_p50_ms, type_=NullType()).filter(and_(has_p50, at_or_after(hour_ago))),
            func.array_agg(RunRow.ttft_p50_ms, type_=NullType()).filter(and_(has_p50, at_or_after(current))),
            func.max(started),
            func.array_agg(aggregate_order_by(RunRow.ok, started.desc()), type_=ARRAY(Integer()))[1],
        )
        .where(*in_range, or_(*segments), *([not_(or_(*pending_segments))] if pending_segments else []), *warm)
        .group_by(RunRow.series_id)
    )
    summed = [
        SeriesFresh(
            series_id,
            [(int(ok_d), int(err_d)), (int(ok_w), int(err_w)), (int(ok_m), int(err_m))],
            recent or [],
            this_hour or [],
            last_at,
            last_ok,
        )
        for series_id, ok_d, err_d, ok_w, err_w, ok_m, err_m, recent, this_hour, last_at, last_ok in cast(Any, groups)
    ]
    return Fresh(summed, single)


async def _open_incidents(connection: AsyncConnection) -> dict[int, list[tuple[str, str, float | None]]]:
    incidents = await connection.execute(
        select(IncidentRow.series_id, IncidentRow.kind, IncidentRow.severity, IncidentRow.baseline_ms).where(
            IncidentRow.resolved_at.is_(None)
        )
    )
    open_by_series: dict[int, list[tuple[str, str, float | None]]] = defaultdict(list)
    for series_id, kind, severity, baseline in incidents:
        open_by_series[series_id].append((kind, severity, baseline))
    return open_by_series


def _latest_of(
    runs: Iterable[tuple[int, datetime, int]],
    *,
    since: datetime,
    after: Mapping[int, tuple[datetime, int]] | None = None,
) -> dict[int, tuple[datetime | None, int | None]]:
    """Per series with a run since `since` (and later than its run in `after`): its latest run's start
    and ok samples. `runs`: (series id, start, ok samples)."""
    latest: dict[int, tuple[datetime | None, int | None]] = {}
    for series_id, at, ok in runs:
        if at >= since:
            seen = latest.get(series_id) or (after or {}).get(series_id)
            if seen is None or (seen[0] is not None and at > seen[0]):
                latest[series_id] = (at, ok)
    return latest


def _fraction(ok: Any, errors: Any) -> float | None:
    ok, errors = int(ok or 0), int(errors or 0)
    return round(ok / (ok + errors), 5) if ok + errors else None


async def _baselines(
    connection: AsyncConnection,
    *,
    week: datetime,
    hour: datetime,
    series_ids: Sequence[int] | None = None,
    rolled: dict[int, float] | None = None,
) -> dict[int, float]:
    """Per series: the median of its hourly p50s over the week before the last hour (stored rollups),
    or of its run p50s over the day before the last hour where no rollup exists yet (a young database).
    Runs are read only for the series of `series_ids` without a rollup (all series when None).
    `rolled`: the rollups' medians when already computed (`_rolled_up_counts`)."""
    day = hour - timedelta(hours=23)
    sources = (
        (RollupRow.series_id, RollupRow.ttft_p50_ms, RollupRow.hour, week, hour - timedelta(hours=1)),
        (RunRow.series_id, RunRow.ttft_p50_ms, RunRow.started_at, max(week, day), hour),
    )
    found: list[dict[int, float]] = [rolled] if rolled is not None else []
    for series_id, value, moment, since, until in sources[len(found) :]:
        if found and series_ids is not None:
            series_ids = [sid for sid in series_ids if sid not in found[0]]
            if not series_ids:
                found.append({})
                break
        window = (
            moment >= type_coerce(since, UtcDateTime()),
            moment < type_coerce(until, UtcDateTime()),
            value.is_not(None),
            *([series_id.in_(list(series_ids))] if series_ids is not None else []),
        )
        if connection.dialect.name == "postgresql":
            median = func.percentile_cont(0.5).within_group(value)
            rows = await connection.execute(select(series_id, median).where(*window).group_by(series_id))
            found.append({sid: m for sid, m in rows if m is not None})
            continue
        values: dict[int, list[float]] = defaultdict(list)
        for sid, v in await connection.execute(select(series_id, value).where(*window)):
            values[sid].append(cast(float, v))  # the window excludes NULLs
        found.append({sid: m for sid, vs in values.items() if (m := _median(vs)) is not None})
    rolled, recent = found
    return {**recent, **rolled}


# ---------------------------------------------------------------- one series over time


def bucket_seconds(range_s: float, max_points: int = MAX_POINTS) -> int:
    """The smallest round bucket that keeps a range under `max_points` points."""
    for step in _BUCKET_STEPS_S:
        if range_s / step <= max_points:
            return step
    return math.ceil(range_s / max_points / 86400) * 86400


_PHASE_AT = 10  # where the phases begin in a sample row (_SAMPLE_FIELDS), then the server's numbers
_SERVER_AT = _PHASE_AT + len(PHASES)
_SELF_DELAY_AT = _SERVER_AT + len(SERVER_FIELDS)  # then self_delay_ms, disturbed (monitor.probe.self_delay)
_SAMPLE_FIELDS = (
    SampleRow.sent_at, RunRow.started_at, RunRow.id, SampleRow.request_id, SampleRow.error,
    SampleRow.error_message, SampleRow.http_status, SampleRow.decode_tps, SampleRow.prompt_tokens,
    SampleRow.cached_tokens, *(getattr(SampleRow, name) for name in PHASES),
    *(getattr(RunRow, name) for name in SERVER_FIELDS), SampleRow.self_delay_ms, SampleRow.disturbed,
)  # fmt: skip


_SAMPLE_KEYS = tuple(
    ("run", column.key) if column.table.name == "runs" else ("sample", column.key) for column in _SAMPLE_FIELDS
)


def _sample_rows(read: cold.Read) -> list[tuple[Any, ...]]:
    """`_SAMPLE_FIELDS` of the measured samples of the runs read through the cold tier, as the view's statement
    orders them (by run start, then round)."""
    out = []
    for run in read.runs:
        for sample in read.samples.get(run["id"], ()):
            if not sample["warmup"]:
                out.append(tuple(run[key] if side == "run" else sample[key] for side, key in _SAMPLE_KEYS))
    return out


def sample_point(row: Sequence[Any]) -> dict[str, Any]:
    sent_at, started_at, run_id, request_id, error, message, status, rate, prompt, cached = row[:_PHASE_AT]
    phases, server = row[_PHASE_AT:_SERVER_AT], row[_SERVER_AT:_SELF_DELAY_AT]
    self_delay, disturbed = row[_SELF_DELAY_AT : _SELF_DELAY_AT + 2]
    ttft = phases[PHASES.index("ttft_ms")]
    return {
        "t": iso(sent_at or started_at),
        "n": 1,
        "errors": 1 if error else 0,
        "ttft_p10_ms": _round(ttft),
        "ttft_p50_ms": _round(ttft),
        "ttft_p90_ms": _round(ttft),
        **{name: _round(value) for name, value in zip(PHASES, phases, strict=True)},
        "decode_tps": _round(rate),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        **{name: _round(value, 4) for name, value in zip(SERVER_FIELDS, server, strict=True)},
        "error_counts": {error: 1} if error else {},
        "run_id": str(run_id),
        "request_id": request_id,
        "error_message": message,
        "http_status": status,
        "self_delay_ms": _round(self_delay),
        "disturbed": bool(disturbed),
    }


def bucket_points(rows: Sequence[Sequence[Any]], *, start: datetime, width_s: int) -> list[dict[str, Any]]:
    """Raw samples folded into buckets of `width_s`: TTFT p10/p50/p90, the phases' and rates' medians,
    and the medians of the server's numbers over the bucket's runs (each run once)."""
    buckets: dict[int, list[Sequence[Any]]] = defaultdict(list)
    origin = start.timestamp()
    for row in rows:
        moment = row[0] or row[1]
        buckets[int((moment.timestamp() - origin) // width_s)].append(row)
    ttft_at = _PHASE_AT + PHASES.index("ttft_ms")
    out = []
    for index in sorted(buckets):
        members = buckets[index]
        errors = Counter(row[4] for row in members if row[4])
        ttfts = sorted(row[ttft_at] for row in members if row[ttft_at])
        runs = list({row[2]: row for row in members}.values())

        def median_of(position: int, members: list[Sequence[Any]] = members) -> float | None:
            return _median([row[position] for row in members if row[position] is not None])

        out.append(
            {
                "t": iso(datetime.fromtimestamp(origin + index * width_s, UTC)),
                "n": len(members),
                "errors": sum(errors.values()),
                "ttft_p10_ms": _round(quantile(ttfts, 0.1, presorted=True)),
                "ttft_p50_ms": _round(quantile(ttfts, 0.5, presorted=True)),
                "ttft_p90_ms": _round(quantile(ttfts, 0.9, presorted=True)),
                **{name: _round(median_of(_PHASE_AT + i)) for i, name in enumerate(PHASES)},
                "decode_tps": _round(median_of(7)),
                "prompt_tokens": _round(median_of(8), 0),
                "cached_tokens": _round(median_of(9), 0),
                **{name: _round(median_of(_SERVER_AT + i, runs), 4) for i, name in enumerate(SERVER_FIELDS)},
                "error_counts": dict(sorted(errors.items())),
                "disturbed": sum(1 for row in members if row[_SELF_DELAY_AT + 1]),
            }
        )
    return out


def hourly_points(hours: Sequence[HourlyStats], *, start: datetime, width_s: int) -> list[dict[str, Any]]:
    """Hourly statistics (rollups) folded into buckets of `width_s` (a whole number of hours): each
    value the median of the hours' values (with one hour per bucket, the hour's own)."""
    buckets: dict[int, list[HourlyStats]] = defaultdict(list)
    origin = start.timestamp()
    for item in hours:
        buckets[int((item.hour.timestamp() - origin) // width_s)].append(item)
    out = []
    for index in sorted(buckets):
        members = buckets[index]
        errors = sum(m.errors for m in members)
        point: dict[str, Any] = {
            "t": iso(max(datetime.fromtimestamp(origin + index * width_s, UTC), members[0].hour)),
            "n": sum(m.samples for m in members),
            "errors": errors,
        }
        if len(members) == 1:
            # The usual case up to 30 days, one hour a point: its own figures, read in one call (the view of
            # 30 days spent 26 us a point asking for each of them by name, 8.6 of its 27 ms at 14 days of history).
            figures: Iterable[Any] = _HOUR_FIGURES_OF(members[0])
        else:
            figures = (
                _median([value for m in members if (value := getattr(m, attr)) is not None])
                for _key, attr, _digits in _HOUR_FIGURES
            )
        for (key, _attr, digits), value in zip(_HOUR_FIGURES, figures, strict=True):
            point[key] = _round(value, digits)
        # Rollups count errors, not their classes.
        point["error_counts"] = {"error": errors} if errors else {}
        out.append(point)
    return out


_ROLLUP_OF = {"ttft_ms": "ttft_p50_ms"}
# What a point of the hourly view carries, in its order: (the point's key, the rollup's field, digits).
_HOUR_FIGURES: tuple[tuple[str, str, int], ...] = (
    ("ttft_p10_ms", "ttft_p10_ms", 2),
    ("ttft_p50_ms", "ttft_p50_ms", 2),
    ("ttft_p90_ms", "ttft_p90_ms", 2),
    *((name, _ROLLUP_OF.get(name, f"{name}_p50"), 2) for name in PHASES),
    ("decode_tps", "decode_tps_p50", 2),
    ("prompt_tokens", "prompt_tokens_p50", 0),
    ("cached_tokens", "cached_tokens_p50", 0),
    *((name, f"{name}_p50", 4) for name in SERVER_FIELDS),
)
_HOUR_FIGURES_OF = operator.attrgetter(*(attr for _key, attr, _digits in _HOUR_FIGURES))
_ROLLUP_FIELDS = tuple(getattr(RollupRow, f.name) for f in fields(HourlyStats))


def detector_baselines(
    detector: Detector,
    runs: Sequence[RunPoint],
    *,
    step_from: datetime,
    noise: list[tuple[NoiseModel | None, bool]] | None = None,
) -> tuple[list[float], list[float | None]]:
    """The baseline the detector compares each run at or after `step_from` with: (times as epoch
    seconds, baselines in ms; None before the series has one). The detector's own code: runs before
    `step_from` are its history, the rest are evaluated one by one from a fresh state (an incident
    open before `step_from` is not known, so its baseline may follow the regression)."""
    split = bisect.bisect_left([run.at for run in runs], step_from)
    replayer = detector.replayer(history=runs[:split])
    times: list[float] = []
    baselines: list[float | None] = []
    for run in runs[split:]:
        replayer.feed(run)
        if run.ttft_ms is not None:
            times.append(run.at.timestamp())
            baselines.append(replayer.baseline_ms)
    if noise is not None:  # the noise model the detector ends with (or the history's, measured), for the page
        noise.append(replayer.noise())
    return times, baselines


def noise_estimate(
    model: NoiseModel | None, runs: Sequence[RunPoint], *, in_rules: bool = True
) -> dict[str, Any] | None:
    """The series' noise model as the detector has it at the last run (monitor/detect/noise.py), for the
    page beside the baseline band: None until any was measured. `in_rules`: the rules scale their
    evidence by it (`detection.noise_model`); otherwise it is measured on the history for the page."""
    if model is None or model.runs == 0:
        return None
    spacing = sorted(b.at.timestamp() - a.at.timestamp() for a, b in itertools.pairwise(runs[-13:]))
    interval = spacing[len(spacing) // 2] if spacing else 300.0
    return {
        "sd": round(model.sd, 4),
        "correlation_minutes": round(model.correlation_minutes(interval), 1),
        "long_run": round(model.long_run, 2),
        "text": describe_noise(model, interval_s=interval, runs=12),
        "in_rules": in_rules,
    }


def _baseline_at(times: Sequence[float], baselines: Sequence[float | None], moment: float) -> float | None:
    """The baseline of the last run that started before `moment`."""
    index = bisect.bisect_left(times, moment) - 1
    return baselines[index] if index >= 0 else None


async def _run_points(connection: AsyncConnection, series_id: int, *, start: datetime, end: datetime) -> list[RunPoint]:
    read = await _cold_read(
        connection, [series_id], start=start, end=end, run_keys=("ttft_p50_ms", "error", "ok", "errors")
    )
    rows: Iterable[Sequence[Any]]
    if read is not None:
        rows = [(r["started_at"], r["ttft_p50_ms"], r["error"], r["ok"], r["errors"]) for r in read.runs]
    else:
        rows = await connection.execute(
            select(RunRow.started_at, RunRow.ttft_p50_ms, RunRow.error, RunRow.ok, RunRow.errors)
            .where(
                RunRow.series_id == series_id,
                RunRow.started_at >= type_coerce(start, UtcDateTime()),
                RunRow.started_at < type_coerce(end, UtcDateTime()),
            )
            .order_by(RunRow.started_at)
        )
    return [
        RunPoint(
            at=at, ttft_ms=p50 if p50 is not None and 0 < p50 < math.inf else None, error=error, ok=ok, errors=errors
        )
        for at, p50, error, ok, errors in rows
    ]


def _hour_run_points(hours: Sequence[HourlyStats]) -> list[RunPoint]:
    """Hourly rollups as the detector's runs: the hour's p50 and its request counts."""
    return [
        RunPoint(
            at=h.hour,
            ttft_ms=h.ttft_p50_ms if h.ttft_p50_ms is not None and 0 < h.ttft_p50_ms < math.inf else None,
            ok=h.samples - h.errors,
            errors=h.errors,
        )
        for h in hours
    ]


async def _hours(
    connection: AsyncConnection, repository: Repository, series: SeriesInfo, *, start: datetime, end: datetime
) -> list[HourlyStats]:
    """The series' hourly statistics in [start, end) (`start` a whole hour): stored rollups, and hours not
    rolled up yet (the current one, or a backlog) computed from raw samples."""
    return (await _hours_of(connection, repository, {series.id: series}, start=start, end=end))[series.id]


async def _where_the_time_went(
    connection: AsyncConnection,
    series_id: int,
    *,
    end: datetime,
    incidents: Sequence[dict[str, Any]],
    baseline_at: Callable[[float], float | None],
) -> dict[str, Any] | None:
    """What the server's own metrics say about the latest regression in the range (or, without one,
    the last hour): the client's TTFT and the server's TTFT, queue, prefill and waiting requests
    against their medians over the day before, with the alerts' wording (monitor.detect.attribution).
    None when the runs carry no server metrics."""
    regression = next((i for i in incidents if i["kind"] == "regression"), None)
    since = _parse_iso(regression["since"]) if regression else end - timedelta(hours=1)
    until = _parse_iso(regression["resolved_at"]) if regression and regression["resolved_at"] else end
    until = min(until, end)
    if since >= until:
        since = until - timedelta(hours=1)
    read = await _cold_read(
        connection, [series_id], start=since - timedelta(hours=24), end=until, run_keys=("ttft_p50_ms", *SERVER_FIELDS)
    )
    rows: Sequence[Sequence[Any]]
    if read is not None:
        rows = [(r["started_at"], r["ttft_p50_ms"], *(r[name] for name in SERVER_FIELDS)) for r in read.runs]
    else:
        rows = (
            await connection.execute(
                select(RunRow.started_at, RunRow.ttft_p50_ms, *(getattr(RunRow, n) for n in SERVER_FIELDS)).where(
                    RunRow.series_id == series_id,
                    RunRow.started_at >= type_coerce(since - timedelta(hours=24), UtcDateTime()),
                    RunRow.started_at < type_coerce(until, UtcDateTime()),
                )
            )
        ).all()
    recent = [row for row in rows if row[0] >= since]
    before = [row for row in rows if row[0] < since]
    position = {"ttft_p50_ms": 1, **{name: 2 + i for i, name in enumerate(SERVER_FIELDS)}}

    def middle(found: Sequence[Any], name: str) -> float | None:
        at = position[name]
        return _median([row[at] for row in found if row[at] is not None])

    if all(middle(recent, name) is None for name in ("server_ttft_ms", "server_waiting")):
        return None
    split = ServerSplit(
        ttft_ms=middle(recent, "server_ttft_ms"),
        ttft_baseline_ms=middle(before, "server_ttft_ms"),
        waiting=middle(recent, "server_waiting"),
        waiting_baseline=middle(before, "server_waiting"),
        queue_ms=middle(recent, "server_queue_ms"),
        queue_baseline_ms=middle(before, "server_queue_ms"),
        prefill_ms=middle(recent, "server_prefill_ms"),
        prefill_baseline_ms=middle(before, "server_prefill_ms"),
    )
    client = middle(recent, "ttft_p50_ms")
    # The incident's own baseline (what the daemon's detector compared it with); else the replayed
    # baseline of the window's first run.
    client_baseline = (regression or {}).get("opened_baseline_ms") or baseline_at(since.timestamp() + 1e-6)
    cause = classify(client, client_baseline, split)
    return {
        "since": iso(since),
        "until": iso(until),
        "incident_id": regression["id"] if regression else None,
        "client_ttft_ms": _round(client),
        "client_baseline_ms": _round(client_baseline),
        **{key: _round(value) for key, value in asdict(split).items()},
        "cause": cause,
        "text": split_text(client, client_baseline, split),
    }


def _parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def series_points(
    engine: AsyncEngine,
    series_id: int,
    *,
    start: datetime,
    end: datetime,
    max_points: int = MAX_POINTS,
    detector: Detector | None = None,
) -> dict[str, Any]:
    """One series over [start, end): raw samples when they fit, else buckets of them; hourly rollups
    beyond the raw retention range. Each point carries the baseline the detector (`detector`, default
    rules when None) compared its runs with; with the series' incidents in the range."""
    detector = detector or Detector()
    range_s = (end - start).total_seconds()
    # The detector reads this far back; its evaluations start a level window before the range, so an
    # incident that began shortly before it keeps its baseline.
    history_start = detector.history_since(start)
    step_from = start - timedelta(hours=detector.rules.level_hours)
    async with engine.connect() as connection:
        connection = await _snapshot(connection)
        await _one_worker(connection)
        found = await _series(connection, [series_id])
        if series_id not in found:
            raise NotFound(f"no series with id {series_id}")
        info = found[series_id]
        if end - start <= RAW_RANGE:
            read = await _cold_read(
                connection,
                [series_id],
                start=start,
                end=end,
                samples=True,
                run_keys=[key for side, key in _SAMPLE_KEYS if side == "run"],
                sample_keys=["warmup", *(key for side, key in _SAMPLE_KEYS if side == "sample")],
            )
            rows = (
                _sample_rows(read)
                if read is not None
                else await connection.execute(
                    select(*_SAMPLE_FIELDS)
                    .select_from(RunRow.__table__.join(SampleRow.__table__, SAMPLES_OF_RUN))
                    .where(
                        RunRow.series_id == series_id,
                        RunRow.started_at >= type_coerce(start, UtcDateTime()),
                        RunRow.started_at < type_coerce(end, UtcDateTime()),
                        SampleRow.warmup.is_(False),
                    )
                    .order_by(RunRow.started_at, SampleRow.round)
                )
            )
            rows = list(rows)
            if len(rows) <= max_points:
                resolution, width, points = "sample", 0, [sample_point(row) for row in rows]
            else:
                width = bucket_seconds(range_s, max_points)
                resolution, points = "bucket", bucket_points(rows, start=start, width_s=width)
            runs = await _run_points(connection, series_id, start=history_start, end=end)
            if sum(run.at >= step_from for run in runs) > MAX_REPLAYED_RUNS:
                # Frequent runs over days: the detector replayed over the hours instead (as for long
                # ranges), so the view stays fast; the seasonal baseline barely differs.
                hours = await _hours(connection, Repository(engine), info, start=floor_hour(history_start), end=end)
                runs = _hour_run_points(hours)
        else:
            resolution = "hour"
            width = max(3600, math.ceil(bucket_seconds(range_s, max_points) / 3600) * 3600)
            hours = await _hours(connection, Repository(engine), info, start=floor_hour(history_start), end=end)
            in_range = [h for h in hours if h.hour >= start]
            points = hourly_points(in_range, start=start, width_s=width)
            runs = _hour_run_points(hours)
        incidents = await _incidents_of(connection, [series_id], start=start, end=end)
        cache = await cache_view(connection, info, start=start, end=end)
        models: list[tuple[NoiseModel | None, bool]] = []
        times, baselines = detector_baselines(detector, runs, step_from=step_from, noise=models)
        noise = noise_estimate(models[0][0], runs, in_rules=models[0][1]) if models else None
        split = await _where_the_time_went(
            connection,
            series_id,
            end=end,
            incidents=incidents,
            baseline_at=lambda moment: _baseline_at(times, baselines, moment),
        )
    end_s = end.timestamp()
    for point in points:
        moment = _epoch(point["t"])
        # A bucket's baseline is the one its last run was compared with; a sample's, its run's.
        until = min(moment + width, end_s) if width else moment + 1e-6
        point["baseline_ms"] = _round(_baseline_at(times, baselines, until))
    baseline = _baseline_at(times, baselines, end_s)
    if baseline is None:
        baseline = _median(
            [p["ttft_p50_ms"] for p in points if p["ttft_p50_ms"] is not None and not _inside(p, incidents)]
        )
    return {
        "series": asdict(info),
        "start": iso(start),
        "end": iso(end),
        "resolution": resolution,
        "bucket_s": width,
        "baseline_ms": _round(baseline),
        "noise": noise,
        "cache": cache,
        "points": points,
        "incidents": incidents,
        "split": split,
    }


# The cache view reads at most this many runs of a pair (a week of 5-minute runs): it is per run.
MAX_CACHE_RUNS = 2016


class _Pair(NamedTuple):
    """What the cache view reads of a run."""

    id: uuid.UUID
    series_id: int
    intended_at: datetime
    ttft_p50_ms: float | None


async def cache_view(
    connection: AsyncConnection, info: SeriesInfo, *, start: datetime, end: datetime
) -> dict[str, Any] | None:
    """For a series of a `cache: both` pair (`NAME` or `NAME.warm`, both stored): per run of the pair in
    [start, end), the cache speed-up (cold / warm TTFT median) and the share of the warm prompt's tokens
    served from the cache, with their medians; None for any other series. The last MAX_CACHE_RUNS runs."""
    if info.prompt.endswith(WARM_TWIN_SUFFIX):
        cold_prompt, warm_prompt = info.prompt[: -len(WARM_TWIN_SUFFIX)], info.prompt
    else:
        cold_prompt, warm_prompt = info.prompt, warm_twin(info.prompt)
    siblings = {
        row.prompt: row.id
        for row in await connection.execute(
            select(SeriesRow.id, SeriesRow.prompt).where(
                SeriesRow.target == info.target,
                SeriesRow.provider == info.provider,
                SeriesRow.model == info.model,
                SeriesRow.location == info.location,
                SeriesRow.prompt.in_([cold_prompt, warm_prompt]),
            )
        )
    }
    if cold_prompt not in siblings or warm_prompt not in siblings:
        return None
    window = (
        RunRow.started_at >= type_coerce(start, UtcDateTime()),
        RunRow.started_at < type_coerce(end, UtcDateTime()),
    )
    pair = [siblings[cold_prompt], siblings[warm_prompt]]
    read = await _cold_read(
        connection,
        pair,
        start=start,
        end=end,
        samples=True,
        run_keys=("ttft_p50_ms",),
        sample_keys=("warmup", "disturbed", "error", "cached_tokens", "prompt_tokens"),
    )
    runs: Sequence[Any]
    if read is not None:
        newest = sorted(read.runs, key=lambda r: r["started_at"], reverse=True)[: 2 * MAX_CACHE_RUNS]
        runs = [_Pair(r["id"], r["series_id"], r["intended_at"], r["ttft_p50_ms"]) for r in newest]
    else:
        runs = (
            await connection.execute(
                select(RunRow.id, RunRow.series_id, RunRow.intended_at, RunRow.ttft_p50_ms)
                .where(RunRow.series_id.in_(pair), *window)
                .order_by(RunRow.started_at.desc())
                .limit(2 * MAX_CACHE_RUNS)
            )
        ).all()
    cold_ms = {_aware(r.intended_at): r.ttft_p50_ms for r in runs if r.series_id == siblings[cold_prompt]}
    warm = [r for r in runs if r.series_id == siblings[warm_prompt]]
    tokens: dict[Any, tuple[list[float], list[float]]] = {r.id: ([], []) for r in warm}
    if warm and read is not None:
        for r in warm:
            for sample in read.samples.get(r.id, ()):
                if sample["warmup"] or sample["disturbed"] or sample["error"] is not None:
                    continue
                if sample["cached_tokens"] is not None:
                    tokens[r.id][0].append(float(sample["cached_tokens"]))
                if sample["prompt_tokens"] is not None:
                    tokens[r.id][1].append(float(sample["prompt_tokens"]))
    elif warm:
        rows = await connection.execute(
            select(SampleRow.run_id, SampleRow.cached_tokens, SampleRow.prompt_tokens).where(
                SampleRow.run_id.in_(list(tokens)),
                # The days these runs are kept in: PostgreSQL reads only those partitions of samples.
                SampleRow.intended_at >= min(r.intended_at for r in warm),
                SampleRow.intended_at <= max(r.intended_at for r in warm),
                SampleRow.warmup.is_(False),
                SampleRow.disturbed.is_(False),
                SampleRow.error.is_(None),
            )
        )
        for run_id, cached, prompt in rows:
            if cached is not None:
                tokens[run_id][0].append(float(cached))
            if prompt is not None:
                tokens[run_id][1].append(float(prompt))
    pairs = [
        PairRun(
            at=_aware(r.intended_at),
            cold_ms=cold_ms.get(_aware(r.intended_at)),
            warm_ms=r.ttft_p50_ms,
            warm_cached_tokens=_median(tokens[r.id][0]),
            warm_prompt_tokens=_median(tokens[r.id][1]),
        )
        for r in reversed(warm)
    ]
    speedups = [p.speedup for p in pairs if p.speedup is not None]
    shares = [p.cached_share for p in pairs if p.cached_share is not None]
    return {
        "cold_prompt": cold_prompt,
        "warm_prompt": warm_prompt,
        "cold_series_id": siblings[cold_prompt],
        "warm_series_id": siblings[warm_prompt],
        "runs": len(pairs),
        "speedup_p50": _round(_median(speedups), 2),
        "cached_share_p50": _round(_median(shares), 3),
        "points": [
            {"t": iso(p.at), "speedup": _round(p.speedup, 2), "cached_share": _round(p.cached_share, 3)} for p in pairs
        ],
    }


def _epoch(text: str) -> float:
    return _parse_iso(text).timestamp()


def _inside(point: dict[str, Any], incidents: Sequence[dict[str, Any]]) -> bool:
    moment = point["t"]
    return any(i["since"] <= moment and (i["resolved_at"] is None or moment < i["resolved_at"]) for i in incidents)


# ---------------------------------------------------------------- incidents


async def _incidents_of(
    connection: AsyncConnection, series_ids: Sequence[int] | None, *, start: datetime, end: datetime
) -> list[dict[str, Any]]:
    query = select(IncidentRow).where(
        IncidentRow.opened_at < type_coerce(end, UtcDateTime()),
        or_(IncidentRow.resolved_at.is_(None), IncidentRow.resolved_at >= type_coerce(start, UtcDateTime())),
    )
    if series_ids is not None:
        query = query.where(IncidentRow.series_id.in_(list(series_ids)))
    rows = (await connection.execute(query.order_by(IncidentRow.opened_at.desc()))).all()
    return [_incident(row, end) for row in rows]


def _incident(row: Any, now: datetime) -> dict[str, Any]:
    details = row.details or {}
    until = row.resolved_at or now
    return {
        "id": str(row.id),
        "series_id": row.series_id,
        "kind": row.kind,
        "severity": row.severity,
        "opened_at": iso(row.opened_at),
        # The first run of the streak that confirmed it: where the change began.
        "since": details.get("since") or iso(row.opened_at),
        "resolved_at": iso(row.resolved_at),
        "open": row.resolved_at is None,
        "duration_s": round((until - row.opened_at).total_seconds()),
        # The opening and the peak (what it was), then where it stands now: monitor.detect.figures.
        **figures_of(row).to_json(),
        "error": row.error,
        "group_id": str(row.group_id) if row.group_id is not None else None,
    }


async def _groups_of(connection: AsyncConnection, group_ids: set[uuid.UUID]) -> dict[str, dict[str, Any]]:
    """Each group's lead incident (whose id its one notification goes out under) and member count."""
    if not group_ids:
        return {}
    wanted = list(group_ids)
    leads = await connection.execute(
        select(IncidentGroupRow.id, IncidentGroupRow.lead_incident_id).where(IncidentGroupRow.id.in_(wanted))
    )
    sizes = dict(
        (
            await connection.execute(
                select(IncidentRow.group_id, func.count())
                .where(IncidentRow.group_id.in_(wanted))
                .group_by(IncidentRow.group_id)
            )
        ).all()
    )
    return {
        str(gid): {"id": str(gid), "lead_incident_id": str(lead), "members": sizes.get(gid, 0)} for gid, lead in leads
    }


async def incidents(engine: AsyncEngine, *, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Incidents open at some time in [start, end), newest first, with their series and every
    notification: receiver, event, status, attempts and each delivery's outcome."""
    async with engine.connect() as connection:
        items = await _incidents_of(connection, None, start=start, end=end)
        series = await _series(connection, {item["series_id"] for item in items})
        groups = await _groups_of(connection, {uuid.UUID(i["group_id"]) for i in items if i["group_id"]})
        ids = [uuid.UUID(item["id"]) for item in items]
        # A group's notifications go out under its lead incident: read the leads' too.
        listed = set(ids)
        leads = {uuid.UUID(g["lead_incident_id"]) for g in groups.values()} - listed
        notifications: dict[str, list[dict[str, Any]]] = defaultdict(list)
        deliveries: dict[uuid.UUID, list[dict[str, Any]]] = defaultdict(list)
        every = ids + sorted(leads)
        for offset in range(0, len(every), 500):
            chunk = every[offset : offset + 500]
            outbox = (
                await connection.execute(
                    select(
                        AlertOutboxRow.id, AlertOutboxRow.incident_id, AlertOutboxRow.receiver, AlertOutboxRow.event,
                        AlertOutboxRow.status, AlertOutboxRow.attempts, AlertOutboxRow.created_at,
                        AlertOutboxRow.sent_at, AlertOutboxRow.last_error,
                    ).where(AlertOutboxRow.incident_id.in_(chunk)).order_by(AlertOutboxRow.created_at)
                )
            ).all()  # fmt: skip
            attempts = await connection.execute(
                select(
                    AlertDeliveryRow.outbox_id, AlertDeliveryRow.attempted_at, AlertDeliveryRow.outcome,
                    AlertDeliveryRow.http_status, AlertDeliveryRow.error, AlertDeliveryRow.duration_ms,
                ).where(AlertDeliveryRow.outbox_id.in_([row[0] for row in outbox])).order_by(AlertDeliveryRow.id)
            )  # fmt: skip
            for outbox_id, at, outcome, status, error, duration in attempts:
                deliveries[outbox_id].append(
                    {"attempted_at": iso(at), "outcome": outcome, "http_status": status, "error": error,
                     "duration_ms": _round(duration)}
                )  # fmt: skip
            for row in outbox:
                notifications[str(row[1])].append(
                    {"receiver": row[2], "event": row[3], "status": row[4], "attempts": row[5],
                     "created_at": iso(row[6]), "sent_at": iso(row[7]), "last_error": row[8],
                     "deliveries": deliveries.get(row[0], [])}
                )  # fmt: skip
        triage = await TriageStore.records(connection, ids)
        began = min((datetime.fromisoformat(item["since"]) for item in items), default=start)
        marks = await TriageStore.annotations_between(connection, min(began, start) - ANNOTATION_WINDOW, end)
    for item in items:
        info = series.get(item["series_id"])
        item.update({k: v for k, v in asdict(info).items() if k != "id"} if info else {})
        item["notifications"] = notifications.get(item["id"], [])
        # A member of a group of several was notified as part of the group, under its lead's id.
        group = groups.get(item["group_id"] or "")
        if group is not None and group["members"] > 1:
            lead = group["lead_incident_id"]
            item["group"] = group | {
                "lead": lead == item["id"],
                "notifications": [
                    {k: n[k] for k in ("receiver", "event", "status", "sent_at")} for n in notifications.get(lead, [])
                ],
            }
        else:
            item["group"] = None
        # Triage (monitor.triage): ack, label, a manual resolve's note, change markers near its start.
        until = datetime.fromisoformat(item["resolved_at"]) if item["resolved_at"] else end
        began = datetime.fromisoformat(item["since"])
        related = related_annotations(marks, target=item.get("target", ""), began=began, until=until)
        item.update(triage_json(triage.get(uuid.UUID(item["id"])), related))
    return items


# ---------------------------------------------------------------- compare


class Names(TypedDict):
    """Target, prompt and location names: the filters asked for, or those the stored series have."""

    targets: list[str]
    prompts: list[str]
    locations: list[str]


class CompareValues(TypedDict):
    """The compare view's numbers: a row per target and prompt, the pairwise differences, the prefill slopes."""

    cells: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    slopes: list[dict[str, Any]]
    cache: list[dict[str, Any]]


class CompareDocument(CompareValues):
    """The compare API's document, and what `ttft-monitor report` renders."""

    start: str | None  # ISO 8601 (monitor.web.queries.iso)
    end: str | None
    # "sample": from the raw samples; "hour": from the hourly rollups (a long range, or raw samples gone).
    resolution: NotRequired[str]
    filters: Names
    available: Names
    # `ttft-monitor report` with a config: what probing each cell costs a month (monitor.web.costs).
    costs: NotRequired[list[dict[str, Any]]]


def compare_values(
    samples: Iterable[tuple[str, str, str, float, float | None]],
) -> CompareValues:
    """The seeds' comparison from (target, model, prompt, ttft ms, prompt tokens) of successful samples:
    per cell median, p90, n and the median's 95% bootstrap interval; per prompt, every pair of targets
    with the difference of medians, its interval and significance; per target the prefill slope."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    tokens: dict[tuple[str, str], list[float]] = defaultdict(list)
    models: dict[str, str] = {}
    slope_points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for target, model, prompt, ttft, prompt_tokens in samples:
        cells[(target, prompt)].append(ttft)
        models[target] = model
        if prompt_tokens is not None:
            tokens[(target, prompt)].append(prompt_tokens)
            if not prompt.endswith(WARM_TWIN_SUFFIX):  # cached prefill is no point on the prefill line
                slope_points[target].append((prompt_tokens, ttft))
    return _compare_cells(cells, tokens, models, slope_points)


def _compare_cells(
    cells: dict[tuple[str, str], list[float]],
    tokens: dict[tuple[str, str], list[float]],
    models: dict[str, str],
    slope_points: dict[str, list[tuple[float, float]]],
) -> CompareValues:
    """`compare_values` from the samples already grouped: TTFTs and prompt tokens per (target, prompt),
    each target's model and its (prompt tokens, TTFT) pairs."""
    sorted_cells = {key: sorted(values) for key, values in cells.items()}
    cdfs = {key: stats.median_bootstrap_cdf(len(values)) for key, values in sorted_cells.items()}
    variances = {key: stats.median_variance(values, cdfs[key]) for key, values in sorted_cells.items()}
    table = []
    for (target, prompt), values in sorted(sorted_cells.items()):
        interval = stats.median_interval(values, cdfs[(target, prompt)])
        table.append(
            {
                "target": target,
                "model": models[target],
                "prompt": prompt,
                "n": len(values),
                "median_ms": _round(quantile(values, 0.5, presorted=True)),
                "p90_ms": _round(quantile(values, 0.9, presorted=True)),
                "ci_low_ms": _round(interval[0]) if interval else None,
                "ci_high_ms": _round(interval[1]) if interval else None,
                "prompt_tokens_median": _round(_median(tokens.get((target, prompt), [])), 0),
            }
        )
    pairs = []
    prompts = sorted({prompt for _, prompt in sorted_cells})
    for prompt in prompts:
        in_prompt = [t for t, p in sorted_cells if p == prompt]
        ranked = sorted(in_prompt, key=lambda t: (quantile(sorted_cells[(t, prompt)], 0.5, presorted=True), t))
        for i, faster in enumerate(ranked):
            for slower in ranked[i + 1 :]:
                diff = stats.median_difference(
                    sorted_cells[(slower, prompt)], sorted_cells[(faster, prompt)],
                    a_variance=variances[(slower, prompt)], b_variance=variances[(faster, prompt)],
                )  # fmt: skip
                assert diff is not None
                pairs.append(
                    {
                        "prompt": prompt,
                        "faster": faster,
                        "slower": slower,
                        "difference_ms": _round(diff.difference_ms),
                        "ci_low_ms": _round(diff.low_ms),
                        "ci_high_ms": _round(diff.high_ms),
                        "significant": diff.significant,
                    }
                )
    return {
        "cells": table,
        "pairs": pairs,
        "slopes": _slopes(models, slope_points),
        "cache": cache_speedups(sorted_cells),
    }


def _slopes(
    models: Mapping[str, str], slope_points: Mapping[str, Sequence[tuple[float, float]]]
) -> list[dict[str, Any]]:
    """Per target its prefill slope; ranked (1 = the cheapest prefill) only where the fit means
    something, the rest following, unranked, with the reason."""
    fits = {target: stats.prefill_slope(slope_points.get(target, [])) for target in models}
    order = sorted(models, key=lambda t: (not fits[t].ranked, fits[t].ms_per_1k_tokens or 0.0, t))
    slopes = []
    for rank, target in enumerate(order, 1):
        fit = fits[target]
        slopes.append(
            {
                "target": target,
                "model": models[target],
                "ms_per_1k_tokens": _round(fit.ms_per_1k_tokens),
                "intercept_ms": _round(fit.intercept_ms),
                "points": fit.points,
                "rank": rank if fit.ranked else None,
                "ci_low": _round(fit.ci_low),
                "ci_high": _round(fit.ci_high),
                "prompt_sizes": fit.sizes,
                "reason": fit.reason,
            }
        )
    return slopes


def cache_speedups(cells: Mapping[tuple[str, str], Sequence[float]]) -> list[dict[str, Any]]:
    """Per `cache: both` pair among the cells (`NAME` and `NAME.warm` of one target): the median busted
    TTFT over the median warm one, the prompt cache's speed-up."""
    return _cache_rows(
        {cell: _median(list(values)) for cell, values in cells.items()}, {c: len(v) for c, v in cells.items()}
    )


def _cache_rows(
    medians: Mapping[tuple[str, str], float | None], counts: Mapping[tuple[str, str], int]
) -> list[dict[str, Any]]:
    """The cache table from each cell's median TTFT and sample count (raw samples, or merged hours)."""
    out = []
    for target, prompt in sorted(counts):
        if not prompt.endswith(WARM_TWIN_SUFFIX):
            continue
        cold_cell = (target, prompt[: -len(WARM_TWIN_SUFFIX)])
        if not counts.get(cold_cell) or not counts[(target, prompt)]:
            continue
        cold_ms, warm_ms = medians.get(cold_cell), medians.get((target, prompt))
        speedup = cold_ms / warm_ms if cold_ms and warm_ms else None
        out.append(
            {
                "target": target,
                "prompt": cold_cell[1],
                "cold_median_ms": _round(cold_ms),
                "warm_median_ms": _round(warm_ms),
                "speedup": _round(speedup),
                "cold_n": counts[cold_cell],
                "warm_n": counts[(target, prompt)],
            }
        )
    return out


async def compare(
    engine: AsyncEngine,
    *,
    start: datetime,
    end: datetime,
    targets: Sequence[str] = (),
    prompts: Sequence[str] = (),
    locations: Sequence[str] = (),
    max_runs: int = MAX_COMPARE_RUNS,
    max_hours: int = MAX_COMPARE_HOURS,
) -> CompareDocument:
    """`compare_values` over the successful measured samples of runs started in [start, end); past
    `max_runs` runs, or where retention has removed the window's raw samples, the same numbers from the
    hourly rollups (`_compare_hours`, `resolution` "hour"); TooBroad past `max_hours` series-hours."""
    async with engine.connect() as connection:
        connection = await _snapshot(connection)
        series = await _series(connection)
        chosen = {
            sid: info
            for sid, info in series.items()
            if (not targets or info.target in targets)
            and (not prompts or info.prompt in prompts)
            and (not locations or info.location in locations)
        }
        hourly = False
        if chosen:
            runs = await _runs_in(connection, list(chosen), start=start, end=end)
            hourly = runs > max_runs or await _raw_gone(connection, list(chosen), start=start, end=end)
        if hourly:
            _refuse_too_many_hours(len(chosen), start=start, end=end, max_hours=max_hours)
            hours = await _hours_of(connection, Repository(engine), chosen, start=start, end=end)
            found = []
        else:
            found = await _compare_samples(connection, list(chosen), start=start, end=end) if chosen else []
    if hourly:
        return _document(
            start, end, series, targets, prompts, locations, _compare_hours(hours, chosen), resolution="hour"
        )
    # Grouped straight from the per-series arrays: building a tuple per sample took a third of the view.
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    tokens: dict[tuple[str, str], list[float]] = defaultdict(list)
    models: dict[str, str] = {}
    slope_points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for sid, ttfts, tokens_of in found:
        info = chosen[sid]
        cell = (info.target, info.prompt)
        models[info.target] = info.model
        cells[cell].extend(ttfts)
        counted = [(n, ttft) for n, ttft in zip(tokens_of, ttfts, strict=True) if n is not None]
        tokens[cell].extend(n for n, _ in counted)
        if not info.prompt.endswith(WARM_TWIN_SUFFIX):  # a warm twin's cached prefill is not the prefill line
            slope_points[info.target].extend(counted)
    return _document(
        start, end, series, targets, prompts, locations, _compare_cells(cells, tokens, models, slope_points)
    )


def _document(
    start: datetime,
    end: datetime,
    series: Mapping[int, SeriesInfo],
    targets: Sequence[str],
    prompts: Sequence[str],
    locations: Sequence[str],
    result: CompareValues,
    *,
    resolution: str = "sample",
) -> CompareDocument:
    available = [(info.target, info.prompt, info.location) for info in series.values()]
    return {
        "start": iso(start),
        "end": iso(end),
        "resolution": resolution,
        "filters": {"targets": list(targets), "prompts": list(prompts), "locations": list(locations)},
        "available": {
            "targets": sorted({row[0] for row in available}),
            "prompts": sorted({row[1] for row in available}),
            "locations": sorted({row[2] for row in available}),
        },
        "cells": result["cells"],
        "pairs": result["pairs"],
        "slopes": result["slopes"],
        "cache": result["cache"],
    }


async def _runs_in(connection: AsyncConnection, series_ids: Sequence[int], *, start: datetime, end: datetime) -> int:
    """How many runs of these series started in [start, end), as a compare by samples would cost them: a run
    in the cold tier counts `COLD_RUN_COST` times (its samples are decoded, not read from an index), so a
    compare over many compacted days reads the hourly rollups instead, as one over many rows does."""
    if await cold.any_chunk(connection, series_ids, start, end):
        as_rows, in_chunks = await cold.count_runs(connection, series_ids, start, end)
        return as_rows + COLD_RUN_COST * in_chunks
    runs = await connection.scalar(
        select(func.count())
        .select_from(RunRow.__table__)
        .where(
            RunRow.series_id.in_(list(series_ids)),
            RunRow.started_at >= type_coerce(start, UtcDateTime()),
            RunRow.started_at < type_coerce(end, UtcDateTime()),
        )
    )
    return int(runs or 0)


async def _raw_gone(connection: AsyncConnection, series_ids: Sequence[int], *, start: datetime, end: datetime) -> bool:
    """Whether retention has removed raw runs of the window: a rollup of these series holds an hour that
    starts in the window and ends before the window's first raw run."""
    if await cold.any_chunk(connection, series_ids, start, end):
        first = await cold.first_start(connection, series_ids, start, end)
    else:
        first = await connection.scalar(
            select(func.min(RunRow.started_at)).where(
                RunRow.series_id.in_(list(series_ids)),
                RunRow.started_at >= type_coerce(start, UtcDateTime()),
                RunRow.started_at < type_coerce(end, UtcDateTime()),
            )
        )
    until = floor_hour(_aware(first)) - timedelta(hours=1) if first is not None else end
    if until <= start:
        return False
    found = await connection.scalar(
        select(RollupRow.hour)
        .where(
            RollupRow.series_id.in_(list(series_ids)),
            RollupRow.hour >= type_coerce(start, UtcDateTime()),
            RollupRow.hour < type_coerce(until, UtcDateTime()),
            RollupRow.samples > 0,
        )
        .limit(1)
    )
    return found is not None


def _refuse_too_many_hours(series: int, *, start: datetime, end: datetime, max_hours: int) -> None:
    hours = series * max(1, math.ceil((end - start).total_seconds() / 3600))
    if hours > max_hours:
        days = max(1, int((end - start).total_seconds() / 86400 * max_hours / hours))
        raise TooBroad(
            f"this compare covers {series:,} series over {hours // series:,} hours, {hours:,} series-hours, more "
            f"than the {max_hours:,} one request may read; narrow it: a shorter since (about {days}d), or "
            "target=, prompt=, location="
        )


async def _hours_of(
    connection: AsyncConnection,
    repository: Repository,
    chosen: Mapping[int, SeriesInfo],
    *,
    start: datetime,
    end: datetime,
) -> dict[int, list[HourlyStats]]:
    """Per series: its stored hourly rollups of the hours starting in [start, end), and the hours after
    its last rollup (the current one, a backlog) computed from raw samples, as `_hours` does for one."""
    ids = list(chosen)
    out: dict[int, list[HourlyStats]] = {sid: [] for sid in ids}
    rows = await connection.execute(
        select(RollupRow.series_id, *_ROLLUP_FIELDS)
        .where(
            RollupRow.series_id.in_(ids),
            RollupRow.hour >= type_coerce(start, UtcDateTime()),
            RollupRow.hour < type_coerce(end, UtcDateTime()),
        )
        .order_by(RollupRow.series_id, RollupRow.hour)
    )
    for sid, *values in rows:
        out[sid].append(HourlyStats(*values))
    # The hours after each series' last rollup, from raw samples: one query per distinct first such hour
    # (usually one: every series rolled up to the same hour).
    tails: dict[datetime, list[int]] = defaultdict(list)
    for sid, hours in out.items():
        tails[hours[-1].hour + timedelta(hours=1) if hours else floor_hour(start)].append(sid)
    for tail_start, members in tails.items():
        if tail_start >= end:
            continue
        fresh = await repository.hourly_of(members, tail_start, end)
        for sid, hours in fresh.items():
            out[sid].extend(h for h in hours if h.hour >= start)
    return out


def _sketch(hour: HourlyStats) -> tuple[float, list[tuple[float, float]]]:
    """An hour as a mixture part: its successful samples' count, and the quantiles it keeps."""
    knots = [
        (p, v)
        for p, v in (
            (0.0, hour.ttft_min_ms),
            (0.1, hour.ttft_p10_ms),
            (0.5, hour.ttft_p50_ms),
            (0.9, hour.ttft_p90_ms),
            (0.99, hour.ttft_p99_ms),
            (1.0, hour.ttft_max_ms),
        )
        if v is not None
    ]
    # Kept increasing: an hour's quantiles are, but a rollup written by hand or rounding may not be.
    for index in range(1, len(knots)):
        if knots[index][1] < knots[index - 1][1]:
            knots[index] = (knots[index][0], knots[index - 1][1])
    return float(max(0, hour.samples - hour.errors)), knots


MIN_BLOCKS = 2  # hours a cell needs for an hour-block interval


def _sqrt(value: float | None) -> float | None:
    return math.sqrt(value) if value is not None else None


def _compare_hours(hours: Mapping[int, Sequence[HourlyStats]], chosen: Mapping[int, SeriesInfo]) -> CompareValues:
    """The compare view from hourly statistics (long ranges): per cell the quantiles of the mixture of
    its hours (`mixture_quantile`), n the successful samples; the median's interval and the pairs'
    from an hour-block bootstrap (the exact bootstrap of the median of the hours' medians, which also
    carries how hours wander together); the prefill slope through the hours' (prompt tokens, TTFT)
    medians."""
    parts: dict[tuple[str, str], list[tuple[float, list[tuple[float, float]]]]] = defaultdict(list)
    medians: dict[tuple[str, str], list[float]] = defaultdict(list)
    tokens: dict[tuple[str, str], list[float]] = defaultdict(list)
    models: dict[str, str] = {}
    slope_points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for sid, series_hours in hours.items():
        info = chosen[sid]
        cell = (info.target, info.prompt)
        for hour in series_hours:
            weight, knots = _sketch(hour)
            if weight <= 0 or hour.ttft_p50_ms is None:
                continue
            models[info.target] = info.model
            parts[cell].append((weight, knots))
            medians[cell].append(hour.ttft_p50_ms)
            if hour.prompt_tokens_p50 is not None:
                tokens[cell].append(hour.prompt_tokens_p50)
                if not info.prompt.endswith(WARM_TWIN_SUFFIX):
                    slope_points[info.target].append((hour.prompt_tokens_p50, hour.ttft_p50_ms))
    point = {cell: mixture_quantile(found, 0.5) for cell, found in parts.items()}
    # One hour is no block bootstrap: such a cell has no interval, and its pairs none either.
    variance = {
        cell: stats.median_variance(sorted(values)) if len(values) >= MIN_BLOCKS else None
        for cell, values in medians.items()
    }
    table = []
    for (target, prompt), found in sorted(parts.items()):
        middle, spread = point[(target, prompt)], _sqrt(variance[(target, prompt)])
        half_width = stats.Z_95 * spread if middle is not None and spread is not None else None
        table.append(
            {
                "target": target,
                "model": models[target],
                "prompt": prompt,
                "n": round(sum(weight for weight, _ in found)),
                "median_ms": _round(middle),
                "p90_ms": _round(mixture_quantile(found, 0.9)),
                "ci_low_ms": _round(middle - half_width) if middle is not None and half_width is not None else None,
                "ci_high_ms": _round(middle + half_width) if middle is not None and half_width is not None else None,
                "prompt_tokens_median": _round(_median(tokens.get((target, prompt), [])), 0),
            }
        )
    pairs = []
    for prompt in sorted({prompt for _, prompt in parts}):
        ranked = sorted((t for t, p in parts if p == prompt), key=lambda t: (point[(t, prompt)] or 0.0, t))
        for i, faster in enumerate(ranked):
            for slower in ranked[i + 1 :]:
                difference = (point[(slower, prompt)] or 0.0) - (point[(faster, prompt)] or 0.0)
                slow_var, fast_var = variance[(slower, prompt)], variance[(faster, prompt)]
                interval = None
                if slow_var is not None and fast_var is not None:
                    half = stats.Z_95 * math.sqrt(slow_var + fast_var)
                    interval = stats.Difference(difference, difference - half, difference + half)
                pairs.append(
                    {
                        "prompt": prompt,
                        "faster": faster,
                        "slower": slower,
                        "difference_ms": _round(difference),
                        "ci_low_ms": _round(interval.low_ms) if interval else None,
                        "ci_high_ms": _round(interval.high_ms) if interval else None,
                        "significant": interval.significant if interval else False,
                    }
                )
    slopes = _slopes(models, slope_points)
    counts = {cell: round(sum(weight for weight, _ in found)) for cell, found in parts.items()}
    return {"cells": table, "pairs": pairs, "slopes": slopes, "cache": _cache_rows(point, counts)}


async def _compare_samples(
    connection: AsyncConnection, series_ids: Sequence[int], *, start: datetime, end: datetime
) -> list[tuple[int, Sequence[float], Sequence[float | None]]]:
    """Per series: the TTFT and prompt tokens of its successful measured samples of runs started in
    [start, end), as two parallel sequences."""
    # By series id: the runs index (series_id, started_at) finds the runs; names are joined by the caller.
    window = (
        RunRow.series_id.in_(list(series_ids)),
        RunRow.started_at >= type_coerce(start, UtcDateTime()),
        RunRow.started_at < type_coerce(end, UtcDateTime()),
        SampleRow.warmup.is_(False),
        SampleRow.error.is_(None),
        SampleRow.ttft_ms.is_not(None),
    )
    joined = RunRow.__table__.join(SampleRow.__table__, SAMPLES_OF_RUN)
    read = await _cold_read(
        connection,
        series_ids,
        start=start,
        end=end,
        samples=True,
        sample_keys=("warmup", "error", "ttft_ms", "prompt_tokens"),
    )
    if read is not None:
        cold_values: dict[int, tuple[list[float], list[float | None]]] = defaultdict(lambda: ([], []))
        for run in read.runs:
            for sample in read.samples.get(run["id"], ()):
                if sample["warmup"] or sample["error"] is not None or sample["ttft_ms"] is None:
                    continue
                cold_values[run["series_id"]][0].append(sample["ttft_ms"])
                cold_values[run["series_id"]][1].append(sample["prompt_tokens"])
        return [(sid, ttfts, tokens) for sid, (ttfts, tokens) in cold_values.items()]
    if connection.dialect.name == "postgresql":
        # One row per series with its values as arrays, which asyncpg decodes in C: row by row, building
        # a result row per sample took about half of the view's time (bench/web.py).
        query = select(RunRow.series_id, func.array_agg(SampleRow.ttft_ms), func.array_agg(SampleRow.prompt_tokens))
        rows = await connection.execute(query.select_from(joined).where(*window).group_by(RunRow.series_id))
        return [(sid, cast(Sequence[float], ttfts), tokens) for sid, ttfts, tokens in rows]  # no NULL ttft
    values: dict[int, tuple[list[float], list[float | None]]] = defaultdict(lambda: ([], []))
    for sid, ttft, tokens in await connection.execute(
        select(RunRow.series_id, SampleRow.ttft_ms, SampleRow.prompt_tokens).select_from(joined).where(*window)
    ):
        values[sid][0].append(cast(float, ttft))  # the window excludes NULL ttft
        values[sid][1].append(tokens)
    return [(sid, ttfts, tokens) for sid, (ttfts, tokens) in values.items()]
