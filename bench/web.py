"""The status pages' server time with a realistic history: overview, a 30-day series, compare.

Writes N samples (default 1,000,000) over 500 series with bench/storage.py's generator (every 30
minutes, 1 warm-up + 5 measured samples per run, about a week of history), rolls up the hours as
the daemon's housekeeping does, then times the API's query functions (the server's work for a page,
without HTTP):

- overview: every series with status, last-hour p50, baseline, sparkline, availability; cold (every
  call reads the rollups) and with the UI's cache of past hours (what a page reload costs);
- a 30-day series view (hourly rollups; raw samples for the hours not rolled up), with the
  detector's baseline replayed over it;
- 24-hour and 7-day series views (raw samples, bucketed to at most 1,500 points);
- compare over 7 days for three targets x two prompts x two locations (the seeds' table).

    .venv/bin/python bench/web.py [--samples 1000000] [--series 500] [--queries 30] [--against REF]
                                  [--keep | --reuse URL] [--browser]

`--against REF` times monitor/web/queries.py as committed at git REF (e.g. main) beside the working
tree's, call for call alternately on the same data, so both see the same load from other processes.
`--browser` also serves the UI on the data (its clock set to the data's end) and times each page in
headless Chromium (/usr/bin/chromium through Playwright) until every chart and table is drawn.

PostgreSQL only (a scratch database on --postgres-url, default $TTFT_TEST_POSTGRES_URL, dropped after).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
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

ROOT = Path(__file__).resolve().parent.parent


def queries_at(ref: str) -> ModuleType:
    """monitor/web/queries.py as committed at git `ref`, importable beside the working tree's."""
    shown = subprocess.run(
        ["git", "show", f"{ref}:monitor/web/queries.py"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        raise SystemExit(f"error: cannot read monitor/web/queries.py at git ref '{ref}': {shown.stderr.strip()}")
    module = ModuleType(f"queries_at_{ref}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(shown.stdout, f"{ref}:monitor/web/queries.py", "exec"), module.__dict__)
    return module


async def timed(calls: int, make_call: Any, versions: list[ModuleType]) -> list[list[float]]:
    """Per version, the duration of each call; the versions take turns call by call."""
    out: list[list[float]] = [[] for _ in versions]
    for index in range(calls):
        for version, durations in zip(versions, out, strict=True):
            began = time.perf_counter()
            await make_call(version, index)
            durations.append(time.perf_counter() - began)
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
        # As autovacuum leaves a table that has stopped changing (visibility map set, statistics fresh).
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.exec_driver_sql("VACUUM ANALYZE")
        ids = list(await connection.scalars(sa.text("SELECT id FROM series ORDER BY id")))
    targets = sorted({one.key.target for one in series})[:3]
    picks = [rng.choice(ids) for _ in range(args.queries)]
    versions = [queries] + ([queries_at(args.against)] if args.against else [])
    names = ["working tree"] + ([args.against] if args.against else [])
    if args.against:
        await check_same_numbers(engine, versions, now, targets, ids[0])
    month_ago, week_ago, day_ago = now - timedelta(days=30), now - timedelta(days=7), now - timedelta(days=1)
    # Versions with the UI's cache of past hours get one each (as the UI keeps one); older ones have none.
    caches = {id(v): v.OverviewCache() for v in versions if hasattr(v, "OverviewCache")}

    def cached_overview(v: ModuleType, _i: int) -> Any:
        return v.overview(engine, now=now, cache=caches[id(v)]) if id(v) in caches else v.overview(engine, now=now)

    views = {
        f"overview ({len(ids)} series), cold": lambda v, _i: v.overview(engine, now=now),
        f"overview ({len(ids)} series), cached": cached_overview,
        "series, 30 days (hourly)": lambda v, i: v.series_points(engine, picks[i], start=month_ago, end=now),
        "series, 7 days (raw, bucketed)": lambda v, i: v.series_points(engine, picks[i], start=week_ago, end=now),
        "series, 24 hours (raw)": lambda v, i: v.series_points(engine, picks[i], start=day_ago, end=now),
        "compare, 7 days, 3 targets": lambda v, _i: v.compare(engine, start=week_ago, end=now, targets=targets),
    }
    sample = await queries.compare(engine, start=week_ago, end=now, targets=targets)
    print(f"   compare covers {sum(c['n'] for c in sample['cells']):,} samples; load average {load_average()}")
    for label, call in views.items():
        for name, durations in zip(names, await timed(args.queries, call, versions), strict=True):
            print(f"   {label:<38} {name:<14} {timings(durations)}")
    print(f"   load average after: {load_average()}")
    if args.browser:
        await time_pages(engine, now, ids[0], targets, args.queries)


async def time_pages(engine: Any, now: datetime, series_id: int, targets: list[str], visits: int) -> None:
    """Each page in headless Chromium, from navigation until main[data-loaded] (every chart drawn)."""
    from aiohttp import web
    from playwright.async_api import async_playwright

    from monitor.web.api import web_routes

    app = web.Application()
    app.add_routes(web_routes(engine, now=lambda: now))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    compare = "&".join(f"target={t}" for t in targets)
    pages = {
        "overview": "/",
        "series, 24 h": f"/series?id={series_id}",
        "series, 30 d": f"/series?id={series_id}&range=30d",
        "compare, 7 d, 3 targets": f"/compare?since=7d&{compare}",
        "incidents": "/incidents",
    }
    loaded = (
        "window.__loadedMs = undefined; new MutationObserver((_, o) => { if (document.querySelector("
        "\"main[data-loaded='1']\")) { window.__loadedMs = performance.now(); o.disconnect(); } })"
        ".observe(document, {childList: true, subtree: true, attributes: true});"
    )
    try:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"], headless=True
            )
            print(f"   pages in headless Chromium until fully drawn, {visits} visits each; load {load_average()}")
            for name, path in pages.items():
                durations = []
                for _ in range(visits):
                    context = await browser.new_context(viewport={"width": 1360, "height": 900})
                    await context.add_init_script(loaded)
                    page = await context.new_page()
                    await page.goto(base + path)
                    await page.wait_for_selector("main[data-loaded='1']", timeout=30000)
                    durations.append(await page.evaluate("() => window.__loadedMs") / 1000)
                    await context.close()
                print(f"   {name:<38} {'working tree':<14} {timings(durations)}")
            await browser.close()
    finally:
        await runner.cleanup()


def load_average() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


async def check_same_numbers(engine: Any, versions: list[ModuleType], now: datetime, targets: list[str],
                             series_id: int) -> None:  # fmt: skip
    """Both versions should answer alike before their times mean anything; where they differ by design
    (a field added, a baseline now the detector's), the fields that differ are named."""
    week_ago = now - timedelta(days=7)
    for label, call in {
        "overview": lambda v: v.overview(engine, now=now),
        "compare": lambda v: v.compare(engine, start=week_ago, end=now, targets=targets),
        "series": lambda v: v.series_points(engine, series_id, start=now - timedelta(days=30), end=now),
    }.items():
        answers = [await call(version) for version in versions]
        if answers[0] == answers[1]:
            print(f"   {label}: same numbers in both versions")
            continue
        rows = [a if isinstance(a, list) else [*a.get("points", []), a] for a in answers]
        differ = sorted(
            {
                key
                for new, old in zip(*rows, strict=False)
                for key in new.keys() | old.keys()
                if new.get(key) != old.get(key)
            }
        )
        print(f"   {label}: fields that differ between the versions: {', '.join(differ)}")


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
    parser.add_argument("--against", metavar="REF", help="also time monitor/web/queries.py at this git ref")
    parser.add_argument("--keep", action="store_true", help="keep the loaded database (its URL is printed)")
    parser.add_argument("--reuse", metavar="URL", help="time the views on a database kept by --keep (same options)")
    parser.add_argument("--browser", action="store_true", help="also time each page in headless Chromium")
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
