"""Does the cold tier's compaction move what the daemon measures? One `ttft-monitor run` probing the simulator
(`--series` series every `--every` s, SQLite) whose database holds `--history-days` of 5-minute runs of
`--history-series` of them, old enough that its first housekeeping pass (30 s after start) compacts up to 500
series-days (`cold_after_days: auto`, the default). The probe overhead (the client's TTFT minus the
simulator's receive-to-first-token time, from its stamps), the samples marked disturbed and the ticks skipped
are printed for the seconds before that pass, during it and after it; `--cold off` runs the same daemon with
the tier off (the pass then only rolls up and prunes), for a side-by-side reading.

    .venv/bin/python bench/cold_isolation.py [--series 500] [--every 10] [--history-series 100]
        [--history-days 12] [--cold auto|off|both]

Target (the instrument never disturbs itself): overhead p99 during the pass within 1 ms of before it; no tick
skipped; the samples disturbed said so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon import fill_history, free_port, overheads, post, start_daemon, start_sim, wait_ready, write_config
from isolation import missed_ticks, quantile, samples_in


def with_cold(config: Path, cold: str) -> None:
    text = config.read_text()
    config.write_text(text.replace("database:\n", f"database:\n  retention: {{cold_after_days: {cold}}}\n", 1))


def one(args: argparse.Namespace, sim: str, history: Path, cold: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copyfile(history, folder / "bench.db")
        port = free_port()
        config = write_config(folder, sim, series=args.series, every=args.every, port=port)
        with_cold(config, cold)
        log_path = folder / "daemon.log"
        started = time.time()
        daemon = start_daemon(config, log_path)
        metrics = f"http://127.0.0.1:{port}/metrics"
        try:
            wait_ready(port, daemon)
            time.sleep(args.every + 2)  # the first run's connections
            before_from, missed_0 = time.time(), missed_ticks(metrics)
            finished = None
            deadline = time.time() + 600
            while finished is None and time.time() < deadline:
                time.sleep(1)
                for line in log_path.read_text().splitlines():
                    if '"maintenance_finished"' in line:
                        finished = json.loads(line)
                        break
            if finished is None:
                raise SystemExit("no housekeeping pass finished within 10 minutes")
            missed_1 = missed_ticks(metrics)
            time.sleep(args.after)
            missed_2 = missed_ticks(metrics)
            after_to = time.time()
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
        events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        pass_end = datetime.fromisoformat(finished["timestamp"]).timestamp()
        pass_start = started + 30.0  # maintenance.FIRST_RUN_AFTER_S after the service loop starts
        lost = sum(1 for e in events if e.get("event") == "results_lost")
        print(
            f"\n== cold_after_days: {cold}: housekeeping pass {pass_end - pass_start:.1f} s, "
            f"{finished.get('series_days_compacted', 0):,} series-days ({finished.get('samples_compacted', 0):,} "
            f"samples) compacted, {finished.get('hours_rolled_up', 0):,} hours rolled up; results lost: {lost}"
        )
        heads = ("seconds", "samples", "p50 ms", "p99 ms", "disturbed", "skipped", "evid. p99", "bound p99")
        print(f"{'phase':8s} " + " ".join(f"{head:>9s}" for head in heads))
        for name, start, end, missed in (
            ("before", before_from, pass_start, None),
            ("during", pass_start, pass_end, missed_1 - missed_0),
            ("after", pass_end + 1, after_to, missed_2 - missed_1),
        ):
            samples = samples_in(events, start, end)
            over = overheads(sim, samples, limit=3000)
            undisturbed = [s for s in samples if not s.get("disturbed")]
            # The detector's evidence (samples not marked disturbed), and the same against the simulator's stamp
            # after its write returned: the bound from below, without a simulator held up by the machine's load.
            evidence = overheads(sim, undisturbed, limit=3000)
            bound = overheads(sim, undisturbed, limit=3000, until="first_token_sent_ns")
            disturbed = len(samples) - len(undisturbed)
            nan = float("nan")
            p50, p99 = quantile(over, 0.5) or nan, quantile(over, 0.99) or nan
            evidence_p99, bound_p99 = quantile(evidence, 0.99) or nan, quantile(bound, 0.99) or nan
            skipped = "" if missed is None else f"{missed:.0f}"
            print(
                f"{name:8s} {end - start:9.1f} {len(samples):9d} {p50:9.3f} {p99:9.3f} {disturbed:9d} {skipped:>9s} "
                f"{evidence_p99:9.3f} {bound_p99:9.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--history-series", type=int, default=100)
    parser.add_argument("--history-days", type=float, default=12)
    parser.add_argument("--after", type=float, default=20, help="seconds measured after the pass")
    parser.add_argument("--cold", choices=["auto", "off", "both"], default="both")
    args = parser.parse_args()
    sim_proc, sim = start_sim()
    try:
        post(f"{sim}/sim/models/bench-model", {"ttft_base_ms": 40, "prefill_ms_per_1k": 20, "decode_tps": 50})
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            # Filled and rolled up with the tier off, so the daemon's first pass is the one that compacts.
            fill_config = write_config(folder, sim, series=args.history_series, every=args.every, port=free_port())
            with_cold(fill_config, "off")
            history = fill_history(folder, sim, series=args.history_series, days=args.history_days, config=fill_config)
            for cold in ("auto", "off") if args.cold == "both" else (args.cold,):
                one(args, sim, history, cold)
    finally:
        sim_proc.terminate()
        sim_proc.wait(timeout=10)


if __name__ == "__main__":
    main()
