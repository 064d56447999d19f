"""The status pages' server time with a realistic history: overview, a 30-day series, compare.

Writes N samples (default 1,000,000) over 500 series with bench/storage.py's generator (every 30
minutes, 1 warm-up + 5 measured samples per run, about a week of history), rolls up the hours as
the daemon's housekeeping does, then times the API's query functions (the server's work for a page,
without HTTP):

- overview: every series with status, last-hour p50, baseline, sparkline, availability;
- a 30-day series view (hourly rollups; raw samples for the hours not rolled up);
- a 24-hour series view (raw samples, bucketed to at most 1,500 points);
- compare over 7 days for three targets x two prompts x two locations (the seeds' table).

    .venv/bin/python bench/web.py [--samples 1000000] [--series 500] [--queries 30]

PostgreSQL only (a scratch database on --postgres-url, default $TTFT_TEST_POSTGRES_URL, dropped after).
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
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import INTERVAL, ROUNDS, WARMUP, make_series, postgres_scratch, tick_samples, timings

from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.records import runs_from_samples
from monitor.store.repository import Repository
from monitor.web import queries


async def timed(calls: int, make_call: object) -> list[float]:
    out = []
    for index in range(calls):
        began = time.perf_counter()
        await make_call(index)  # type: ignore[operator]
        out.append(time.perf_counter() - began)
    return out


async def bench(url: str, args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    engine = create_engine(url)
    repository = Repository(engine)
    series = make_series(args.series, rng)
    per_tick = len(series) * (ROUNDS + WARMUP)
    ticks = max(1, args.samples // per_tick)
    start = datetime(2026, 1, 5, tzinfo=UTC)
    now = start + ticks * INTERVAL
    if not args.reuse:
        await load(url, repository, series, ticks, start, now, rng)
    await time_views(engine, series, now, rng, args)
    await engine.dispose()


async def load(url: str, repository: Repository, series: list, ticks: int, start: datetime, now: datetime,
               rng: random.Random) -> None:  # fmt: skip
    await migrate.upgrade(url)
    per_tick = len(series) * (ROUNDS + WARMUP)
    provider_of = {one.key.target: one.key.provider for one in series}
    by_location: dict[str, list] = {}
    for one in series:
        by_location.setdefault(one.key.location, []).append(one)
    began = time.perf_counter()
    for tick in range(ticks):
        at = start + tick * INTERVAL
        batch = []
        for location, members in by_location.items():
            batch += runs_from_samples(tick_samples(members, at, rng), job="bench", location=location,
                                       provider_of=provider_of)  # fmt: skip
        await repository.save_runs(batch)
    print(f"   loaded {ticks * per_tick:,} samples, {len(series)} series in {time.perf_counter() - began:.0f} s")
    began = time.perf_counter()
    rolled = 0
    while True:
        done = await repository.rollup(now + timedelta(hours=2))
        rolled += done
        if not done:
            break
    print(f"   rolled up {rolled:,} series-hours in {time.perf_counter() - began:.0f} s")
    async with repository.engine.connect() as connection:
        await connection.exec_driver_sql("ANALYZE")
        await connection.commit()


async def time_views(engine: Any, series: list, now: datetime, rng: random.Random, args: argparse.Namespace) -> None:
    async with engine.connect() as connection:
        await connection.exec_driver_sql("ANALYZE")
        await connection.commit()
        ids = list(await connection.scalars(sa.text("SELECT id FROM series ORDER BY id")))
    targets = sorted({one.key.target for one in series})[:3]
    picks = [rng.choice(ids) for _ in range(args.queries)]

    overview = await timed(args.queries, lambda _i: queries.overview(engine, now=now))
    month = await timed(
        args.queries, lambda i: queries.series_points(engine, picks[i], start=now - timedelta(days=30), end=now)
    )
    day = await timed(
        args.queries, lambda i: queries.series_points(engine, picks[i], start=now - timedelta(days=1), end=now)
    )
    compare = await timed(
        args.queries, lambda _i: queries.compare(engine, start=now - timedelta(days=7), end=now, targets=targets)
    )
    sample = await queries.compare(engine, start=now - timedelta(days=7), end=now, targets=targets)
    print(f"   overview ({len(ids)} series)                   {timings(overview)}")
    print(f"   series, 30 days (hourly)                 {timings(month)}")
    print(f"   series, 24 hours (raw, bucketed)         {timings(day)}")
    cells = sum(c["n"] for c in sample["cells"])
    print(f"   compare, 7 days, 3 targets ({cells:,} samples) {timings(compare)}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--queries", type=int, default=30, help="timed calls of each view")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("TTFT_TEST_POSTGRES_URL") or "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    )
    parser.add_argument("--keep", action="store_true", help="keep the loaded database (its URL is printed)")
    parser.add_argument("--reuse", metavar="URL", help="time the views on a database kept by --keep (same options)")
    args = parser.parse_args()
    print(f"ttft-monitor web benchmark  python {platform.python_version()}  {os.cpu_count()} CPUs")
    if args.reuse:
        await bench(args.reuse, args)
        return 0
    url, drop = await postgres_scratch(args.postgres_url)
    try:
        await bench(url, args)
    finally:
        if args.keep:
            print(f"kept: {url}  (time again with --reuse {url})")
        else:
            await drop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
