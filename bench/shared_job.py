"""One large job probed by one daemon, then shared by three (`jobs[].shards`), on one PostgreSQL.

Each daemon is a real `ttft-monitor run` against the simulator (bench/daemon.py's config: SERIES
series in one job every EVERY seconds, one request each). Both set-ups run in turn, `--pairs` times,
each on a fresh database, in one run so their figures are side by side; the script prints the
medians: probes completed per second by all daemons together over `--seconds` from the moment all
are ready (a tick still running when the next is due skips that one, so this is in steps of whole
ticks), how long a tick took from its scheduled time to its last run's end and the series per
second that makes (the capacity, not rounded to ticks), the share that succeeded, ticks skipped,
and the event-loop lag p99 of the busiest daemon.

    .venv/bin/python bench/shared_job.py --postgres postgresql+asyncpg://postgres@127.0.0.1:5432/test \\
        [--series 1000] [--every 5] [--seconds 40] [--pairs 2] [--shards 6]

All daemons run on this machine: on a small one they share its cores, so the figure says what a
location gains here; replicas on machines of their own add their own cores too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

from daemon import (  # bench/daemon.py: the same simulator, config and daemon as the one-daemon bench
    PROMPT_SIZES,
    free_port,
    histogram_quantile,
    post,
    run,
    start_daemon,
    start_sim,
    write_config,
)


def _admin(url: str, statement: str) -> None:
    import asyncpg  # the daemon's own PostgreSQL driver
    from sqlalchemy.engine import make_url

    async def execute() -> None:
        connection = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(execute())


def wait_ready(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"a daemon (127.0.0.1:{port}) was not ready within {timeout_s:.0f} s")


def bench_setup(sim: str, args: argparse.Namespace, folder: Path, *, daemons: int, shards: int) -> dict:
    from sqlalchemy.engine import make_url

    name = f"ttft_bench_shared_{uuid.uuid4().hex[:8]}"
    _admin(args.postgres, f'CREATE DATABASE "{name}"')
    db_url = make_url(args.postgres).set(database=name).render_as_string(hide_password=False)
    try:
        procs, logs, ports = [], [], []
        for index in range(daemons):
            home = folder / f"{name}-{index}"
            home.mkdir()
            port = free_port()
            config = write_config(home, sim, series=args.series, every=args.every, port=port)
            text = config.read_text().replace(f'  url: "sqlite+aiosqlite:///{home}/bench.db"', f'  url: "{db_url}"')
            config.write_text(text.replace("    rounds: 1\n", f"    rounds: 1\n    shards: {shards}\n"))
            if index == 0:
                run([sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)])
            logs.append(home / "daemon.log")
            ports.append(port)
            procs.append(start_daemon(config, logs[-1]))
        lags = []
        try:
            for port in ports:
                wait_ready(port)
            # The window starts once every daemon is up, so start-up is not counted against either set-up.
            start = datetime.now(UTC)
            time.sleep(args.seconds)
            end = datetime.now(UTC)
            for port in ports:
                metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                lags.append(histogram_quantile(metrics, "ttft_monitor_event_loop_lag_seconds", 0.99) or float("nan"))
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
        events = [json.loads(line) for log in logs for line in log.read_text().splitlines() if line.startswith("{")]
    finally:
        _admin(args.postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    samples = [
        e for e in events if e.get("event") == "probe_sample" and start <= datetime.fromisoformat(e["timestamp"]) < end
    ]
    # How long each tick took to be probed, from its scheduled time to the last of its runs ending,
    # whichever daemons probed it: what one daemon or the three can do, not rounded to whole ticks.
    done: dict[datetime, datetime] = {}
    for e in events:
        if e.get("event") != "job_finished":
            continue
        ended = datetime.fromisoformat(e["timestamp"])
        if "scheduled" in e:
            tick = datetime.fromisoformat(e["scheduled"])
        else:  # one daemon, no shards: the tick is when it started, less its lag
            started = ended.timestamp() - e["duration_s"] - e["lag_ms"] / 1000
            tick = datetime.fromtimestamp(round(started / args.every) * args.every, UTC)
        if start <= tick < end:
            done[tick] = max(done.get(tick, ended), ended)
    tick_s = statistics.median((ended - tick).total_seconds() for tick, ended in done.items()) if done else float("nan")
    series_n = max(1, args.series // len(PROMPT_SIZES)) * len(PROMPT_SIZES)
    return {
        "probes_per_s": len(samples) / (end - start).total_seconds(),
        "tick_s": tick_s,
        "series_per_tick_s": series_n / tick_s,
        "ok": sum(1 for s in samples if s.get("error") is None) / max(1, len(samples)),
        "skipped_ticks": sum(1 for e in events if e.get("event") == "job_run_skipped"),
        "lag_p99_s_worst": max(lags),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--postgres", default=os.environ.get("TTFT_TEST_POSTGRES_URL"), help="a server to create databases on"
    )
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--every", type=int, default=5, help="schedule period in seconds")
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--shards", type=int, default=6, help="the shared job's shards (three daemons)")
    args = parser.parse_args()
    if not args.postgres:
        raise SystemExit("bench/shared_job.py: --postgres URL (or TTFT_TEST_POSTGRES_URL) is needed")
    sim_proc, sim = start_sim()
    try:
        post(f"{sim}/sim/models/bench-model", {"ttft_base_ms": 40, "prefill_ms_per_1k": 20, "decode_tps": 500})
        print(
            f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"load {' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(
            f"job: {args.series} series every {args.every} s (offered {args.series / args.every:.0f} probes/s), "
            f"{args.seconds:.0f} s per set-up, PostgreSQL"
        )
        results: dict[str, list[dict]] = {"one daemon": [], f"three daemons, {args.shards} shards": []}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.pairs):
                for label, (daemons, shards) in zip(results, ((1, 1), (3, args.shards)), strict=True):
                    results[label].append(bench_setup(sim, args, Path(tmp), daemons=daemons, shards=shards))
                    print(f"  {label}: {results[label][-1]}  load {os.getloadavg()[0]:.2f}", flush=True)
        medians = {
            label: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for label, runs in results.items()
        }
        keys = list(next(iter(medians.values())))
        print(f"{'median of ' + str(args.pairs):24s}" + "".join(f"{k:>18s}" for k in keys))
        for label, values in medians.items():
            print(f"{label:24s}" + "".join(f"{values[k]:18.3f}" for k in keys))
        one, three = medians.values()
        print(f"probes/s, three against one: {three['probes_per_s'] / one['probes_per_s']:.2f}x")
        print(f"load after: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        sim_proc.terminate()
        sim_proc.wait(timeout=10)


if __name__ == "__main__":
    main()
