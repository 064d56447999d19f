"""Production scale on PostgreSQL (or SQLite, `--db sqlite`): the same figures at two history sizes,
side by side in one run.

For each size (default 2,000,000 and 20,000,000 samples) over S series (default 5,000), in a scratch
database of its own: writes the history through `Repository.save_runs` (bench/storage.py's runs: 1
warm-up + 5 measured samples every 30 minutes, ending now, into the day partitions housekeeping
makes), rolls every hour up as housekeeping does, then prints

- bytes per sample (tables and indexes), insert rate, rollup rate;
- the status pages' server time (p50 / p95 over --queries calls of the API's query functions):
  overview before housekeeping's first pass (a scan of the month's rollups), cold with housekeeping's
  summary (the time to make it too) and as the UI serves it (past hours cached), a 30-day and a 1-day
  series view, a 7-day compare
  of 3 targets x 2 prompts x 2 locations from the samples and from the hourly rollups (with the
  largest relative error of a cell's median and p90 between the two), and a 90-day report of one
  target (compare over 90 days);
- retention's time to drop the oldest day (two partitions);

and last a table of both sizes with the ratio, so the growth is visible in one run.

    .venv/bin/python bench/scale.py [--sizes 2000000,20000000] [--series 5000] [--queries 20] [--db sqlite]
    .venv/bin/python bench/scale.py --keep ...            # PostgreSQL: keep the filled databases
    .venv/bin/python bench/scale.py --views URL,URL       # then time only the views on them, again

About 25 minutes on 2 cores for the default sizes (most of it writing and rolling up 22M samples).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import (
    INTERVAL,
    ROUNDS,
    WARMUP,
    database_size,
    default_postgres_url,
    make_series,
    postgres_scratch,
    write_ticks,
)

from monitor.quantile import quantile
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.repository import Repository
from monitor.web import queries


def p50_p95(durations: list[float]) -> tuple[float, float]:
    ms = sorted(d * 1000 for d in durations)
    p50, p95 = quantile(ms, 0.5, presorted=True), quantile(ms, 0.95, presorted=True)
    return (p50 if p50 is not None else math.nan), (p95 if p95 is not None else math.nan)


async def timed(calls: int, make_call: Any) -> tuple[float, float]:
    durations = []
    for index in range(calls):
        began = time.perf_counter()
        await make_call(index)
        durations.append(time.perf_counter() - began)
    return p50_p95(durations)


async def one_size(url: str, samples: int, args: argparse.Namespace, sqlite_path: Path | None = None) -> dict[str, Any]:
    rng = random.Random(args.seed)
    backend = "sqlite" if sqlite_path is not None else "postgres"
    await migrate.upgrade(url)
    engine = create_engine(url)
    repository = Repository(engine)
    series = make_series(args.series, rng)
    per_tick = len(series) * (ROUNDS + WARMUP)
    ticks = max(1, samples // per_tick)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    start = now - ticks * INTERVAL
    for day in range((ticks * INTERVAL).days + 2):
        await repository.ensure_partitions(start + timedelta(days=day))
    insert_s = await write_ticks(repository, series, ticks=ticks, start=start, interval=INTERVAL, rng=rng)
    stored = ticks * per_tick
    began = time.perf_counter()
    rolled = 0
    await repository.analyze_partitions()  # housekeeping's step before the rollup
    while done := await repository.rollup(now + timedelta(hours=1)):
        rolled += done
    rollup_s = time.perf_counter() - began
    size = await database_size(engine, backend, sqlite_path)
    async with engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        # As autovacuum leaves a table that stopped changing; SQLite: the statistics the daemon's
        # connections gather with `PRAGMA optimize`.
        await connection.exec_driver_sql("VACUUM ANALYZE" if backend == "postgres" else "ANALYZE")
    figures: dict[str, Any] = {
        "history": f"{(ticks * INTERVAL).total_seconds() / 86400:.1f} days",
        "samples": stored,
        "bytes/sample": size / stored,
        "insert samples/s": stored / insert_s,
        "rollup series-hours/s": rolled / rollup_s if rollup_s else 0.0,
    }
    print(f"   written and rolled up; timing the views (load average {os.getloadavg()[0]:.1f})", flush=True)
    figures.update(await time_views(engine, repository, now, args, prune_start=start))
    await engine.dispose()
    return figures


async def views_of(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The views' figures on a database an earlier `--keep` run filled: `now` as that run had it (a
    tick after its last run), so the windows, the summary's hour and the rollups are those it timed."""
    engine = create_engine(url)
    repository = Repository(engine)
    async with engine.connect() as connection:
        last, first = (await connection.execute(sa.text("SELECT max(started_at), min(started_at) FROM runs"))).one()
        stored = await connection.scalar(sa.text("SELECT count(*) FROM samples"))
    if last is None:
        raise SystemExit(f"{url}: no runs; fill it with `bench/scale.py --keep` first")
    now, start = _aware(last) + INTERVAL, _aware(first)
    print(f"   {stored:,} samples to {now:%Y-%m-%d %H:%M} UTC; timing the views (load {os.getloadavg()[0]:.1f})")
    figures: dict[str, Any] = {"history": f"{(now - start).total_seconds() / 86400:.1f} days", "samples": stored}
    figures.update(await time_views(engine, repository, now, args, prune_start=None))
    await engine.dispose()
    return figures


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def time_views(
    engine: Any, repository: Repository, now: datetime, args: argparse.Namespace, *, prune_start: datetime | None
) -> dict[str, Any]:
    """Each view's p50 / p95 over --queries calls (see the module's docstring); retention's drop of the
    oldest day when `prune_start` (the history's first tick) is given."""
    rng = random.Random(args.seed)
    async with engine.connect() as connection:
        ids = list(await connection.scalars(sa.text("SELECT id FROM series ORDER BY id")))
        targets = sorted(set(await connection.scalars(sa.text("SELECT DISTINCT target FROM series"))))
    picks = [rng.choice(ids) for _ in range(args.queries)]
    cache = queries.OverviewCache()
    month, week = now - timedelta(days=30), now - timedelta(days=7)
    figures: dict[str, Any] = {}
    # Cold: no summary yet (a fresh start before housekeeping's first pass), the month of rollups scanned.
    figures["overview cold, scan"] = await timed(args.queries, lambda _i: queries.overview(engine, now=now))
    began = time.perf_counter()
    await repository.refresh_overview_summary(now)  # housekeeping's step after the rollup
    figures["overview summary made (ms)"] = (time.perf_counter() - began) * 1000
    figures["overview cold"] = await timed(args.queries, lambda _i: queries.overview(engine, now=now))
    figures["overview cached"] = await timed(args.queries, lambda _i: queries.overview(engine, now=now, cache=cache))
    figures["series 30 d"] = await timed(
        args.queries, lambda i: queries.series_points(engine, picks[i], start=month, end=now)
    )
    # The same view over its last day (what the page opens on): its samples, and the detector replayed over the
    # runs of its history (a week and a day of them), which grows with the days kept up to that week.
    figures["series 1 d"] = await timed(
        args.queries, lambda i: queries.series_points(engine, picks[i], start=now - timedelta(days=1), end=now)
    )
    figures["compare 7 d"] = await timed(
        args.queries, lambda _i: queries.compare(engine, start=week, end=now, targets=targets[:3])
    )
    figures["compare 7 d, from rollups"] = await timed(
        args.queries, lambda _i: queries.compare(engine, start=week, end=now, targets=targets[:3], max_runs=0)
    )
    raw = await queries.compare(engine, start=week, end=now, targets=targets[:3])
    hourly = await queries.compare(engine, start=week, end=now, targets=targets[:3], max_runs=0)
    exact = {(c["target"], c["prompt"]): c for c in raw["cells"]}
    for key in ("median_ms", "p90_ms"):
        errors = [
            abs(c[key] / exact[(c["target"], c["prompt"])][key] - 1) * 100
            for c in hourly["cells"]
            if exact.get((c["target"], c["prompt"]), {}).get(key)
        ]
        figures[f"rollups vs samples, {key[:-3]} error % (max)"] = max(errors) if errors else float("nan")
    figures["report 90 d"] = await timed(
        max(3, args.queries // 4),
        lambda i: queries.compare(engine, start=now - timedelta(days=90), end=now, targets=[targets[i % len(targets)]]),
    )
    if prune_start is not None:
        raw_days = int((now - (prune_start + timedelta(days=1))).total_seconds() // 86400)
        began = time.perf_counter()
        pruned = await repository.prune(now, raw_days=raw_days, rollup_days=400)
        figures["drop a day"] = (time.perf_counter() - began) * 1000, pruned.samples
    return figures


def report(sizes: list[int], results: list[dict[str, Any]]) -> None:
    print("\n| figure | " + " | ".join(f"{s:,} samples" for s in sizes) + " | ratio |")
    print("| --- | " + " | ".join("---" for _ in sizes) + " | --- |")
    for key in results[0]:
        cells = []
        for figures in results:
            value = figures[key]
            if isinstance(value, tuple) and key == "drop a day":
                cells.append(f"{value[0]:,.0f} ms ({value[1]:,} samples)")
            elif isinstance(value, tuple):
                cells.append(f"{value[0]:,.1f} / {value[1]:,.1f} ms")
            elif isinstance(value, float):
                cells.append(f"{value:,.2f}" if "error" in key else f"{value:,.0f}")
            else:
                cells.append(f"{value:,}" if isinstance(value, int) else str(value))
        first, last = results[0][key], results[-1][key]
        if isinstance(first, tuple) and key != "drop a day":
            ratio = f"{last[1] / first[1]:.2f}x (p95)" if first[1] else "-"
        elif isinstance(first, float) and first:
            ratio = f"{last / first:.2f}x"
        else:
            ratio = "-"
        print(f"| {key} | " + " | ".join(cells) + f" | {ratio} |")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000000,20000000", help="history sizes in samples, comma-separated")
    parser.add_argument("--series", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=20, help="timed calls of each view")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--postgres-url", default=default_postgres_url())
    parser.add_argument(
        "--keep", action="store_true", help="PostgreSQL: keep each size's database (its URL is printed) for --views"
    )
    parser.add_argument(
        "--views",
        metavar="URL[,URL]",
        help="time only the views, on databases an earlier --keep run filled (nothing written; retention not run)",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    if args.views:
        urls = args.views.split(",")
        print(f"# bench/scale.py --views on {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        kept = []
        for url in urls:
            print(f"== {url}", flush=True)
            kept.append(await views_of(url, args))
        report([figures["samples"] for figures in kept], kept)
        print(f"\n{time.perf_counter() - began:.0f} s; load average at the end {os.getloadavg()[0]:.1f}")
        return 0
    sizes = [int(size) for size in args.sizes.split(",")]
    print(
        f"# bench/scale.py on {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
        f"{args.series} series, sizes {sizes}, {args.db}"
    )
    results = []
    for size in sizes:
        print(f"== {size:,} samples", flush=True)
        if args.db == "sqlite":
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "scale.db"
                results.append(await one_size(f"sqlite+aiosqlite:///{path}", size, args, sqlite_path=path))
        else:
            url, drop = await postgres_scratch(args.postgres_url)
            try:
                results.append(await one_size(url, size, args))
            finally:
                if args.keep:
                    print(f"   kept: {url}")
                else:
                    await drop()
        report(sizes[: len(results)], results)  # each size's figures as soon as they are measured
    print(f"\n{time.perf_counter() - began:.0f} s; load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
