"""The daemon's housekeeping: hourly rollups and retention, in bounded batches, off the probe path."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import structlog

from monitor.config.models import ColdPolicy, Database
from monitor.logging import error_text
from monitor.waits import sleep_unless

MAINTENANCE_INTERVAL_S = 3600.0
FIRST_RUN_AFTER_S = 30.0  # not at start-up: let the first ticks probe undisturbed
# Later passes run this long after each whole interval (each hour): the hour just finished is rolled
# up, and the overview's summary made, at the start of the hour it serves, whenever the daemon started.
AFTER_THE_HOUR_S = 30.0
# Series-days moved into the cold tier per pass, at most: a day of 500 series' 5-minute runs (864,000 samples,
# about a minute at the rate bench/cold.py measures); a backlog (an upgraded database) takes several passes.
COMPACT_PER_PASS = 500


def next_pass_in(now_s: float, interval_s: float, *, offset_s: float = AFTER_THE_HOUR_S) -> float:
    """Seconds from `now_s` (epoch) to the next pass: `offset_s` after a whole multiple of
    `interval_s`, never sooner than a tenth of the interval (two passes never run back to back)."""
    offset = offset_s % interval_s
    delay = (offset - now_s) % interval_s
    return delay if delay >= interval_s / 10 else delay + interval_s


class Pruned(Protocol):
    """What one pruning removed (store.repository.PruneResult)."""

    @property
    def runs(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def rollups(self) -> int: ...
    @property
    def job_ticks(self) -> int: ...
    @property
    def incidents(self) -> int: ...
    @property
    def incident_groups(self) -> int: ...
    @property
    def annotations(self) -> int: ...
    @property
    def days_dropped(self) -> int: ...
    @property
    def cold_days(self) -> int: ...


class Compacted(Protocol):
    """What one compaction moved into the cold tier (store.repository.CompactResult)."""

    @property
    def series_days(self) -> int: ...
    @property
    def runs(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def duplicates(self) -> int: ...
    @property
    def days_dropped(self) -> int: ...


class Housekept(Protocol):
    """What housekeeping needs of the store (store.repository.Repository)."""

    async def ensure_partitions(self, now: datetime) -> list[str]: ...

    async def analyze_partitions(self) -> list[str]: ...

    async def rollup(self, now: datetime) -> int: ...

    async def refresh_overview_summary(self, now: datetime) -> int: ...

    async def compact(
        self,
        now: datetime,
        *,
        cold_after_days: int,
        keep_runs: int | None = None,
        limit: int | None = None,
    ) -> Compacted: ...

    async def prune(self, now: datetime, raw_days: int, rollup_days: int) -> Pruned: ...


async def maintain_once(
    repository: Housekept, database: Database, *, cold: ColdPolicy | None = None, now: datetime | None = None
) -> dict[str, int]:
    """Create the coming days' partitions (PostgreSQL), roll up finished hours, store the overview's
    summary of them (monitor/store/overview_summary.py), move the days `cold` allows into the cold tier
    (monitor/store/cold.py; `Config.cold_policy()`, None compacts nothing), then
    prune what is past retention: raw runs and job tick claims past `retention.raw_days` (on PostgreSQL whole days, as
    partitions), rollups, long-resolved incidents (with their triage and groups) and change markers past
    `retention.rollup_days`. Each step works in short transactions (see `Repository.prune`)."""
    now = now or datetime.now(UTC)
    created = await repository.ensure_partitions(now)
    # The rollup's plans need the days' statistics: a day filled faster than autovacuum analyzes it
    # (a backlog replayed, a bulk load) made each hour's query read every day's samples.
    analyzed = await repository.analyze_partitions()
    hours = await repository.rollup(now)
    # Right after the rollup, so the overview reads this hour's summary instead of a month of hours.
    summarised = await repository.refresh_overview_summary(now)
    # After the rollup: a day is compacted only once its hours are rolled up.
    compacted = (
        await repository.compact(now, cold_after_days=cold.after_days, keep_runs=cold.keep_runs, limit=COMPACT_PER_PASS)
        if cold is not None
        else None
    )
    pruned = await repository.prune(now, database.retention.raw_days, database.retention.rollup_days)
    return {
        "partitions_created": len(created),
        "partitions_analyzed": len(analyzed),
        "hours_rolled_up": hours,
        "series_summarised": summarised,
        "runs_pruned": pruned.runs,
        "samples_pruned": pruned.samples,
        "rollups_pruned": pruned.rollups,
        "job_ticks_pruned": pruned.job_ticks,
        "incidents_pruned": pruned.incidents,
        "incident_groups_pruned": pruned.incident_groups,
        "annotations_pruned": pruned.annotations,
        "days_dropped": pruned.days_dropped,
        "series_days_compacted": compacted.series_days if compacted is not None else 0,
        "samples_compacted": compacted.samples if compacted is not None else 0,
        "cold_days_pruned": pruned.cold_days,
    }


@dataclass(slots=True)
class Housekeeping:
    """What housekeeping's passes follow of the config: retention (`database.retention`) and the cold tier's policy
    (`Config.cold_policy()`). Read at each pass, so a reload's take effect (`Served.update_housekeeping`): kept from
    the start, a reload to `cold_after_days: off` went on compacting, and one whose detection rules read further
    back went on compacting what they read."""

    database: Database
    cold: ColdPolicy | None = None


async def run_maintenance(
    repository: Housekept,
    housekeeping: Housekeeping,
    stop: asyncio.Event,
    *,
    first_after_s: float = FIRST_RUN_AFTER_S,
    interval_s: float = MAINTENANCE_INTERVAL_S,
) -> None:
    """Until `stop`: maintenance after `first_after_s`, then each `interval_s`, aligned to
    `AFTER_THE_HOUR_S` past its multiples (`next_pass_in`), as `housekeeping` says then. Never raises."""
    log = structlog.get_logger()
    delay = first_after_s
    while not stop.is_set():
        await sleep_unless(stop, delay)
        if stop.is_set():
            return
        try:
            done = await maintain_once(repository, housekeeping.database, cold=housekeeping.cold)
        except Exception as exc:  # the database may be down; try again next time
            log.warning("maintenance_failed", error=error_text(exc))
        else:
            log.info("maintenance_finished", **done)
        delay = next_pass_in(time.time(), interval_s)
