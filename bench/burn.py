"""What one SLO burn-rate evaluation costs the daemon: the windows counted in SQL over a target's
stored probes, then the incident read and written (monitor/detect/burn_service.py).

    .venv/bin/python bench/burn.py [--days 3] [--interval-min 5] [--rounds 5] [--prompts 2] [--url URL]

Fills a fresh database (SQLite in a temporary folder, or an empty database at --url, migrated here)
with `days` of runs of one target with an objective and one without, then times `BurnService.evaluate`
at the end of the history: median and p95 of 30 calls.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config.models import Config
from monitor.detect.burn_service import BurnService
from monitor.probe.result import Sample
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.records import runs_from_samples
from monitor.store.repository import Repository


def samples(target: str, prompt: str, at: datetime, rounds: int, index: int) -> list[Sample]:
    return [
        Sample(
            target=target,
            model=target,
            api="openai-chat",
            prompt=prompt,
            round=r + 1,
            warmup=False,
            intended_at=at,
            sent_at=at + timedelta(seconds=r),
            ttft_ms=900.0 if (index * 7 + r) % 50 == 0 else 250.0,
        )
        for r in range(rounds)
    ]


async def main(args: argparse.Namespace) -> None:
    folder = tempfile.mkdtemp(prefix="burn-bench-")
    url = args.url or f"sqlite+aiosqlite:///{folder}/bench.db"
    engine = create_engine(url)
    await migrate.upgrade(engine)
    repository = Repository(engine)
    end = datetime(2026, 3, 2, tzinfo=UTC)
    ticks = int(args.days * 1440 / args.interval_min)
    start = end - timedelta(minutes=args.interval_min * ticks)
    prompts = [f"p{i}" for i in range(args.prompts)]
    began = time.perf_counter()
    for i in range(ticks):
        at = start + timedelta(minutes=args.interval_min * i)
        batch = [s for t in ("slo-target", "other") for p in prompts for s in samples(t, p, at, args.rounds, i)]
        runs = runs_from_samples(batch, job="j", location="lab", provider_of={"slo-target": "p", "other": "p"})
        await repository.save_runs(runs)
    filled = time.perf_counter() - began
    config = Config.model_validate(
        {
            "providers": {"p": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"slo-target": {"provider": "p", "model": "slo-target", "slo": {"ttft_ms": 800}}},
        }
    )
    service = BurnService(engine, config, outbox=None)
    policy = service.policy("slo-target")
    assert policy is not None
    series = runs[0][0].series
    took = []
    for _ in range(30):
        t0 = time.perf_counter()
        found = await service.evaluate("j", series, end, policy)
        took.append((time.perf_counter() - t0) * 1000)
    await engine.dispose()
    took.sort()
    p95 = took[int(len(took) * 0.95) - 1]
    probes = ticks * args.rounds * args.prompts
    print(
        f"{engine.dialect.name}: {probes} probes of the target in {args.days:g} d ({ticks} ticks, filled in "
        f"{filled:.0f} s); evaluate p50 {statistics.median(took):.1f} ms, p95 {p95:.1f} ms; "
        f"verdict {found.severity}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=3)
    parser.add_argument("--interval-min", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--url", help="an empty database to fill (default: SQLite in a temporary folder)")
    asyncio.run(main(parser.parse_args()))
