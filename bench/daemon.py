"""Daemon under load: one `ttft-monitor run` probing the simulator with many series on a tight schedule.

Reports probes completed per second, event-loop lag (p99, from the daemon's own histogram), the share of
samples the daemon marked disturbed (its own loop late around their stamps), the
probe overhead at that load (client TTFT minus the simulator's own receive-to-first-token time,
from the simulator's stamps), peak RSS, and `ttft-monitor once` start-up (process start to the
first request arriving at the simulator, both on CLOCK_MONOTONIC).

    .venv/bin/python bench/daemon.py [--series 500] [--seconds 60] [--every 5]
    .venv/bin/python bench/daemon.py --once-only --once-against ../main   # `once` start-up beside another checkout
    .venv/bin/python bench/daemon.py --against ../main --runs 3 --skip-once  # the daemon beside another checkout
    .venv/bin/python bench/daemon.py --profile FILE   # where the daemon's CPU goes (py-spy, not a dependency)
    .venv/bin/python bench/daemon.py --history-days 8.2 --settle 40 --against ../main --runs 3 --skip-once
        # at steady state: every series with 8 days of 5-minute history (what detection reads), measured
        # after the first ticks (which read every history whole)

CPU per probe is the daemon process's user + system CPU seconds (/proc/PID/stat, all its threads) from
the moment it is ready to the end of the measured interval, over the probes it logged in that interval.

Every daemon, of any checkout, times its garbage collections (bench/gcwatch/sitecustomize.py, last on its
PYTHONPATH): the `gc_` figures are the measured interval's collections by generation, the longest pauses
(a full collection's on the wall clock and on its thread's CPU clock, which other processes' load does not
lengthen), the collector's CPU per probe and the objects it freed per probe (cyclic garbage).

`--otel` runs the daemon with OpenTelemetry export off, metrics only and metrics with traces (to a
loopback OTLP/HTTP receiver, metrics every second), and both towards a collector that accepts and
never answers (hung) and one whose port refuses (dead), in turn, `--pairs` times, and prints each
mode's medians side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT_SIZES = (128, 160, 192, 224, 256)


def start_sim() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "sim", "--port", "0", "--no-noise"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    match = re.search(r"(http://127\.0\.0\.1:\d+)", proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit("the simulator did not start")
    return proc, match.group(1)


def post(url: str, body: dict) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def write_config(folder: Path, sim: str, *, series: int, every: int, port: int) -> Path:
    targets_n = max(1, series // len(PROMPT_SIZES))
    lines = [
        "location: bench",
        "database:",
        f'  url: "sqlite+aiosqlite:///{folder}/bench.db"',
        f'  state_dir: "{folder}/state"',
        "metrics:",
        f'  listen: "127.0.0.1:{port}"',
        "providers:",
        "  sim:",
        f'    base_url: "{sim}/v1"',
        "    api: openai-chat",
        "    max_concurrency: 10",
        "targets:",
    ]
    for i in range(targets_n):
        lines += [f"  t{i:03d}:", "    provider: sim", "    model: bench-model", "    params: {max_tokens: 4}"]
    lines.append("prompts:")
    for size in PROMPT_SIZES:
        lines.append(f"  p{size}: {{tokens: {size}}}")
    lines += [
        "jobs:",
        "  - name: load",
        f'    schedule: "*/{every} * * * * *"',
        f"    targets: [{', '.join(f't{i:03d}' for i in range(targets_n))}]",
        f"    prompts: [{', '.join(f'p{s}' for s in PROMPT_SIZES)}]",
        "    rounds: 1",
        "    warmup: 0",
        "    pause_s: 0",
    ]
    path = folder / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def fill_history(folder: Path, sim: str, *, series: int, days: float, config: Path | None = None) -> Path:
    """A database migrated and filled with `days` of 5-minute runs (one probe each, as the bench's job
    probes) of the bench's series, as the daemon would have stored them: what detection reads at steady
    state. Filled once and copied for each daemon run. `config`: the one housekept with (its database
    `folder`/bench.db), else the bench's own."""
    config = config or write_config(folder, sim, series=series, every=10, port=free_port())
    run([sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)])
    script = r"""
import asyncio, dataclasses, sys
from datetime import UTC, datetime, timedelta
from monitor.store.engine import create_engine
from monitor.store.records import runs_from_samples
from monitor.store.repository import Repository
from tests.support.store_fixtures import make_samples
url, series, days, sizes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(",")
targets = [f"t{i:03d}" for i in range(max(1, series // len(sizes)))]
async def main():
    engine = create_engine(url)
    repository = Repository(engine)
    ticks = int(days * 288)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    chunk = []
    for index in range(ticks):
        at = now - timedelta(minutes=5 * (ticks - index))
        samples = [
            dataclasses.replace(s, model="bench-model")
            for t in targets for size in sizes for s in make_samples(t, f"p{size}", at=at, rounds=1, warmup=0)
        ]
        chunk += runs_from_samples(samples, job="load", location="bench", provider_of=dict.fromkeys(targets, "sim"))
        if len(chunk) >= 5000:
            await repository.save_runs(chunk)
            chunk = []
    if chunk:
        await repository.save_runs(chunk)
    await engine.dispose()
asyncio.run(main())
"""
    started = time.perf_counter()
    url = f"sqlite+aiosqlite:///{folder}/bench.db"
    sizes = ",".join(str(size) for size in PROMPT_SIZES)
    subprocess.run([sys.executable, "-c", script, url, str(series), str(days), sizes], check=True, cwd=ROOT)
    filled = time.perf_counter() - started
    # Rolled up, as hourly housekeeping would have done over those days (else the daemon's housekeeping
    # catches up on them while it is measured).
    run([sys.executable, "-m", "monitor", "db", "housekeep", "--config", str(config)])
    print(
        f"history: {days} days of 5-minute runs of {series} series filled in {filled:.0f} s, "
        f"housekept in {time.perf_counter() - started - filled:.0f} s"
    )
    return folder / "bench.db"


def skipped_runs(metrics_text: str) -> float:
    """Runs stored and not evaluated, their detection budget spent (all jobs)."""
    return sum(
        float(line.split()[-1])
        for line in metrics_text.splitlines()
        if line.startswith("ttft_monitor_detection_skipped_runs_total{")
    )


def histogram_quantile(metrics_text: str, name: str, q: float) -> float | None:
    buckets = []
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = re.search(r'le="([^"]+)"', line)
            if le:
                buckets.append((float("inf") if le.group(1) == "+Inf" else float(le.group(1)), float(line.split()[-1])))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    for bound, count in buckets:
        if count >= q * total:
            return bound
    return None


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (all its threads), from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def run(cmd: list[str], checkout: Path = ROOT) -> None:
    subprocess.run(cmd, check=True, cwd=checkout, capture_output=True, env=checkout_env(checkout))


# Per checkout, where its bytecode was compiled (`compile_bytecode`); none: as this environment has it.
BYTECODE: dict[Path, Path] = {}


def checkout_env(checkout: Path) -> dict[str, str]:
    """This environment with `checkout` first on PYTHONPATH (this one's own when it is ROOT), reading the
    bytecode `compile_bytecode` made for it."""
    env = dict(os.environ) if checkout == ROOT else {**os.environ, "PYTHONPATH": str(checkout)}
    if checkout in BYTECODE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(BYTECODE[checkout])
    return env


def compile_bytecode(checkouts: Sequence[Path], folder: Path) -> None:
    """Compile each checkout's package into a cache of its own, as pip compiles it in the image: with
    PYTHONDONTWRITEBYTECODE in the environment (the image sets it) every start would compile the whole
    package from source, and what the compiler leaves in the heap (2-3 MB) would be counted in its RSS."""
    for i, checkout in enumerate(checkouts):
        BYTECODE[checkout] = folder / f"pycache-daemon-{i}"
        run([sys.executable, "-m", "compileall", "-q", str(checkout / "monitor")], checkout)


def start_daemon(
    config: Path, log_path: Path, env: dict[str, str] | None = None, *, checkout: Path = ROOT
) -> subprocess.Popen[bytes]:
    """`ttft-monitor run` on `config`, its log (JSON lines) to `log_path`; `env` added to this environment;
    `checkout`: whose `monitor` runs (this one's by default)."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=checkout,
            env={**checkout_env(checkout), **(env or {})},
        )


def wait_ready(port: int, daemon: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited ({daemon.returncode}) before it was ready")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the daemon was not ready within a minute")


# Leaves where a sampled thread waits rather than works (py-spy counts some of them as active).
IDLE_LEAVES = (".select (selectors.py", "wait (threading.py", "_connection_worker_thread (aiosqlite/core.py:59")
# A sample's stage: the first of these with a frame anywhere on its stack (detection's queries are detection's).
STAGES = (
    ("detect", ("monitor/detect/",)),
    ("alerts", ("monitor/alert/",)),
    ("store", ("sqlalchemy/", "aiosqlite/", "sqlite3", "monitor/store/")),
    ("metrics", ("prometheus_client/", "monitor/metrics/", "monitor/otel/")),
    ("logging", ("structlog/", "monitor/logging.py", "monitor/redact.py")),
    ("probe (client, parse)", ("aiohttp/", "monitor/probe/", "monitor/kernel_clock.py", "yarl/", "multidict/")),
    ("schedule", ("apscheduler/", "monitor/schedule/", "monitor/daemon.py")),
)


def py_spy_summary(raw: Path) -> str:
    """py-spy's raw (collapsed) stacks, waits left out: each stage's share of the samples where a thread
    worked (`STAGES`), and each thread's."""
    stages: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if any(mark in frames[-1] for mark in IDLE_LEAVES):
            continue
        count = int(count_text)
        total += count
        thread = frames[0].split(": ", 1)[-1]
        threads[thread] = threads.get(thread, 0) + count
        stage = next(
            (name for name, marks in STAGES if any(m in frame for frame in frames for m in marks)), "event loop, other"
        )
        stages[stage] = stages.get(stage, 0) + count
    rows = [f"    {100 * n / total:5.1f}%  {name}" for name, n in sorted(stages.items(), key=lambda kv: -kv[1])]
    rows.append("  by thread:")
    rows += [f"    {100 * n / total:5.1f}%  {name}" for name, n in sorted(threads.items(), key=lambda kv: -kv[1])]
    return "\n".join(rows)


def overheads(sim: str, samples: list[dict], limit: int, *, until: str = "first_token_write_ns") -> list[float]:
    """Client TTFT minus the simulator's own receive-to-first-token time, for up to about `limit` samples.
    `until`: the simulator's stamp before it wrote the first token (the default), or after the write
    returned (`first_token_sent_ns`): the overhead's bound from below, where a simulator held up
    between the two (a loaded machine) is not counted against the client."""
    out = []
    for sample in samples[:: max(1, len(samples) // limit)]:
        rec = get_json(f"{sim}/sim/requests/{sample['request_id']}")
        if rec.get(until) is not None:
            out.append(sample["ttft_ms"] - (rec[until] - rec["received_ns"]) / 1e6)
    return out


@contextmanager
def otlp_sink() -> Iterator[str]:
    """An OTLP/HTTP receiver that takes every export (200, empty body) and counts the requests."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def hung_collector() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_daemon(
    sim: str,
    args: argparse.Namespace,
    folder: Path,
    *,
    otel: str | None = None,
    checkout: Path = ROOT,
    profile: Path | None = None,
    history: Path | None = None,
) -> dict:
    """`otel`: an `otel:` section to add (export off without it). `checkout`: whose daemon runs.
    `profile`: record the measured interval with py-spy (raw stacks) into this file. `history`: a filled
    database (`fill_history`) the daemon starts on, a copy of it.

    CPU per probe is the daemon's user + system CPU over the measured interval (from ready to the scrape,
    all its threads: probing, parsing, storing, detection, metrics, the listener) over the probes logged
    in that interval; start-up (imports, opening the store) is not in it."""
    port = free_port()
    config = write_config(folder, sim, series=args.series, every=args.every, port=port)
    if otel is not None:
        config.write_text(config.read_text() + f"otel: {otel}\n")
    if history is not None:
        shutil.copy(history, folder / "bench.db")
    run([sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)], checkout)
    log_path = folder / "daemon.log"
    gc_out = folder / "gc.jsonl"
    daemon = start_daemon(config, log_path, gc_watch(checkout, gc_out), checkout=checkout)
    spy = None
    try:
        wait_ready(port, daemon)
        time.sleep(args.settle)  # e.g. the first ticks over a filled history, which read every history whole
        skipped_from = skipped_runs(
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        )
        measured_from, cpu_from = datetime.now(UTC), cpu_seconds(daemon.pid)
        if profile is not None:
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(daemon.pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--threads",
                    "--nonblocking",
                    "--output",
                    str(profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(args.seconds)
        cpu_to, measured_to = cpu_seconds(daemon.pid), datetime.now(UTC)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        rss = peak_rss_mb(daemon.pid)
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    samples = [e for e in events if e.get("event") == "probe_sample"]
    in_interval = sum(1 for e in samples if measured_from <= datetime.fromisoformat(e["timestamp"]) <= measured_to)
    ok = [s for s in samples if s.get("error") is None]
    stamps = [e["timestamp"] for e in samples]
    first, last = min(stamps), max(stamps)
    span = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    overhead = sorted(overheads(sim, ok, limit=2000))
    missed = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("ttft_monitor_scheduler_missed_runs_total{")
    )
    return {
        "probes": len(samples),
        "ok": len(ok),
        "probes_per_s": len(samples) / span if span else float("nan"),
        "loop_lag_p99_s": histogram_quantile(metrics, "ttft_monitor_event_loop_lag_seconds", 0.99),
        "overhead_p50_ms": statistics.median(overhead) if overhead else None,
        "overhead_p99_ms": overhead[int(0.99 * (len(overhead) - 1))] if overhead else None,
        "rss_mb": rss,
        "cpu_ms_per_probe": 1000 * (cpu_to - cpu_from) / in_interval if in_interval else None,
        "cpu_share": (cpu_to - cpu_from) / (measured_to - measured_from).total_seconds(),
        # Samples the monitor itself delayed (loop late by more than the bound around their stamps): stored, no
        # evidence; the share of the measured interval's probes.
        "disturbed_share": (
            sum(
                1
                for e in samples
                if e.get("disturbed") and measured_from <= datetime.fromisoformat(e["timestamp"]) <= measured_to
            )
            / in_interval
            if in_interval
            else None
        ),
        "missed_ticks": missed,
        "jobs_finished": sum(1 for e in events if e.get("event") == "job_finished"),
        "detection_skipped": skipped_runs(metrics) - skipped_from,
        **gc_figures(gc_out, measured_from, measured_to, in_interval),
    }


# Loaded by every daemon started here, whichever checkout (it times the garbage collections).
GC_WATCH = ROOT / "bench" / "gcwatch"


def gc_watch(checkout: Path, out: Path) -> dict[str, str]:
    """The environment that has a daemon of `checkout` time its collections into `out` (gcwatch/sitecustomize.py)."""
    path = checkout_env(checkout).get("PYTHONPATH")
    return {"PYTHONPATH": f"{path}{os.pathsep}{GC_WATCH}" if path else str(GC_WATCH), "BENCH_GC_OUT": str(out)}


def gc_figures(out: Path, measured_from: datetime, measured_to: datetime, probes: int) -> dict:
    """The measured interval's collections (bench/gcwatch): how many of each generation, the longest pause
    of a full one (generation 2) on the wall clock and on the collecting thread's CPU clock (which other
    processes' load does not lengthen), the longest of a young one (CPU), the collector's CPU per probe, and
    the objects it freed per probe (cyclic garbage: what reference counting could not free)."""
    if not out.exists():
        return {}
    start, end = measured_from.timestamp(), measured_to.timestamp()
    rows = [r for r in map(json.loads, out.read_text().splitlines()) if start <= r["at"] <= end]
    full = [r for r in rows if r["gen"] == 2]
    return {
        **{f"gc_collections_{g}": sum(1 for r in rows if r["gen"] == g) for g in range(3)},
        "gc_full_max_ms": max((r["wall_ns"] for r in full), default=0) / 1e6,
        "gc_full_max_cpu_ms": max((r["cpu_ns"] for r in full), default=0) / 1e6,
        "gc_young_max_cpu_ms": max((r["cpu_ns"] for r in rows if r["gen"] < 2), default=0) / 1e6,
        "gc_cpu_ms_per_probe": sum(r["cpu_ns"] for r in rows) / 1e6 / probes if probes else None,
        "gc_freed_per_probe": sum(r["collected"] for r in rows) / probes if probes else None,
    }


def bench_otel(sim: str, args: argparse.Namespace, folder: Path) -> None:
    """Export off, metrics only, metrics and traces, and both towards a hung and a dead collector, in turn,
    `args.pairs` times; medians side by side. Metrics go out every second (the default is 60 s)."""
    keys = ("probes_per_s", "overhead_p50_ms", "overhead_p99_ms", "loop_lag_p99_s", "rss_mb")
    with otlp_sink() as sink, hung_collector() as hung:
        modes: dict[str, str | None] = {
            "off": None,
            "metrics": f'{{endpoint: "{sink}", export_interval_s: 1, timeout_s: 2}}',
            "traces": f'{{endpoint: "{sink}", export_interval_s: 1, timeout_s: 2, traces: true}}',
            "hung": f'{{endpoint: "{hung}", export_interval_s: 1, timeout_s: 2, traces: true}}',
            "dead": f'{{endpoint: "http://127.0.0.1:{free_port()}", export_interval_s: 1, timeout_s: 2, traces: true}}',
        }
        results: dict[str, list[dict]] = {mode: [] for mode in modes}
        for index in range(args.pairs):
            for mode, otel in modes.items():
                where = folder / f"{mode}-{index}"
                where.mkdir()
                results[mode].append(bench_daemon(sim, args, where, otel=otel))
    heading = "".join(f"{mode:>10s}" for mode in results) + "  metrics/off  hung/off  dead/off"
    print(f"  {'median of ' + str(args.pairs):18s} " + heading)
    for key in keys:
        medians = {m: statistics.median(r[key] for r in runs if r[key] is not None) for m, runs in results.items()}
        ratios = [medians[m] / medians["off"] if medians["off"] else float("nan") for m in ("metrics", "hung", "dead")]
        row = "".join(f"{medians[m]:10.3f}" for m in results) + "".join(f"  {r:9.3f}" for r in ratios)
        print(f"  {key:18s} " + row)


def bench_once_startup(sim: str, folder: Path, runs: int = 7, checkouts: Sequence[Path] = (ROOT,)) -> list[list[float]]:
    """Seconds from starting `once` to its first request at the simulator, per checkout (each run with
    that checkout first on PYTHONPATH), the checkouts taking turns so that the load is shared alike.

    Bytecode is compiled by a first run that is not counted (into a cache of its own per checkout), as
    pip compiles it in the image: PYTHONDONTWRITEBYTECODE in the environment would otherwise make every
    run compile the whole package from source (a third of a second)."""
    config = folder / "once.yaml"
    config.write_text(
        f'database: {{url: "sqlite+aiosqlite:///{folder}/once.db", state_dir: "{folder}/state-once"}}\n'
        f'providers: {{sim: {{base_url: "{sim}/v1", api: openai-chat}}}}\n'
        "targets: {one: {provider: sim, model: bench-model, params: {max_tokens: 2}}}\n"
        "prompts: {p: {tokens: 128}}\n"
        'jobs: [{name: once, schedule: "0 * * * *", targets: [one], prompts: [p], rounds: 1, warmup: 0}]\n'
    )
    run([sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)])
    out: list[list[float]] = [[] for _ in checkouts]
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    envs = [
        {**base, "PYTHONPATH": str(checkout), "PYTHONPYCACHEPREFIX": str(folder / f"pycache-{i}")}
        for i, checkout in enumerate(checkouts)
    ]
    for run_ in range(runs + 1):
        for i, checkout in enumerate(checkouts):
            env = envs[i]
            started = time.perf_counter_ns()
            done = subprocess.run(
                [sys.executable, "-m", "monitor", "once", "--config", str(config)],
                capture_output=True,
                text=True,
                cwd=checkout,
                env=env,
            )
            sample = next(json.loads(line) for line in done.stdout.splitlines() if '"probe_sample"' in line)
            rec = get_json(f"{sim}/sim/requests/{sample['request_id']}")
            if run_:  # the first compiled the bytecode
                out[i].append((rec["received_ns"] - started) / 1e9)
    return out


def print_results(results: dict[Path, list[dict]]) -> None:
    """Each figure's median over the runs, one column per checkout (every run's value beside it)."""
    keys = list(next(iter(results.values()))[0])
    print(f"  {'median of ' + str(len(next(iter(results.values())))):18s} " + "  ".join(str(c) for c in results))
    for key in keys:
        cells = []
        for runs in results.values():
            values = [r[key] for r in runs if r[key] is not None]
            median = statistics.median(values) if values else None
            every = ", ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)
            shown = f"{median:.3f}" if isinstance(median, float) else str(median)
            cells.append(f"{shown:>9s} ({every})" if len(values) > 1 else f"{shown:>9s}")
        print(f"  {key:18s} " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=int, default=10, help="schedule period in seconds")
    parser.add_argument("--once-only", action="store_true", help="only measure `once` start-up")
    parser.add_argument(
        "--once-against",
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="also measure `once` start-up of another checkout (say, a worktree of main), runs taking turns",
    )
    parser.add_argument("--once-runs", type=int, default=7, help="`once` start-ups measured per checkout")
    parser.add_argument(
        "--otel", action="store_true", help="compare OpenTelemetry export off / metrics / traces / collector away"
    )
    parser.add_argument("--pairs", type=int, default=2, help="with --otel: how many times to run each mode")
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="also run another checkout's daemon (say, a worktree of main), the checkouts taking turns",
    )
    parser.add_argument("--runs", type=int, default=1, help="daemon runs per checkout (medians printed)")
    parser.add_argument(
        "--history-days", type=float, default=0, help="start every daemon on this many days of 5-minute history"
    )
    parser.add_argument("--settle", type=float, default=0, help="seconds after ready before measuring")
    parser.add_argument("--skip-once", action="store_true", help="measure the daemon only, not `once` start-up")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="one run of this checkout's daemon recorded by py-spy (pip install py-spy) into FILE (raw stacks), "
        "and where its CPU goes",
    )
    args = parser.parse_args()
    sim_proc, sim = start_sim()
    try:
        post(f"{sim}/sim/models/bench-model", {"ttft_base_ms": 40, "prefill_ms_per_1k": 20, "decode_tps": 500})
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            print(
                f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
                f"load {' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
            )
            print(
                f"daemon: {args.series} series every {args.every} s "
                f"(offered {args.series / args.every:.0f} probes/s) for {args.seconds:.0f} s, SQLite"
            )
            if args.otel:
                bench_otel(sim, args, folder)
                return
            if args.profile:
                raw = Path(args.profile).resolve()
                history = None
                if args.history_days:
                    filled = folder / "history"
                    filled.mkdir()
                    history = fill_history(filled, sim, series=args.series, days=args.history_days)
                result = bench_daemon(sim, args, folder, profile=raw, history=history)
                print_results({ROOT: [result]})
                print("  py-spy, where the daemon's threads worked (share of their busy samples), by stage:")
                print(py_spy_summary(raw))
                return
            if not args.once_only:
                checkouts = [ROOT, *(Path(p).resolve() for p in args.against)]
                history = None
                if args.history_days:
                    filled = folder / "history"
                    filled.mkdir()
                    history = fill_history(filled, sim, series=args.series, days=args.history_days)
                compile_bytecode(checkouts, folder)
                results: dict[Path, list[dict]] = {checkout: [] for checkout in checkouts}
                for index in range(args.runs):
                    for i, checkout in enumerate(checkouts):
                        where = folder / f"daemon-{i}-{index}"
                        where.mkdir()
                        results[checkout].append(bench_daemon(sim, args, where, checkout=checkout, history=history))
                        print(f"  run {index + 1}/{args.runs} {checkout}: load {os.getloadavg()[0]:.2f}", flush=True)
                print_results(results)
                if args.skip_once:
                    print(f"load {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
                    return
            checkouts = [ROOT, *(Path(p).resolve() for p in args.once_against)]
            startups = bench_once_startup(sim, folder, runs=args.once_runs, checkouts=checkouts)
            for checkout, startup in zip(checkouts, startups, strict=True):
                print(
                    f"once start-up (process start -> first request at the server), s: median "
                    f"{statistics.median(startup):.3f}  all {[round(s, 3) for s in startup]}  ({checkout})"
                )
            print(f"load {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
            print("targets: >= 50 probes/s, overhead p99 < 5 ms, RSS < 100 MB, once start-up < 0.5 s")
    finally:
        sim_proc.terminate()
        sim_proc.wait(timeout=10)


if __name__ == "__main__":
    main()
