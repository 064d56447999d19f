"""The instrument under its own load: one `ttft-monitor run` probing the simulator while its listener is
attacked, measured against the same daemon's quiet minutes in the same run.

Phase 1 (quiet): the daemon probes `--series` series every `--every` s; nobody talks to its listener.
Phase 2 (load): the same daemon, while clients hammer its listener at once: wrong basic-auth
passwords, heavy compares (`since=400d`), cheap pages, half-sent requests held open, and
`/metrics` scraped back to back. For each phase it prints the probe overhead (the client's TTFT
minus the simulator's own receive-to-first-token time, from the simulator's stamps) p50/p99, ticks
skipped, results lost and samples marked disturbed; for the load phase the listener's latency per
kind of request.

    .venv/bin/python bench/isolation.py [--series 500] [--every 10] [--seconds 40] [--clients 50]

Target (issue 19): overhead p99 under load within 1 ms of the quiet run; no tick skipped; nothing lost.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon import ROOT, overheads, post, run, start_daemon, start_sim, write_config

USER, PASSWORD = "ops", "correct horse"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def add_web(config: Path) -> None:
    from monitor.web.auth import hash_password

    text = config.read_text()
    config.write_text(
        text + f'web:\n  enabled: true\n  basic_user: "{USER}"\n  basic_password_hash: "{hash_password(PASSWORD)}"\n'
    )


def missed_ticks(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=30).read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("ttft_monitor_scheduler_missed_runs_total{")
    )


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


async def hammer(
    base: str, seconds: float, clients: int, *, ui_base: str | None = None
) -> dict[str, list[tuple[float, int]]]:
    """The load phase's clients; per kind, (latency s, status) of every answered request. Users with the
    right password come from 127.0.0.2, the attacker from 127.0.0.1, so the failure limit (per address)
    throttles the attacker and not them. `ui_base`: where the pages and API are (default `base`)."""
    import aiohttp

    right = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    wrong = "Basic " + base64.b64encode(f"{USER}:wrong".encode()).decode()
    results: dict[str, list[tuple[float, int]]] = defaultdict(list)
    deadline = time.monotonic() + seconds
    ui = ui_base or base
    kinds = {
        "auth_failure": (f"{ui}/api/v1/series", wrong),
        "heavy_compare": (f"{ui}/api/v1/compare?since=400d", right),
        "points_7d": (f"{ui}/api/v1/series/1/points?since=7d", right),
        "cheap_page": (f"{ui}/", right),
        "metrics_scrape": (f"{base}/metrics", None),
    }
    share = {"auth_failure": 0.4, "heavy_compare": 0.2, "points_7d": 0.1, "cheap_page": 0.2, "metrics_scrape": 0.1}

    async def client(sessions: dict[bool, aiohttp.ClientSession], kind: str) -> None:
        url, auth = kinds[kind]
        session = sessions[auth == right]
        headers = {"Authorization": auth} if auth else {}
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    await resp.read()
                    results[kind].append((time.perf_counter() - started, resp.status))
            except (aiohttp.ClientError, TimeoutError):
                results[kind].append((time.perf_counter() - started, 0))
                await asyncio.sleep(0.05)

    async def slow_sockets(count: int) -> None:
        """Half-sent requests, held open; reopened when the server closes them."""
        host, port = ui.removeprefix("http://").rsplit(":", 1)
        opened = 0

        async def one() -> None:
            nonlocal opened
            while time.monotonic() < deadline:
                try:
                    reader, writer = await asyncio.open_connection(host, int(port))
                except OSError:
                    await asyncio.sleep(0.2)
                    continue
                opened += 1
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                with contextlib.suppress(TimeoutError, OSError):
                    await asyncio.wait_for(reader.read(), timeout=max(0.1, deadline - time.monotonic()))
                writer.close()

        await asyncio.gather(*(one() for _ in range(count)))
        results["slow_socket_opened"].append((0.0, opened))

    attacker = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    users = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=("127.0.0.2", 0)))
    async with attacker, users:
        sessions = {False: attacker, True: users}
        count = {kind: max(1, round(clients * part)) for kind, part in share.items()}
        tasks = [client(sessions, kind) for kind in share for _ in range(count[kind])]
        await asyncio.gather(*tasks, slow_sockets(300))
    return results


def samples_in(events: list[dict], start: float, end: float) -> list[dict]:
    out = []
    for event in events:
        if event.get("event") != "probe_sample" or event.get("error") is not None:
            continue
        at = datetime.fromisoformat(event["timestamp"]).timestamp()
        if start <= at < end:
            out.append(event)
    return out


def measure(args: argparse.Namespace, sim: str, *, kernel_stamps: bool) -> None:
    """One daemon: a quiet phase, then a phase under load; prints both."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        port = free_port()
        config = write_config(folder, sim, series=args.series, every=args.every, port=port)
        add_web(config)
        run([sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)])
        log_path = folder / "daemon.log"
        base = f"http://127.0.0.1:{port}"
        env = {"TTFT_KERNEL_TIMESTAMPS": "1" if kernel_stamps else "0"}
        daemon = start_daemon(config, log_path, env)
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(base + "/healthz", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.2)
            time.sleep(args.every + 2)  # the first run's connections and calibration
            quiet_start = time.time()
            missed_0 = missed_ticks(base + "/metrics")
            time.sleep(args.seconds)
            quiet_end = time.time()
            missed_1 = missed_ticks(base + "/metrics")
            ui_base = None
            serve_proc = None
            if args.ui_process:
                ui_port = free_port()
                serve_proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "monitor",
                        "serve",
                        "--config",
                        str(config),
                        "--listen",
                        f"127.0.0.1:{ui_port}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=ROOT,
                )
                ui_base = f"http://127.0.0.1:{ui_port}"
                for _ in range(100):
                    try:
                        urllib.request.urlopen(ui_base + "/healthz", timeout=1).read()
                        break
                    except OSError:
                        time.sleep(0.2)
                quiet_end = time.time()
                missed_1 = missed_ticks(base + "/metrics")
            try:
                ui = asyncio.run(hammer(base, args.seconds, args.clients, ui_base=ui_base))
            finally:
                if serve_proc is not None:
                    serve_proc.terminate()
                    serve_proc.wait(timeout=20)
            load_end = time.time()
            time.sleep(3)
            missed_2 = missed_ticks(base + "/metrics")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
        events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        lost = sum(1 for e in events if e.get("event") == "results_lost")
        rows = []
        evidence_rows = []
        after_write_rows = []
        for name, start, end, missed in (
            ("quiet", quiet_start, quiet_end, missed_1 - missed_0),
            ("load", quiet_end, load_end, missed_2 - missed_1),
        ):
            samples = samples_in(events, start, end)
            over = overheads(sim, samples, limit=1500)
            evidence = overheads(sim, [s for s in samples if not s.get("disturbed")], limit=1500)
            undisturbed = [s for s in samples if not s.get("disturbed")]
            after_write = overheads(sim, undisturbed, limit=1500, until="first_token_sent_ns")
            disturbed = sum(1 for s in samples if s.get("disturbed"))
            rows.append((name, len(samples), quantile(over, 0.5), quantile(over, 0.99), missed, disturbed))
            evidence_rows.append((name, len(evidence), quantile(evidence, 0.5), quantile(evidence, 0.99)))
            after_write_rows.append((name, len(after_write), quantile(after_write, 0.5), quantile(after_write, 0.99)))
        heads = ("samples", "overhead p50 ms", "p99 ms", "ticks skipped", "disturbed")
        print(f"{'phase':6s} " + " ".join(f"{h:>{w}s}" for h, w in zip(heads, (8, 16, 8, 14, 10), strict=True)))
        for name, n, p50, p99, missed, disturbed in rows:
            nan = float("nan")
            print(f"{name:6s} {n:8d} {p50 or nan:16.3f} {p99 or nan:8.3f} {missed:14.0f} {disturbed:10d}")
        quiet_p99, load_p99 = rows[0][3] or 0.0, rows[1][3] or 0.0
        print(f"overhead p99 load - quiet: {load_p99 - quiet_p99:+.3f} ms; results lost: {lost}")
        print("the detector's evidence (samples not marked disturbed):")
        for name, n, p50, p99 in evidence_rows:
            nan = float("nan")
            print(f"{name:6s} {n:8d} {p50 or nan:16.3f} {p99 or nan:8.3f}")
        print(
            "the same evidence against the simulator's stamp after its first write returned (the bound from "
            "below: what is left is the client's own)"
        )
        for name, n, p50, p99 in after_write_rows:
            nan = float("nan")
            print(f"{name:6s} {n:8d} {p50 or nan:16.3f} {p99 or nan:8.3f}")
        print(f"{'listener (load phase)':22s} {'requests':>9s} {'p50 ms':>9s} {'p99 ms':>9s}  statuses")
        for kind, got in sorted(ui.items()):
            if kind == "slow_socket_opened":
                print(f"{'half-sent sockets':22s} {got[0][1]:9d} opened (each closed by the server's idle timeout)")
                continue
            latencies = [latency * 1000 for latency, _ in got]
            statuses = dict(sorted({s: sum(1 for _, x in got if x == s) for _, s in got}.items()))
            p50, p99 = quantile(latencies, 0.5) or 0.0, quantile(latencies, 0.99) or 0.0
            print(f"{kind:22s} {len(got):9d} {p50:9.1f} {p99:9.1f}  {statuses}")
        print("target: overhead p99 under load within 1 ms of quiet; no tick skipped; nothing lost")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--every", type=int, default=10, help="schedule period in seconds")
    parser.add_argument("--seconds", type=float, default=40, help="length of each phase")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument(
        "--ui-process",
        action="store_true",
        help="the comparison: the pages and API served by a separate `ttft-monitor serve` process instead",
    )
    parser.add_argument(
        "--decode-tps",
        type=float,
        default=500,
        help="the simulated model's decode rate: the gap between tokens, which decides how often a late read "
        "takes the first token together with the next (then the kernel's stamp is the next one's)",
    )
    parser.add_argument(
        "--kernel-stamps",
        choices=("on", "off", "both"),
        default="on",
        help="time bytes by the kernel's arrival stamps (the default), by when the probes' loop read them "
        "(TTFT_KERNEL_TIMESTAMPS=0), or both, one after the other in this run",
    )
    args = parser.parse_args()
    sim_proc, sim = start_sim()
    try:
        post(
            f"{sim}/sim/models/bench-model",
            {"ttft_base_ms": 40, "prefill_ms_per_1k": 20, "decode_tps": args.decode_tps},
        )
        print(
            f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"load {' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(
            f"daemon: {args.series} series every {args.every} s (offered {args.series / args.every:.0f} probes/s), "
            f"SQLite; phases of {args.seconds:.0f} s; load: {args.clients} clients + 300 half-sent sockets; "
            f"model decodes {args.decode_tps:g} tokens/s"
        )
        modes = ("on", "off") if args.kernel_stamps == "both" else (args.kernel_stamps,)
        for mode in modes:
            print(f"\n== kernel arrival stamps {mode} ==")
            measure(args, sim, kernel_stamps=mode == "on")
    finally:
        sim_proc.terminate()
        sim_proc.wait(timeout=10)


if __name__ == "__main__":
    main()
