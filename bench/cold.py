"""The cold tier measured (issue 26): bytes per sample before and after the real compaction, its throughput,
and what reads of a compacted range cost against the same reads of rows.

Fills a scratch database through `Repository.save_runs` (bench/storage.py's series and samples: 1 warm-up + 5
measured samples a run, 2% failed), rolls every hour up, times the reads, runs `Repository.compact` as
housekeeping does (every day whose end is `--cold-after-days` or more before the history's end), and measures
and times again. Sizes: PostgreSQL's `pg_total_relation_size` (heap, TOAST, indexes) of `series`, `runs` and
`samples` with every partition, `rollup_pending` and `cold_chunks`; on SQLite the pages of the same tables and
their indexes after `VACUUM` (`dbstat`).

    .venv/bin/python bench/cold.py [--db postgres|sqlite|both] [--series 100] [--days 20] [--interval-minutes 30]

The reads timed on random series, each over the compacted days: `load_runs` (the runs with every sample: the
export and replay read), the series view of 7 days (`series_points`: samples, or buckets of them) and of 30
days (hours), and the compare over every series' whole history (`compare`, by samples below 100,000 runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.storage import make_series, postgres_scratch, timings, write_ticks
from monitor.detect.rules import Rules
from monitor.store import migrate
from monitor.store.engine import create_engine, display_url
from monitor.store.repository import Repository
from monitor.web import queries

HOT_BYTES_TODAY = 315  # bytes a sample as rows on PostgreSQL (docs/storage.md, "Where a sample's bytes go")
# How far back detection reads for a 5-minute run with the default rules (Rules().history_reach_s(300)).
DETECTION_REACH = timedelta(seconds=Rules().history_reach_s(300.0))


async def store_size(engine: Any, backend: str, path: Path | None) -> tuple[int, int]:
    """(every table that holds runs and samples, the cold chunks alone), in bytes."""
    async with engine.connect() as connection:
        if backend == "sqlite":
            assert path is not None
            vacuum(path)
            with sqlite3.connect(path) as direct:
                # The pages of those tables and their indexes (dbstat), as PostgreSQL's sizes count them.
                pages = (
                    "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
                    "(SELECT name FROM sqlite_master WHERE tbl_name IN ({}))"
                )
                tables = "'series', 'runs', 'samples', 'rollup_pending', 'cold_chunks'"
                total = int(direct.execute(pages.format(tables)).fetchone()[0])
                cold = int(direct.execute(pages.format("'cold_chunks'")).fetchone()[0])
            return total, cold
        # The rollups' queue holds the hours waiting for their rollup: a few rows at steady state, which
        # autovacuum keeps so; the bulk fill here leaves it a row's dead space for every series-hour filled.
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.exec_driver_sql("VACUUM FULL rollup_pending")
        total = 0
        for table in ("series", "runs", "samples", "rollup_pending", "cold_chunks"):
            total += int(
                await connection.scalar(
                    sa.text(
                        "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) "
                        f"FROM pg_partition_tree('{table}')), pg_total_relation_size('{table}'))"
                    )
                )
            )
        cold = int(await connection.scalar(sa.text("SELECT pg_total_relation_size('cold_chunks')")))
        return total, cold


def vacuum(path: Path) -> None:
    """SQLite: the file without its free pages (deleted rows leave them), checkpointed."""
    with sqlite3.connect(path, isolation_level=None) as direct:
        direct.execute("VACUUM")
        direct.execute("PRAGMA wal_checkpoint(TRUNCATE)")


async def counts(engine: Any) -> tuple[int, int, int]:
    """(samples in rows, samples in chunks, series-days in chunks)."""
    async with engine.connect() as connection:
        rows = int(await connection.scalar(sa.text("SELECT count(*) FROM samples")) or 0)
        chunked = await connection.execute(sa.text("SELECT coalesce(sum(samples), 0), count(*) FROM cold_chunks"))
        cold, days = chunked.one()
        return rows, int(cold), int(days)


async def timed(calls: list[Callable[[], Awaitable[Any]]]) -> list[float]:
    out = []
    for call in calls:
        began = time.perf_counter()
        await call()
        out.append(time.perf_counter() - began)
    return out


async def reads(
    repository: Repository, picks: list[Any], ids: dict[Any, int], start: datetime, end: datetime, data_end: datetime
) -> dict[str, list[float]]:
    engine = repository.engine
    seven = min(end, start + timedelta(days=7))
    # 30 days and 20 minutes after a day the history holds compacted: the month window's part hour is in it.
    overview_at = start + timedelta(days=30, minutes=20)
    # A live daemon's: 20 minutes after the last runs, with housekeeping's summary made at the top of the hour
    # (its month starts in a compacted day with --days 31 or more).
    live_at = data_end + timedelta(minutes=20)
    await repository.refresh_overview_summary(data_end + timedelta(seconds=30))
    return {
        "overview, live (20 min after the last runs, summary)": await timed(
            [lambda: queries.overview(engine, now=live_at)] * len(picks)
        ),
        f"load_runs, {(end - start).days} days of a series": await timed(
            [lambda key=key: repository.load_runs(key, start, end) for key in picks]
        ),
        "series view, 7 days (samples)": await timed(
            [lambda key=key: queries.series_points(engine, ids[key], start=start, end=seven) for key in picks]
        ),
        "series view, 30 days (hours)": await timed(
            [
                lambda key=key: queries.series_points(engine, ids[key], start=end - timedelta(days=30), end=end)
                for key in picks
            ]
        ),
        "overview 30 days after the first runs": await timed(
            [lambda: queries.overview(engine, now=overview_at)] * len(picks)
        ),
        "compare, every series, the compacted days": await timed(
            [lambda: queries.compare(engine, start=start, end=end)] * 3
        ),
        # What an evaluation reads when it keeps no history (`once`, a restart, a series past the memory budget).
        "detection's history read afresh (8.3 days)": await timed(
            [lambda key=key: repository.history_rows(key, data_end - DETECTION_REACH, data_end) for key in picks]
        ),
    }


async def bench(backend: str, url: str, args: argparse.Namespace, path: Path | None) -> None:
    rng = random.Random(args.seed)
    await migrate.upgrade(url)
    engine = create_engine(url)
    repository = Repository(engine)
    series = make_series(args.series, rng)
    interval = timedelta(minutes=args.interval_minutes)
    ticks = int(timedelta(days=args.days) / interval)
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - ticks * interval
    for day in range(args.days + 2):
        await repository.ensure_partitions(start + timedelta(days=day))
    print(f"\n== {backend}: {display_url(url)}")
    print(f"   {len(series)} series, a run every {args.interval_minutes} min for {args.days} days, 6 samples a run")
    await write_ticks(repository, series, ticks=ticks, start=start, interval=interval, rng=rng)
    await repository.rollup(end + timedelta(hours=1))
    async with engine.connect() as connection:
        if backend == "postgres":
            await connection.exec_driver_sql("ANALYZE")
            await connection.commit()
        rows = await connection.execute(sa.text("SELECT id, target, provider, model, prompt, location FROM series"))
        by_key = {(r.target, r.provider, r.model, r.prompt, r.location): r.id for r in rows}
    ids = {
        one.key: by_key[(one.key.target, one.key.provider, one.key.model, one.key.prompt, one.key.location)]
        for one in series
    }
    before_total, _ = await store_size(engine, backend, path)
    samples_before, _, _ = await counts(engine)
    print(f"   stored: {samples_before:,} samples; {before_total / samples_before:,.0f} bytes a sample (all rows)")
    cold_end = (end - timedelta(days=args.cold_after_days)).replace(hour=0)
    cold_start = (start + timedelta(days=1)).replace(hour=0)
    picks = [rng.choice(series).key for _ in range(args.queries)]
    before = await reads(repository, picks, ids, cold_start, cold_end, end)

    began, cpu = time.perf_counter(), time.process_time()
    done = await repository.compact(end, cold_after_days=args.cold_after_days)
    took, cpu_took = time.perf_counter() - began, time.process_time() - cpu
    total, cold = await store_size(engine, backend, path)
    hot_samples, cold_samples, days = await counts(engine)
    assert hot_samples + cold_samples == samples_before, (hot_samples, cold_samples, samples_before)
    print(
        f"   compaction: {done.series_days:,} series-days, {done.samples:,} samples in {took:.1f} s = "
        f"{done.samples / took:,.0f} samples/s ({cpu_took / done.samples * 1e6:.1f} us of this process' CPU a sample); "
        f"{done.days_dropped} day partitions dropped"
    )
    print(
        f"   after: {hot_samples:,} samples as rows, {cold_samples:,} in {days:,} chunks; "
        f"cold part {cold / cold_samples:,.1f} bytes a sample (heap, TOAST, index); "
        f"whole store {total / samples_before:,.0f} bytes a sample"
    )
    hot_bytes = (total - cold) / hot_samples if hot_samples else float("nan")
    print(f"   rows left: {hot_bytes:,.0f} bytes a sample (the {args.cold_after_days} newest days)")
    # The rows' bytes as measured here (this run's newest days), else as docs/storage.md measured them.
    row_bytes = hot_bytes if hot_samples else HOT_BYTES_TODAY
    for retention in (30, 90):
        hot = args.cold_after_days + 0.5  # the whole days kept, and today's part of a day on average
        mixed = (hot * row_bytes + (retention - hot) * cold / cold_samples) / retention
        print(
            f"   over {retention} days of retention, {hot:g} of them rows at {row_bytes:,.0f} B: "
            f"{mixed:,.0f} bytes a sample"
        )
    after = await reads(repository, picks, ids, cold_start, cold_end, end)
    print(f"   reads over the compacted days ({len(picks)} random series), rows -> chunks:")
    for name, values in before.items():
        print(f"     {name:42s} {timings(values)}  ->  {timings(after[name])}")
    await engine.dispose()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="postgres")
    parser.add_argument("--series", type=int, default=100)
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--interval-minutes", type=float, default=30)
    parser.add_argument("--cold-after-days", type=int, default=3, help="3: what auto compacts since 2026-12-07")
    parser.add_argument("--queries", type=int, default=10, help="random series each read is timed on")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("TTFT_TEST_POSTGRES_URL") or "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    )
    args = parser.parse_args()
    print(
        f"ttft-monitor cold tier benchmark  python {platform.python_version()}  sqlite {sqlite3.sqlite_version}  "
        f"{os.cpu_count()} CPUs  load {os.getloadavg()[0]:.1f}"
    )
    if args.db in ("sqlite", "both"):
        with tempfile.TemporaryDirectory(prefix="ttft-cold-") as directory:
            path = Path(directory) / "bench.db"
            await bench("sqlite", f"sqlite+aiosqlite:///{path}", args, path)
    if args.db in ("postgres", "both"):
        url, drop = await postgres_scratch(args.postgres_url)
        try:
            await bench("postgres", url, args, None)
        finally:
            await drop()
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
