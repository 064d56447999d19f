"""`/metrics` at scale: size and scrape time of a daemon's registry of many probe series, per
`metrics.per_series` mode, with prometheus_client's `generate_latest` (what the daemon used before)
beside monitor.metrics.exposition's renderer (what it uses now), in one run.

The registry is filled through `Metrics` as the daemon fills it: per probe series (target x prompt)
three successful probes with TTFT, TTFA, TTFB, set-up and decode rate, a target SLO, and the
detector's baseline, band, run median, ratio and regression state. Each rendering is timed
`--repeats` times and the median printed; the `scrape` column is a real GET of `/metrics` over
loopback from the daemon's own listener (monitor.metrics.server), its rendering included, once asking
for gzip (as Prometheus does) and once for the text; `gzip` is the compressed rendering the listener keeps.

    .venv/bin/python bench/metrics_scale.py [--targets 2000] [--prompts 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable

import aiohttp
from prometheus_client import generate_latest

from monitor.metrics.definitions import PER_SERIES_MODES, Metrics, PerSeries
from monitor.metrics.exposition import render, render_parts
from monitor.metrics.server import start_metrics_server
from monitor.probe.result import Sample

PROMPTS = ("short", "medium", "long", "xl", "xxl")


def filled(mode: PerSeries, *, targets: int, prompts: int) -> Metrics:
    metrics = Metrics(location="eu-west-1", per_series=mode)
    for t in range(targets):
        target = f"target-{t:05d}"
        for prompt in PROMPTS[:prompts]:
            for round_ in range(3):
                sample = Sample(
                    target=target,
                    model=f"org/model-{t:05d}-instruct",
                    api="openai-chat",
                    prompt=prompt,
                    round=round_,
                    ttft_ms=80 + (t * 37 + round_ * 11) % 2000,
                    ttfa_ms=120 + (t * 53 + round_ * 7) % 3000,
                    ttfb_ms=40.0 + round_,
                    setup_ms=0.0,
                    decode_tps=35.0 + t % 40,
                )
                metrics.observe_sample(
                    sample, provider="gateway", probe_job="ttft", slo_ttft_ms=1500, slo_objective=0.99
                )
            series = (target, prompt, "eu-west-1")
            metrics.observe_baseline(
                series, baseline_ms=400.0 + t % 300, run_median_ms=420.0, ticket_ratio=1.5, ticket_min_delta_ms=50
            )
            metrics.observe_regression_state(series, 0)
    return metrics


def timed(render_fn: Callable[[Metrics], bytes], metrics: Metrics, repeats: int) -> tuple[float, bytes]:
    times, body = [], b""
    for _ in range(repeats):
        started = time.perf_counter()
        body = render_fn(metrics)
        times.append(time.perf_counter() - started)
    return statistics.median(times), body


async def scrape(metrics: Metrics, repeats: int, *, accept_encoding: str) -> float:
    async def ready() -> tuple[bool, str]:
        return True, "ok"

    runner = await start_metrics_server(metrics.registry, ready, "127.0.0.1:0")
    port = runner.addresses[0][1]
    times = []
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(repeats):
                started = time.perf_counter()
                headers = {"Accept-Encoding": accept_encoding}
                async with session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response:
                    await response.read()
                times.append(time.perf_counter() - started)
                await asyncio.sleep(2.2 * times[-1])  # past the listener's reuse of a fresh rendering
    finally:
        await runner.cleanup()
    return statistics.median(times)


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=2000)
    parser.add_argument("--prompts", type=int, default=3, choices=range(1, len(PROMPTS) + 1))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    probe_series = args.targets * args.prompts
    print(f"{probe_series} probe series ({args.targets} targets x {args.prompts} prompts), load {load()}")
    print(
        f"{'mode':8} {'MB':>7} {'lines':>8} {'series/probe series':>20} "
        f"{'generate_latest s':>18} {'render s':>9} {'ratio':>6} {'gzip MB':>8} {'gzip s':>7} "
        f"{'scrape s (gzip / text)':>23}"
    )
    for mode in PER_SERIES_MODES:
        metrics = filled(mode, targets=args.targets, prompts=args.prompts)
        before, old_body = timed(lambda m: generate_latest(m.registry), metrics, args.repeats)
        after, body = timed(lambda m: render(m.registry), metrics, args.repeats)
        compressed_s, compressed = timed(
            lambda m: b"".join(render_parts(m.registry, gzip=True).pieces), metrics, args.repeats
        )
        scraped_gzip = asyncio.run(scrape(metrics, args.repeats, accept_encoding="gzip"))
        scraped_text = asyncio.run(scrape(metrics, args.repeats, accept_encoding="identity"))
        lines = body.count(b"\n")
        per_series = sum(1 for line in body.splitlines() if b'target="' in line) / probe_series
        assert len(body) == len(old_body), "the two renderings differ in size"
        print(
            f"{mode:8} {len(body) / 1e6:7.1f} {lines:8d} {per_series:20.1f} "
            f"{before:18.2f} {after:9.2f} {before / after:6.1f} {len(compressed) / 1e6:8.2f} {compressed_s:7.2f} "
            f"{scraped_gzip:11.2f} / {scraped_text:9.2f}"
        )
    print(f"load {load()}; medians of {args.repeats}; the shipped ServiceMonitor's scrapeTimeout is 10 s")


if __name__ == "__main__":
    main()
