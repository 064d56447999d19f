"""Storage at scale: insert rate, size, and the two hot reads with a realistic history.

Writes N samples (default 1,000,000) over 500 series through `Repository.save_runs` - the path the
daemon uses, one transaction per job tick of 500 runs (3,000 samples) - then times the detector's
window query ("the last 50 runs of a series") and the report query ("hourly percentiles for a
series over 7 days") on random series. Each run is 1 warm-up + 5 measured samples, every 30 minutes,
so a series' history spans about a week at 1M samples.

    .venv/bin/python bench/storage.py [--db sqlite|postgres|both] [--samples 1000000] [--series 500]

PostgreSQL: a scratch database is created on the server named by --postgres-url (default
$TTFT_TEST_POSTGRES_URL, else postgresql+asyncpg://postgres@127.0.0.1:5432/test) and dropped after.
SQLite: a file in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa

from monitor.probe.result import ErrorClass, Sample
from monitor.quantile import quantile
from monitor.store import migrate
from monitor.store.engine import create_engine, display_url
from monitor.store.records import SeriesKey, runs_from_samples
from monitor.store.repository import Repository

ROUNDS, WARMUP = 5, 1
INTERVAL = timedelta(minutes=30)
PROMPTS = {"short": 512, "long": 8192}
LOCATIONS = ("fra", "iad")
ERRORS = (ErrorClass.TIMEOUT_FIRST_TOKEN, ErrorClass.SERVER_ERROR, ErrorClass.RATE_LIMITED)


@dataclass(frozen=True)
class Series:
    key: SeriesKey
    base_ms: float  # median TTFT
    sigma: float


def make_series(count: int, rng: random.Random) -> list[Series]:
    targets = max(1, count // (len(PROMPTS) * len(LOCATIONS)))
    out = []
    for t in range(targets):
        for prompt, tokens in PROMPTS.items():
            for location in LOCATIONS:
                key = SeriesKey(f"model-{t:03d}", f"provider-{t % 7}", f"org/Model-{t:03d}-Instruct", prompt, location)
                base = rng.uniform(80, 400) + tokens * rng.uniform(0.01, 0.05)
                out.append(Series(key, base, rng.choice((0.1, 0.2, 0.3))))
    return out[:count]


def tick_samples(series: list[Series], at: datetime, rng: random.Random) -> list[Sample]:
    samples = []
    for one in series:
        key = one.key
        connect = rng.uniform(1, 40)
        for index in range(WARMUP + ROUNDS):
            ttft = one.base_ms * rng.lognormvariate(0, one.sigma)
            failed = rng.random() < 0.02
            error = rng.choice(ERRORS) if failed else None
            sent = at + timedelta(seconds=rng.uniform(0, 5) + index * 1.0)
            samples.append(
                Sample(
                    target=key.target,
                    model=key.model,
                    api="openai-chat",
                    prompt=key.prompt,
                    round=index + 1,
                    warmup=index < WARMUP,
                    intended_at=at,
                    sent_at=sent,
                    dns_ms=rng.uniform(0.3, 5) if index == 0 else None,
                    connect_ms=connect if index == 0 else None,
                    tls_ms=connect * 2 if index == 0 else None,
                    connection_reused=index > 0,
                    setup_ms=rng.uniform(0.05, 2),
                    ttfb_ms=None if failed else ttft * 0.3,
                    first_event_ms=None if failed else ttft * 0.9,
                    ttft_ms=None if failed else ttft,
                    ttfa_ms=None if failed else ttft * 1.1,
                    total_ms=None if failed else ttft + rng.uniform(500, 1500),
                    gap_p50_ms=None if failed else rng.uniform(8, 25),
                    gap_p95_ms=None if failed else rng.uniform(25, 60),
                    gap_max_ms=None if failed else rng.uniform(60, 200),
                    decode_tps=None if failed else rng.uniform(30, 120),
                    token_events=0 if failed else 64,
                    prompt_tokens=None if failed else PROMPTS[key.prompt] + rng.randrange(0, 12),
                    completion_tokens=None if failed else 64,
                    cached_tokens=None if failed else 0,
                    prompt_tokens_target=PROMPTS[key.prompt],
                    prompt_chars=PROMPTS[key.prompt] * 4,
                    served_model=key.model,
                    request_id=f"chatcmpl-{uuid.UUID(int=rng.getrandbits(128)).hex}",
                    http_status=503 if error is ErrorClass.SERVER_ERROR else (429 if error else 200),
                    error=error,
                    error_message=f"HTTP error: {error.value}" if error else None,
                )
            )
    return samples


async def write_ticks(
    repository: Repository,
    series: list[Series],
    *,
    ticks: int,
    start: datetime,
    interval: timedelta,
    rng: random.Random,
) -> float:
    """Write `ticks` job ticks of every series through `save_runs`, one transaction per tick as the
    daemon's job does, printing progress five times; returns the seconds spent in `save_runs`."""
    provider_of = {one.key.target: one.key.provider for one in series}
    by_location: dict[str, list[Series]] = {}
    for one in series:
        by_location.setdefault(one.key.location, []).append(one)
    per_tick = len(series) * (ROUNDS + WARMUP)
    insert_s = 0.0
    for tick in range(ticks):
        at = start + tick * interval
        batch = []
        for location, members in by_location.items():
            batch += runs_from_samples(
                tick_samples(members, at, rng), job="bench", location=location, provider_of=provider_of
            )
        began = time.perf_counter()
        await repository.save_runs(batch)
        insert_s += time.perf_counter() - began
        if (tick + 1) % max(1, ticks // 5) == 0:
            print(f"   {(tick + 1) * per_tick:>12,} samples written", flush=True)
    return insert_s


def timings(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"p50 {quantile(ms, 0.5, presorted=True):7.2f} ms   p95 {quantile(ms, 0.95, presorted=True):7.2f} ms"


async def time_queries(calls: list[Callable[[], Awaitable[Any]]]) -> list[float]:
    durations = []
    for call in calls:
        started = time.perf_counter()
        await call()
        durations.append(time.perf_counter() - started)
    return durations


async def server_process(engine: Any, backend: str) -> int | None:
    """The PostgreSQL backend serving the bench's one pooled connection, when it runs on this host."""
    if backend != "postgres":
        return None
    async with engine.connect() as connection:
        pid = int(await connection.scalar(sa.text("SELECT pg_backend_pid()")))
    return pid if is_local_process(pid) else None


def is_local_process(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").exists()


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) of process `pid` so far; 0 when unknown."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def database_size(engine: Any, backend: str, path: Path | None) -> int:
    if backend == "sqlite":
        assert path is not None
        async with engine.connect() as connection:
            await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    async with engine.connect() as connection:
        total = 0
        for table in ("series", "runs", "samples", "rollup_pending"):
            # A partitioned table (runs, samples: migration 0017) is the sum of its partitions.
            total += await connection.scalar(
                sa.text(
                    f"SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('{table}')), "
                    f"pg_total_relation_size('{table}'))"
                )
            )
        return int(total)


async def bench(backend: str, url: str, args: argparse.Namespace, sqlite_path: Path | None) -> None:
    rng = random.Random(args.seed)
    await migrate.upgrade(url)
    # One connection, so the server's CPU time can be read from its one backend process.
    engine = create_engine(url, pool_size=1, max_overflow=0) if backend == "postgres" else create_engine(url)
    repository = Repository(engine)
    series = make_series(args.series, rng)
    per_tick = len(series) * (ROUNDS + WARMUP)
    ticks = max(1, args.samples // per_tick)
    # The history ends now, so that on PostgreSQL it lands in day partitions as the daemon's does
    # (housekeeping makes them; here, every day of the history, before it is written).
    start = (datetime.now(UTC) - ticks * INTERVAL).replace(minute=0, second=0, microsecond=0)
    for day in range((ticks * INTERVAL).days + 2):
        await repository.ensure_partitions(start + timedelta(days=day))
    print(f"\n== {backend}: {display_url(url)}")
    print(f"   {ticks} job ticks x {len(series)} series x {ROUNDS + WARMUP} samples = {ticks * per_tick:,} samples")
    provider_of = {one.key.target: one.key.provider for one in series}
    by_location: dict[str, list[Series]] = {}
    for one in series:
        by_location.setdefault(one.key.location, []).append(one)
    insert_s = client_cpu_s = 0.0
    server = await server_process(engine, backend)
    server_cpu_began = cpu_seconds(server)
    generate_s = 0.0
    inserted = 0
    for tick in range(ticks):
        began = time.perf_counter()
        at = start + tick * INTERVAL
        batch = []
        for location, members in by_location.items():
            samples = tick_samples(members, at, rng)
            batch += runs_from_samples(samples, job="bench", location=location, provider_of=provider_of)
        generate_s += time.perf_counter() - began
        began, cpu_began = time.perf_counter(), time.process_time()
        await repository.save_runs(batch)
        insert_s += time.perf_counter() - began
        client_cpu_s += time.process_time() - cpu_began
        inserted += per_tick
        if (tick + 1) % max(1, ticks // 10) == 0:
            print(f"   {inserted:>10,} samples  {inserted / insert_s:>9,.0f} samples/s so far", flush=True)
    server_cpu_s = cpu_seconds(server) - server_cpu_began
    size = await database_size(engine, backend, sqlite_path)
    if backend == "postgres":
        async with engine.connect() as connection:
            await connection.exec_driver_sql("ANALYZE")  # as autovacuum would, soon after a bulk load
            await connection.commit()
    async with engine.connect() as connection:
        runs = await connection.scalar(sa.text("SELECT count(*) FROM runs"))
        stored = await connection.scalar(sa.text("SELECT count(*) FROM samples"))
    end = start + ticks * INTERVAL
    picks = [rng.choice(series).key for _ in range(args.queries)]
    window = await time_queries([functools.partial(repository.last_runs, key, 50) for key in picks])
    hourly = await time_queries(
        [functools.partial(repository.hourly_percentiles, key, end - timedelta(days=7), end) for key in picks]
    )
    sample_hours = await repository.hourly_percentiles(picks[0], end - timedelta(days=7), end)
    began = time.perf_counter()
    rolled_up = await repository.rollup(end + timedelta(hours=1))
    rollup_s = time.perf_counter() - began
    from_rollups = await time_queries(
        [functools.partial(repository.rollups_between, key, end - timedelta(days=7), end) for key in picks]
    )
    await engine.dispose()

    print(f"   stored: {stored:,} samples, {runs:,} runs, {len(series)} series, history {ticks * INTERVAL}")
    print(
        f"   insert:  {inserted / insert_s:,.0f} samples/s  ({insert_s:.1f} s in save_runs; "
        f"{generate_s:.1f} s generating, not counted)"
    )
    if server is not None:
        cpu_per_sample = (client_cpu_s + server_cpu_s) / inserted
        print(
            f"   cpu:     {client_cpu_s / inserted * 1e6:.1f} us client + {server_cpu_s / inserted * 1e6:.1f} us "
            f"server per sample = {1 / cpu_per_sample:,.0f} samples/s on an otherwise idle machine"
        )
    else:
        print(
            f"   cpu:     {client_cpu_s / inserted * 1e6:.1f} us per sample (SQLite works in this process) = "
            f"{inserted / client_cpu_s:,.0f} samples/s on an otherwise idle machine"
        )
    print(
        f"   size:    {size / 1e6:,.1f} MB total, {size / stored * 1e6 / 1e6:,.0f} MB per million samples "
        f"({size / stored:,.0f} bytes/sample with indexes)"
    )
    print(f"   last 50 runs of a series        ({args.queries} random series): {timings(window)}")
    print(
        f"   hourly percentiles, 7 days      ({args.queries} random series): {timings(hourly)}  "
        f"[{len(sample_hours)} hours, {sum(h.samples for h in sample_hours)} samples each]"
    )
    print(
        f"   rollup of every hour: {rolled_up:,} series-hours in {rollup_s:.1f} s "
        f"({rolled_up / rollup_s:,.0f} series-hours/s)"
    )
    print(f"   hourly rollups, 7 days          ({args.queries} random series): {timings(from_rollups)}")


def default_postgres_url() -> str:
    """Where the benchmarks make their scratch databases: the tests' server, else the local one."""
    return os.environ.get("TTFT_TEST_POSTGRES_URL") or "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


async def postgres_scratch(admin_url: str) -> tuple[str, Callable[[], Awaitable[None]]]:
    name = f"ttft_bench_{uuid.uuid4().hex[:8]}"
    dsn = sa.make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()

    async def drop() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await connection.close()

    return sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False), drop


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--queries", type=int, default=200, help="timed calls of each read query")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL database (its URL is printed)")
    parser.add_argument("--postgres-url", default=default_postgres_url())
    args = parser.parse_args()
    print(
        f"ttft-monitor storage benchmark  python {platform.python_version()}  SQLAlchemy {version('sqlalchemy')}  "
        f"asyncpg {version('asyncpg')}  aiosqlite {version('aiosqlite')}  sqlite {sqlite3.sqlite_version}  "
        f"{os.cpu_count()} CPUs"
    )
    if args.db in ("sqlite", "both"):
        with tempfile.TemporaryDirectory(prefix="ttft-bench-") as directory:
            path = Path(directory) / "bench.db"
            await bench("sqlite", f"sqlite+aiosqlite:///{path}", args, path)
    if args.db in ("postgres", "both"):
        url, drop = await postgres_scratch(args.postgres_url)
        try:
            engine = create_engine(url)
            async with engine.connect() as connection:
                server = await connection.scalar(sa.text("SHOW server_version"))
            await engine.dispose()
            print(f"\nPostgreSQL {server}")
            await bench("postgres", url, args, None)
        finally:
            if args.keep:
                print(f"kept: {display_url(url)}")
            else:
                await drop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
