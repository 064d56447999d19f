"""Detection's cost per run at steady state: every series with a week and a day of 5-minute history.

Each evaluation needs what the detector reads of the series' last 8 days (about 2,400 runs). This fills a
database once with `--days` of runs of `--series` series (as `save_runs` stores them, samples included),
then, for each variant in turn (`--repeat` rounds), evaluates `--ticks` more ticks of every series through
the real `DetectionService` in a process of its own, on a copy of that database:

- `kept`: this checkout, each series' history kept between evaluations (`detection.history_memory_mb` at
  its default), so an evaluation reads only the runs stored since the last;
- `afresh`: this checkout with `history_memory_mb: 0` (every evaluation reads its whole history);
- `before`: the checkout given by `--against` (e.g. the commit before the history was kept), as it is.

Prints per variant the median CPU and wall time per evaluated run (ticks after the first, which reads every
history whole in every variant), and the memory the kept histories take.

    .venv/bin/python bench/detect_steady.py [--series 40] [--days 8.2] [--ticks 8] [--repeat 3] \\
        [--against /path/to/older/checkout] [--postgres URL]

With `--postgres URL` the same on PostgreSQL (databases `ttft_bench_steady*` are made there and dropped at
the end); else on SQLite in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A child measures the checkout it is given; the parent fills with this one.
sys.path.insert(0, os.environ.get("BENCH_CHECKOUT", str(ROOT)))

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


def targets_of(series: int) -> tuple[str, ...]:
    return tuple(f"t{i:03d}" for i in range(max(1, series // len(PROMPTS))))


async def _admin(url: str, statement: str) -> None:
    import asyncpg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def _database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def fill(url: str, series: int, days: float) -> int:
    engine = create_engine(url)
    try:
        await migrate.upgrade(engine)
        repository = Repository(engine)
        targets = targets_of(series)
        ticks = int(days * RUNS_PER_DAY)
        started = time.perf_counter()
        chunk: list = []
        for index in range(ticks):
            chunk += tick(index, targets)
            if len(chunk) >= 2000:
                await repository.save_runs(chunk)
                chunk = []
        if chunk:
            await repository.save_runs(chunk)
        print(
            f"{engine.dialect.name}: {ticks} ticks x {len(targets) * len(PROMPTS)} series filled in "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        return ticks
    finally:
        await engine.dispose()


async def child(url: str, first: int, ticks: int, series: int, memory_mb: float | None) -> dict[str, float]:
    """Evaluate `ticks` ticks from `first` on; CPU and wall per evaluated run (medians), memory kept."""
    detection = {} if memory_mb is None else {"history_memory_mb": memory_mb}
    engine = create_engine(url)
    try:
        repository = Repository(engine)
        service = DetectionService(
            engine, repository, Config.model_validate({"detection": detection}), outbox=None, metrics=None
        )
        targets = targets_of(series)
        cpu, wall = [], []
        for index in range(first, first + ticks):
            batch = tick(index, targets)
            await repository.save_runs(batch)
            started, used = time.perf_counter(), time.process_time()
            await service.after_store("every-5m", batch)
            if index > first:  # the first tick reads every history whole, in every variant
                cpu.append((time.process_time() - used) / len(batch))
                wall.append((time.perf_counter() - started) / len(batch))
        kept = getattr(service, "_histories", None)
        return {
            "cpu_ms": statistics.median(cpu) * 1e3,
            "wall_ms": statistics.median(wall) * 1e3,
            "kept_mb": kept.nbytes() / 1e6 if kept is not None else 0.0,
            "kept_series": float(len(kept)) if kept is not None else 0.0,
        }
    finally:
        await engine.dispose()


async def copy_of(args: argparse.Namespace, source: str, folder: Path, name: str) -> str:
    if args.postgres:
        await _admin(args.postgres, f"DROP DATABASE IF EXISTS {name}")
        await _admin(args.postgres, f"CREATE DATABASE {name} TEMPLATE ttft_bench_steady")
        return _database(args.postgres, name)
    shutil.copy(folder / "steady.db", folder / f"{name}.db")
    return f"sqlite+aiosqlite:///{folder / name}.db"


async def main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ttft-steady-"))
    if args.postgres:
        await _admin(args.postgres, "DROP DATABASE IF EXISTS ttft_bench_steady")
        await _admin(args.postgres, "CREATE DATABASE ttft_bench_steady")
        source = _database(args.postgres, "ttft_bench_steady")
    else:
        source = f"sqlite+aiosqlite:///{folder / 'steady.db'}"
    variants: dict[str, tuple[Path, str]] = {"kept": (ROOT, "default"), "afresh": (ROOT, "0")}
    if args.against:
        variants["before"] = (Path(args.against).absolute(), "as-is")  # noqa: ASYNC240
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    try:
        first = await fill(source, args.series, args.days)
        for round_ in range(args.repeat):
            for name, (checkout, memory) in variants.items():
                url = await copy_of(args, source, folder, f"ttft_bench_steady_{name}")
                command = [sys.executable, __file__, "--child", url, "--first", str(first)]
                command += ["--ticks", str(args.ticks), "--series", str(args.series), "--memory", memory]
                env = {**os.environ, "BENCH_CHECKOUT": str(checkout), "PYTHONPATH": str(checkout)}
                # One variant at a time, on purpose: the bench waits for each.
                done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)  # noqa: ASYNC221
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if done.returncode or not lines:
                    raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
                results[name].append(json.loads(lines[-1][len("RESULT ") :]))
                print(f"round {round_ + 1} {name}: {results[name][-1]}", flush=True)
    finally:
        if args.postgres:
            for name in [*variants, ""]:
                await _admin(args.postgres, f"DROP DATABASE IF EXISTS ttft_bench_steady{'_' + name if name else ''}")
        shutil.rmtree(folder, ignore_errors=True)
    series = len(targets_of(args.series)) * len(PROMPTS)
    print(f"\nper evaluated run, median over {args.repeat} rounds of {args.ticks - 1} ticks x {series} series:")
    medians = {name: statistics.median(r["cpu_ms"] for r in rows) for name, rows in results.items()}
    for name, rows in results.items():
        wall = statistics.median(r["wall_ms"] for r in rows)
        kept = rows[-1]
        print(
            f"  {name:7s} CPU {medians[name]:6.2f} ms  wall {wall:6.2f} ms  "
            f"kept {kept['kept_series']:.0f} series, {kept['kept_mb']:.2f} MB"
        )
    for name in medians:
        if name != "kept":
            print(f"  CPU {name} / kept: {medians[name] / medians['kept']:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=40)
    parser.add_argument("--days", type=float, default=8.2, help="days of 5-minute history filled first")
    parser.add_argument("--ticks", type=int, default=8, help="ticks evaluated after the fill")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every variant in turn")
    parser.add_argument("--against", help="an older checkout, measured as it is (variant `before`)")
    parser.add_argument("--postgres", help="a PostgreSQL URL to run on instead of SQLite")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--memory", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.child:
        memory = None if parsed.memory in ("default", "as-is") else float(parsed.memory)
        out = asyncio.run(child(parsed.child, parsed.first, parsed.ticks, parsed.series, memory))
        print("RESULT " + json.dumps(out))
    else:
        asyncio.run(main(parsed))
