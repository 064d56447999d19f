"""One large job, every series slower at once: is the outage paged, once per group? (issue 26)

The real pipeline in one process (as `run` drives it, ticks back to back instead of on a schedule):
one job of `--series` targets behind one provider, all served by the simulator; `--healthy` runs, then
every model `--factor` times slower for `--slow` runs. A loopback webhook receives the notifications.
Prints per checkout: probing and detection time per run, incidents opened, runs the detector skipped
(and evaluated) by its budget, and the notifications delivered.

    .venv/bin/python bench/large_job.py [--series 4000] [--checkout /path/to/older/checkout ...]

`--checkout` runs the same scenario on another checkout of the project (its own `monitor/`, through
PYTHONPATH), side by side with this one, for before/after figures in one run.
`BENCH_LARGE_JOB_EVENTS=1` prints the counts of the scenario's log events.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from daemon import ROOT, start_sim  # the simulator as bench/daemon.py starts it

# The scenario, run inside the checkout under test (so it imports that checkout's monitor/).
SCENARIO = r"""
import asyncio, json, sys, time, urllib.request
from contextlib import AsyncExitStack
import sqlalchemy as sa
import structlog
from monitor.app import attach_detection, build_context, open_store
from monitor.config.loader import load_config
from monitor.schedule.pipeline import execute, plan_for_job
from monitor.store.models import IncidentRow

path, sim, healthy, slow, factor = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

def speed(f):
    body = json.dumps({"ttft_base_ms": 30.0 * f, "prefill_ms_per_1k": 5.0 * f}).encode()
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(sim + "/sim/models/bench-model", data=body, headers=headers)
    urllib.request.urlopen(req, timeout=5).read()

async def main():
    config = load_config(path)
    out = {"probe_s": [], "detect_s": [], "skipped": [], "stopped": 0}
    async with AsyncExitStack() as stack:
        store = await open_store(config, metrics=None)
        stack.callback(store.spool.close)
        stack.push_async_callback(store.engine.dispose)
        context = await build_context(config, stack, store=store, metrics=None)
        dispatcher, _service = await attach_detection(context, store, stack, metrics=None)
        plan = plan_for_job(context, config.jobs[0])
        detect = context.after_store
        spent = {"s": 0.0}
        async def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                await detect(*args, **kwargs)
            finally:
                spent["s"] += time.perf_counter() - t
        context.after_store = timed
        for index in range(healthy + slow):
            speed(factor if index >= healthy else 1.0)
            spent["s"] = 0.0
            started = time.perf_counter()
            with structlog.testing.capture_logs() as logs:
                await execute(context, job="large", plan=plan)
            out["probe_s"].append(time.perf_counter() - started - spent["s"])
            out["detect_s"].append(spent["s"])
            for e in logs:
                out.setdefault("events", {}).setdefault(e["event"], 0)
                out["events"][e["event"]] += 1
                if e["event"] == "detection_skipped" and "evaluated" in e:
                    out["skipped"].append([e["runs"], e["evaluated"]])
                elif e["event"] in ("detection_skipped", "detection_stopped"):  # the hard stop (before: skipped)
                    out["stopped"] += 1
            await dispatcher.dispatch_due()
            out.setdefault("run_ends", []).append(time.time())
        async with store.engine.connect() as connection:
            count = sa.select(sa.func.count()).select_from(IncidentRow.__table__)
            out["incidents"] = (await connection.execute(count)).scalar()
    print(json.dumps(out))

asyncio.run(main())
"""


def write_config(folder: Path, sim: str, hook: str, series: int, rounds: int) -> Path:
    names = [f"m{i:04d}" for i in range(series)]
    targets = "".join(f"  {n}: {{provider: gw, model: bench-model, params: {{max_tokens: 2}}}}\n" for n in names)
    path = folder / "config.yaml"
    path.write_text(
        f"""location: bench
database:
  url: "sqlite+aiosqlite:///{folder}/bench.db"
  state_dir: "{folder}/state"
providers:
  gw: {{base_url: "{sim}/v1", api: openai-chat, max_concurrency: 64}}
targets:
{targets}prompts:
  short: {{tokens: 128}}
jobs:
  - name: large
    schedule: "*/5 * * * *"
    targets: [{", ".join(names)}]
    prompts: [short]
    rounds: {rounds}
    warmup: 0
    pause_s: 0
detection:
  min_history_runs: 6
  trailing_runs: 12
  page: {{min_delta_ms: 10}}
alerts:
  receivers:
    hook: {{type: webhook, url: "{hook}"}}
  routes:
    - receivers: [hook]
  # Runs come seconds apart here, not 5 minutes: the group's first page waits for its members for
  # 12 s (about two of these runs, as the default 10 minutes are two 5-minute runs).
  grouping: {{window_minutes: 60, hold_minutes: 0.2}}
"""
    )
    return path


class Hook:
    """A webhook receiver on loopback that keeps every notification's state and member count."""

    def __init__(self) -> None:
        received: list[dict] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                data = body.get("data", body)
                group = data.get("group") or {}
                received.append(
                    {"state": data.get("state"), "members": len(group.get("members") or []) or 1, "at": time.time()}
                )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def run_scenario(checkout: Path, args: argparse.Namespace, sim: str) -> dict:
    hook = Hook()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_config(folder, sim, hook.url, args.series, args.rounds)
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        subprocess.run(
            [sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)],
            check=True,
            cwd=checkout,
            env=env,
            capture_output=True,
        )
        done = subprocess.run(
            [sys.executable, "-c", SCENARIO, str(config), sim, str(args.healthy), str(args.slow), str(args.factor)],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
        )
    hook.server.shutdown()
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the scenario failed:\n{done.stderr[-3000:]}")
    out: dict = json.loads(done.stdout.strip().splitlines()[-1])
    out["sent"] = hook.received
    if os.environ.get("BENCH_LARGE_JOB_EVENTS"):
        print(out.get("events"), file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--healthy", type=int, default=14, help="healthy runs first (default 14)")
    parser.add_argument("--slow", type=int, default=6, help="then this many runs slower (default 6)")
    parser.add_argument("--rounds", type=int, default=2, help="requests per series and run (default 2)")
    parser.add_argument("--factor", type=float, default=4.0, help="how much slower (default 4)")
    parser.add_argument("--checkout", type=Path, action="append", default=[], help="another checkout to compare")
    args = parser.parse_args()
    sim_proc, sim = start_sim()
    try:
        print(
            f"{args.series} series in one job, {args.healthy} healthy runs, "
            f"then {args.slow} runs {args.factor:g}x slower"
        )
        print(
            f"{'checkout':40} {'probe s/run':>11} {'detect s/run (slow runs)':>25} {'incidents':>9} "
            f"{'skipped/evaluated':>18} {'hard stops':>10} {'notifications (state:members@slow run)':>30}"
        )
        for checkout in [ROOT, *args.checkout]:
            out = run_scenario(checkout.resolve(), args, sim)
            slow_detect = out["detect_s"][args.healthy :]
            # Which slow run each notification followed (1: the first slow run).
            ends = out["run_ends"]

            def slow_run(at: float, ends: list[float] = ends) -> int:
                return next((i for i, e in enumerate(ends) if e >= at), len(ends)) - args.healthy + 1

            sent = ", ".join(f"{n['state']}:{n['members']}@{slow_run(n['at'])}" for n in out["sent"]) or "none"
            skipped = ", ".join(f"{r}/{e}" for r, e in out["skipped"]) or "-"
            print(
                f"{str(checkout)[-40:]:40} {statistics.median_high(out['probe_s']):11.1f} "
                f"{' '.join(f'{s:.1f}' for s in slow_detect):>25} {out['incidents']:9d} {skipped:>18} "
                f"{out['stopped']:10d} {sent:>30}"
            )
    finally:
        sim_proc.terminate()
        sim_proc.wait(10)


if __name__ == "__main__":
    main()
