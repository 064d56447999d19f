"""What `ttft-monitor replay` costs: a year of one series' 5-minute runs fed through `Replayer.feed`.

The series is seeded (the shape of tests/support/series.py `make_series`, generated here so another
checkout needs only its `monitor` package): a daily cycle, lognormal probes with half their variance an
AR(1) load, 2% spikes, 0.5% failed runs, a 3-hour +70% and a 2-day +20% step, an hour of failures and
a served-model change. Each checkout replays it in a child process of its own (`PYTHONPATH=CHECKOUT`),
the checkouts taking turns, with the rules the config gives with the noise model off and on
(`Detection(noise_model=...).rules()`; on is the default since 2026-12-06), or one of them
(`--noise-model off|on`). Prints the median of `--repeat` replays' CPU time
(`time.process_time`, the feed loop alone) and runs/s, and checks that every checkout raised the same
events (a digest of them) and ended in the same state.

    .venv/bin/python bench/replay.py [--days 365] [--repeat 3] [--noise-model off|on|both]
        [--against ../main ...] [--command]

`--command` times the whole `ttft-monitor replay --samples FILE.csv` instead (start-up, reading the CSV,
the replay, the output; user + system CPU of the process): the same series written as a samples CSV,
one row per probe, a run_id per run (a CSV has no served model, so no model change), default rules.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

RUNS_PER_DAY = 288
T0 = datetime(2025, 3, 3, tzinfo=UTC)
EVERY = timedelta(minutes=5)
HERE = Path(__file__).resolve().parent.parent


def make_points(days: float, *, seed: int = 2, probes: int = 3, phi: float = 0.9) -> list[object]:
    """The seeded series (as tests/support/series.py `make_series`, which the golden file uses)."""
    from monitor.detect.detector import RunPoint

    rng = random.Random(seed)
    sigma = 0.3
    load = 0.0
    innovation = math.sqrt(0.5 * (1 - phi * phi)) * sigma
    points: list[object] = []
    for i in range(round(days * RUNS_PER_DAY)):
        day = i / RUNS_PER_DAY
        load = phi * load + rng.gauss(0, innovation)
        level = 400.0 * (1 + 0.2 * math.sin(2 * math.pi * day)) * math.exp(load)
        if 9.0 <= day < 9.125:
            level *= 1.7
        if 12.0 <= day < 14.0:
            level *= 1.2
        at = T0 + i * EVERY
        model = "m-1" if day < 15.5 else "m-2"
        if 16.0 <= day < 16.04 or rng.random() < 0.005:
            points.append(RunPoint(at, None, error="timeout", served_model=model, ok=0, errors=probes))
            continue
        values = sorted(
            level * math.exp(rng.gauss(0, sigma * math.sqrt(0.5))) * (rng.uniform(3, 10) if rng.random() < 0.02 else 1)
            for _ in range(probes)
        )
        points.append(RunPoint(at, values[len(values) // 2], served_model=model, ok=probes, errors=0))
    return points


def write_samples_csv(path: Path, days: float, *, seed: int = 2, probes: int = 3, phi: float = 0.9) -> int:
    """make_points's series as a samples CSV, each probe a row (the same draws); returns the rows written."""
    rng = random.Random(seed)
    sigma = 0.3
    load = 0.0
    innovation = math.sqrt(0.5 * (1 - phi * phi)) * sigma
    rows = 0
    with path.open("w", newline="", encoding="utf-8") as stream:
        out = csv.writer(stream)
        out.writerow(["timestamp", "series", "ttft_ms", "error", "run_id"])
        for i in range(round(days * RUNS_PER_DAY)):
            day = i / RUNS_PER_DAY
            load = phi * load + rng.gauss(0, innovation)
            level = 400.0 * (1 + 0.2 * math.sin(2 * math.pi * day)) * math.exp(load)
            if 9.0 <= day < 9.125:
                level *= 1.7
            if 12.0 <= day < 14.0:
                level *= 1.2
            at = (T0 + i * EVERY).isoformat().replace("+00:00", "Z")
            failed = 16.0 <= day < 16.04 or rng.random() < 0.005
            for _ in range(probes):
                if failed:
                    out.writerow([at, "s1", "", "timeout", f"r{i}"])
                    continue
                value = level * math.exp(rng.gauss(0, sigma * math.sqrt(0.5)))
                value *= rng.uniform(3, 10) if rng.random() < 0.02 else 1
                out.writerow([at, "s1", f"{value:.1f}", "", f"r{i}"])
            rows += probes
    return rows


def measure_command(checkout: Path, samples: Path) -> float:
    """User + system CPU seconds of one `python -m monitor replay --samples` with `checkout` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--samples", str(samples)],
        env=env,
        check=True,
        capture_output=True,
        cwd=checkout,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_command(checkouts: list[Path], days: float, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        samples = Path(folder) / "samples.csv"
        rows = write_samples_csv(samples, days)
        print(f"`ttft-monitor replay --samples` of {rows:,} rows, user+sys CPU, median of {repeat}")
        for checkout in checkouts:  # compiles each checkout's bytecode, uncounted
            measure_command(checkout, samples)
        results: dict[Path, list[float]] = {checkout: [] for checkout in checkouts}
        for _ in range(repeat):
            for checkout in checkouts:
                results[checkout].append(measure_command(checkout, samples))
        for checkout, cpu in results.items():
            spread = ", ".join(f"{c:.2f}" for c in cpu)
            print(f"  {checkout!s:<24} {statistics.median(cpu):6.2f} s CPU  ({spread})")


def child(days: float, noise_model: bool) -> None:
    """One replay in this process; prints a JSON line: CPU and wall seconds, runs, and the results' digest."""
    from monitor.detect.detector import Detector
    from monitor.detect.settings import Detection

    # Either way as the config gives it (the model on derives its CUSUM threshold), in any checkout.
    rules = Detection(noise_model=noise_model).rules()
    points = make_points(days)
    replayer = Detector(rules).replayer()
    feed = replayer.feed
    events = []
    wall, cpu = time.perf_counter(), time.process_time()
    for point in points:
        events += feed(point)  # type: ignore[arg-type]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    digest = hashlib.sha256(
        json.dumps(
            {"events": [asdict(e) for e in events], "state": replayer.state.to_json()},
            default=lambda value: value.isoformat(),
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    print(json.dumps({"cpu": cpu, "wall": wall, "runs": len(points), "events": len(events), "digest": digest}))


def measure(checkout: Path, days: float, noise_model: bool) -> dict[str, float | str]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    args = [sys.executable, str(Path(__file__).resolve()), "--child", "--days", str(days)]
    if noise_model:
        args.append("--child-noise-model")
    done = subprocess.run(args, env=env, check=True, capture_output=True, text=True, cwd=checkout)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=365.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--noise-model", choices=("off", "on", "both"), default="both")
    parser.add_argument("--against", type=Path, action="append", default=[], help="another checkout to time")
    parser.add_argument("--command", action="store_true", help="time the whole `replay --samples` command")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-noise-model", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.days, args.child_noise_model)
        return
    checkouts = [HERE, *(path.resolve() for path in args.against)]
    if args.command:
        print(f"load {os.getloadavg()[0]:.2f}")
        bench_command(checkouts, args.days, args.repeat)
        print(f"load {os.getloadavg()[0]:.2f}")
        return
    models = {"off": [False], "on": [True], "both": [False, True]}[args.noise_model]
    print(f"replay of {args.days:g} days of 5-minute runs, median of {args.repeat}; load {os.getloadavg()[0]:.2f}")
    for noise_model in models:
        results: dict[Path, list[dict[str, float | str]]] = {checkout: [] for checkout in checkouts}
        for _ in range(args.repeat):
            for checkout in checkouts:  # taking turns, so a change in the machine's load hits every checkout
                results[checkout].append(measure(checkout, args.days, noise_model))
        digests = {str(r["digest"]) for rows in results.values() for r in rows}
        print(f"noise model {'on' if noise_model else 'off'}: results {'alike' if len(digests) == 1 else 'DIFFER'}")
        for checkout, rows in results.items():
            cpu = statistics.median(float(r["cpu"]) for r in rows)
            runs = int(rows[0]["runs"])
            spread = ", ".join(f"{float(r['cpu']):.2f}" for r in rows)
            print(
                f"  {checkout!s:<24} {cpu:6.2f} s CPU  {runs / cpu:9,.0f} runs/s  ({spread}; "
                f"{runs:,} runs, {rows[0]['events']} events, digest {rows[0]['digest']})"
            )
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
