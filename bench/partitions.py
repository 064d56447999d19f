"""Retention and the partitioning migration on PostgreSQL, measured side by side on one history.

Fills N samples (default 5,000,000) over S series through `Repository.save_runs` (at head, then
downgraded to migration 0016: plain `runs` and `samples`), the history ending now (bench/storage.py's runs: 1 warm-up
+ 5 measured samples every 30 minutes, unless --interval-min says otherwise), then:

1. retention as it was before 0017: the oldest day's runs and samples deleted row by row, 1,000 runs
   per transaction (the loop `Repository.prune` ran), timed;
2. `migrate.upgrade` 0016 -> 0017 (copy into day partitions, indexes built after), timed;
3. retention as it is now: the next day dropped as two partitions (`Repository.prune`), timed;

and prints the database's bytes per sample before and after the migration.

    .venv/bin/python bench/partitions.py [--samples 5000000] [--series 500] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import ROUNDS, WARMUP, database_size, default_postgres_url, make_series, postgres_scratch, write_ticks

from monitor.store import migrate
from monitor.store.engine import create_engine, display_url
from monitor.store.repository import Repository


async def fill(url: str, args: argparse.Namespace, now: datetime) -> tuple[int, datetime]:
    """Fill the database; returns the samples stored and the first tick."""
    rng = random.Random(args.seed)
    engine = create_engine(url)
    repository = Repository(engine)
    series = make_series(args.series, rng)
    per_tick = len(series) * (ROUNDS + WARMUP)
    ticks = max(1, args.samples // per_tick)
    interval = timedelta(minutes=args.interval_min)
    first = (now - ticks * interval).replace(second=0, microsecond=0)
    await write_ticks(repository, series, ticks=ticks, start=first, interval=interval, rng=rng)
    await engine.dispose()
    return ticks * per_tick, first


async def delete_day_by_rows(url: str, day_end: datetime) -> tuple[int, int, float]:
    """Before 0017: every run that started before `day_end`, with its samples, 1,000 runs at a time."""
    engine = create_engine(url)
    runs = samples = 0
    began = time.perf_counter()
    try:
        while True:
            async with engine.begin() as connection:
                ids = list(
                    await connection.scalars(
                        sa.text("SELECT id FROM runs WHERE started_at < :end ORDER BY started_at LIMIT 1000"),
                        {"end": day_end},
                    )
                )
                if ids:
                    samples += (
                        await connection.execute(sa.text("DELETE FROM samples WHERE run_id = ANY(:ids)"), {"ids": ids})
                    ).rowcount
                    runs += (
                        await connection.execute(sa.text("DELETE FROM runs WHERE id = ANY(:ids)"), {"ids": ids})
                    ).rowcount
            if len(ids) < 1000:
                break
    finally:
        await engine.dispose()
    return runs, samples, time.perf_counter() - began


def fill_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a bench that fills a scratch PostgreSQL database with `fill`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--samples", type=int, default=5_000_000)
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--interval-min", type=float, default=30.0, help="minutes between a series' runs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the database (its URL is printed)")
    parser.add_argument("--postgres-url", default=default_postgres_url())
    return parser


async def main() -> int:
    args = fill_arguments(__doc__.split("\n\n")[0]).parse_args()
    print(f"# bench/partitions.py on {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    url, drop = await postgres_scratch(args.postgres_url)
    try:
        print(f"== {display_url(url)} at 0016, {args.samples:,} samples over {args.series} series")
        # Today's repository writes today's columns: filled at head, then stepped back to 0016 (the data stays).
        await migrate.upgrade(url)
        now = datetime.now(UTC)
        stored, first = await fill(url, args, now)
        await migrate.downgrade(url, "0016")
        engine = create_engine(url)
        before = await database_size(engine, "postgres", None)
        await engine.dispose()
        first_day_end = datetime.combine(first.date() + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
        runs, samples, took = await delete_day_by_rows(url, first_day_end)
        print(f"   retention before 0017: {runs:,} runs and {samples:,} samples deleted row by row in {took:.2f} s")
        async with create_engine(url).connect() as connection:
            left = int(await connection.scalar(sa.text("SELECT count(*) FROM samples")) or 0)
        began = time.perf_counter()
        await migrate.upgrade(url)
        migrated = time.perf_counter() - began
        print(f"   migration 0016 -> 0017: {left:,} samples in {migrated:.1f} s ({left / migrated:,.0f} samples/s)")
        engine = create_engine(url)
        after = await database_size(engine, "postgres", None)
        print(
            f"   size: {before / stored:,.0f} bytes/sample before (plain tables), "
            f"{after / left:,.0f} after (day partitions; {left:,} samples)"
        )
        repository = Repository(engine)
        async with engine.begin() as connection:
            # This times the drop, not the rollups: no pending hour may hold the day back.
            await connection.execute(sa.text("DELETE FROM rollup_pending"))
        second_day_end = first_day_end + timedelta(days=1)
        raw_days = (now - second_day_end).total_seconds() / 86400
        began = time.perf_counter()
        pruned = await repository.prune(now, raw_days=int(raw_days), rollup_days=400)
        took = time.perf_counter() - began
        print(
            f"   retention after 0017: {pruned.days_dropped} day(s), {pruned.runs:,} runs and "
            f"{pruned.samples:,} samples dropped as partitions in {took:.2f} s"
        )
        await engine.dispose()
    finally:
        if args.keep:
            print(f"kept: {url}")
        else:
            await drop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
