"""What the cost features cost: the projection's cron counting (every `check-config`, and every load of a
config with a budget) and the two database reads, the run-time budget check after each stored batch (the
last hour's spend) and check-config's history (7 days of tokens per probe), on a realistic history.

Writes --samples samples (default 300,000) on SQLite through `Repository.save_runs`: --series series
probed every 5 minutes (1 warm-up + 5 rounds), so with the defaults 100 series span about 41 hours. Prints
medians of --repeat reads, and the load average it ran under.

    .venv/bin/python bench/cost.py [--samples 300000] [--series 100] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from monitor.config.cost import runs_per_day
from monitor.probe.result import Sample
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.records import runs_from_samples
from monitor.store.repository import Repository

SCHEDULES = (
    ("*/5 * * * *", "UTC"),
    ("*/10 * * * * *", "UTC"),
    ("0 9-17 * * 1-5", "Europe/Berlin"),
    ("0 0 1 * *", "UTC"),
)
ROUNDS, WARMUP, EVERY = 5, 1, timedelta(minutes=5)


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def time_cron(repeat: int) -> None:
    print("runs_per_day (uncached), median of", repeat)
    for schedule, zone in SCHEDULES:
        durations = []
        for _ in range(repeat):
            runs_per_day.cache_clear()
            started = time.perf_counter()
            per_day = runs_per_day(schedule, zone)
            durations.append(time.perf_counter() - started)
        print(f"  {schedule!r:>18} {zone:<14} {per_day:10.4g} runs/day  {median_ms(durations):7.2f} ms")


def tick(series: int, at: datetime) -> list[Sample]:
    return [
        Sample(
            target=f"model-{s:03d}",
            model=f"org/model-{s:03d}",
            api="openai-chat",
            prompt="short",
            round=index + 1,
            warmup=index < WARMUP,
            intended_at=at,
            sent_at=at + timedelta(seconds=index),
            ttft_ms=200.0,
            token_events=64,
            prompt_tokens=512,
            cached_tokens=0,
            completion_tokens=64,
            reasoning_tokens=40,
            reasoning_tokens_estimated=True,
            http_status=200,
        )
        for s in range(series)
        for index in range(WARMUP + ROUNDS)
    ]


async def time_reads(samples: int, series: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite+aiosqlite:///{Path(folder) / 'bench.db'}"
        await migrate.upgrade(url)
        engine = create_engine(url)
        try:
            repository = Repository(engine)
            ticks = max(1, samples // (series * (WARMUP + ROUNDS)))
            now = datetime.now(UTC).replace(microsecond=0)
            started = time.perf_counter()
            for index in range(ticks):
                at = now - EVERY * (ticks - index)
                batch = runs_from_samples(
                    tick(series, at),
                    job="ttft",
                    location="lab",
                    provider_of={f"model-{s:03d}": "p" for s in range(series)},
                )
                await repository.save_runs(batch)
            insert_s = time.perf_counter() - started
            stored = ticks * series * (WARMUP + ROUNDS)
            print(f"history: {stored:,} samples, {series} series, {ticks} runs each ({insert_s:.0f} s to write)")
            for name, call in (
                (
                    "tokens_spent, last hour (run-time budget check)",
                    lambda: repository.tokens_spent("lab", now - timedelta(hours=1)),
                ),
                (
                    "tokens_seen, 7 days (check-config history)",
                    lambda: repository.tokens_seen("lab", now - timedelta(days=7)),
                ),
            ):
                durations = []
                for _ in range(repeat):
                    begun = time.perf_counter()
                    await call()
                    durations.append(time.perf_counter() - begun)
                print(f"  {name:<50} median {median_ms(durations):8.2f} ms")
        finally:
            await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300_000)
    parser.add_argument("--series", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=20)
    options = parser.parse_args()
    print("load average at start:", Path("/proc/loadavg").read_text().split()[:3])
    time_cron(options.repeat)
    asyncio.run(time_reads(options.samples, options.series, options.repeat))
    print("load average at end:", Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
