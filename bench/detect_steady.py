"""Detection's cost per run at steady state: every series with a week and a day of 5-minute history.

Each evaluation reads what the detector needs of the series' last 8 days (about 2,400 runs). This fills a
database with `--days` of runs of `--series` series (runs only, as `save_runs` stores them, samples
included), then evaluates `--ticks` more ticks of every series through the real `DetectionService`, twice
in one process, taking turns tick by tick: with each series' history kept between evaluations
(`detection.history_memory_mb` at its default) and read afresh every run (`history_memory_mb: 0`, as
before the history was kept). Prints per mode the median CPU and wall time per evaluated run (ticks after
the first, which reads every history whole), and the memory the kept histories take.

    .venv/bin/python bench/detect_steady.py [--series 40] [--days 8.2] [--ticks 8] [--postgres URL]

With `--postgres URL` (a database the bench may fill: it creates its own schema there in a new database
`ttft_bench_steady`, dropped at the end) the same on PostgreSQL; else on SQLite in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy.engine import make_url  # noqa: E402

from monitor.config.models import Config  # noqa: E402
from monitor.detect.service import DetectionService  # noqa: E402
from monitor.store import migrate  # noqa: E402
from monitor.store.engine import create_engine  # noqa: E402
from monitor.store.records import runs_from_samples  # noqa: E402
from monitor.store.repository import Repository  # noqa: E402
from tests.support.store_fixtures import T0, make_samples  # noqa: E402

RUNS_PER_DAY = 288  # 5-minute runs
PROMPTS = ("short", "long")


def tick(index: int, targets: tuple[str, ...]) -> list:
    """One run of every series (the probe's samples: a warm-up and 5 measured), at tick `index`."""
    at = T0 + timedelta(minutes=5 * index)
    samples = [s for target in targets for prompt in PROMPTS for s in make_samples(target, prompt, at=at)]
    return runs_from_samples(samples, job="every-5m", location="lab", provider_of=dict.fromkeys(targets, "gateway"))


def _config(memory_mb: float | None) -> Config:
    detection = {} if memory_mb is None else {"history_memory_mb": memory_mb}
    return Config.model_validate({"detection": detection})


async def _admin(url: str, statement: str) -> None:
    import asyncpg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def main(args: argparse.Namespace) -> None:
    targets = tuple(f"t{i:03d}" for i in range(max(1, args.series // 2)))  # two prompts each
    folder = Path(tempfile.mkdtemp(prefix="ttft-steady-"))
    if args.postgres:
        await _admin(args.postgres, "DROP DATABASE IF EXISTS ttft_bench_steady")
        await _admin(args.postgres, "CREATE DATABASE ttft_bench_steady")
        url = make_url(args.postgres).set(database="ttft_bench_steady").render_as_string(hide_password=False)
    else:
        url = f"sqlite+aiosqlite:///{folder / 'steady.db'}"
    engine = create_engine(url)
    try:
        await migrate.upgrade(engine)
        repository = Repository(engine)
        fill = int(args.days * RUNS_PER_DAY)
        started = time.perf_counter()
        chunk: list = []
        for index in range(fill):
            chunk += tick(index, targets)
            if len(chunk) >= 2000:
                await repository.save_runs(chunk)
                chunk = []
        if chunk:
            await repository.save_runs(chunk)
        print(
            f"{engine.dialect.name}: {fill} ticks x {len(targets) * 2} series filled in "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        services = {
            "history kept": DetectionService(engine, repository, _config(None), outbox=None, metrics=None),
            "read afresh": DetectionService(engine, repository, _config(0.0), outbox=None, metrics=None),
        }
        cpu: dict[str, list[float]] = {name: [] for name in services}
        wall: dict[str, list[float]] = {name: [] for name in services}
        for index in range(fill, fill + args.ticks):
            batch = tick(index, targets)
            await repository.save_runs(batch)
            for name, service in services.items():
                started, used = time.perf_counter(), time.process_time()
                await service.after_store("every-5m", batch)
                if index > fill:  # the first tick reads every history whole, in both modes
                    cpu[name].append((time.process_time() - used) / len(batch))
                    wall[name].append((time.perf_counter() - started) / len(batch))
        print(f"per evaluated run, median of {args.ticks - 1} ticks x {len(targets) * 2} series:")
        for name in services:
            print(
                f"  {name:13s} CPU {statistics.median(cpu[name]) * 1e3:6.2f} ms   "
                f"wall {statistics.median(wall[name]) * 1e3:6.2f} ms"
            )
        ratio = statistics.median(cpu["read afresh"]) / statistics.median(cpu["history kept"])
        kept = services["history kept"]._histories
        print(f"  CPU ratio afresh / kept: {ratio:.1f}x")
        print(
            f"  histories kept: {len(kept)} series, {kept.nbytes() / 1e6:.2f} MB "
            f"({kept.nbytes() / max(1, len(kept)) / 1e3:.1f} kB a series)"
        )
    finally:
        await engine.dispose()
        if args.postgres:
            await _admin(args.postgres, "DROP DATABASE IF EXISTS ttft_bench_steady")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=40)
    parser.add_argument("--days", type=float, default=8.2, help="days of 5-minute history filled first")
    parser.add_argument("--ticks", type=int, default=8, help="ticks evaluated after the fill")
    parser.add_argument("--postgres", help="a PostgreSQL URL to run on instead of SQLite")
    asyncio.run(main(parser.parse_args()))
