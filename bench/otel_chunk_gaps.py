"""What recording a probe's chunk gaps (`gen_ai.client.inference.time_per_output_chunk`) costs the
probes' loop: `OtelTelemetry.observe_sample` per probe, for answers of 1, 4, 64 and 257 token chunks
(0, 3, 63 and 256 gaps; 256 is the most a sample keeps), side by side in one run, median of 7 rounds.

The collector address is one nothing listens on and the export interval an hour: only the recording
on the loop is timed, never an export (that runs on a thread of its own).

    .venv/bin/python bench/otel_chunk_gaps.py [--probes 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from monitor.otel.export import OtelTelemetry
from monitor.otel.semconv import Endpoint
from monitor.otel.settings import OtelConfig, resolve
from monitor.probe.result import CHUNK_GAPS_KEPT, Sample


def sample(gaps: int) -> Sample:
    return Sample(
        "t",
        "m",
        "openai-chat",
        "short",
        1,
        sent_at=datetime.now(UTC),
        ttft_ms=120.0,
        first_event_ms=100.0,
        total_ms=900.0,
        setup_ms=0.1,
        ttfb_ms=90.0,
        prompt_tokens=10,
        completion_tokens=gaps + 1,
        decode_tps=50.0,
        chunk_gaps_ms=tuple(20.0 + i % 7 for i in range(gaps)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    settings = resolve(OtelConfig(endpoint="http://127.0.0.1:9", export_interval_s=3600), {})
    assert settings is not None
    telemetry = OtelTelemetry(
        settings,
        registry=CollectorRegistry(),
        location="bench",
        endpoints={"p": Endpoint("openai-chat", "http://127.0.0.1:8400/v1")},
        ttft_buckets_s=(0.1, 1),
    )
    sizes = (0, 3, 63, CHUNK_GAPS_KEPT)
    timings: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(args.rounds):
        for n in sizes:  # interleaved, so every size shares the machine's noise
            probes = [sample(n) for _ in range(args.probes)]
            start = time.perf_counter_ns()
            for probe in probes:
                telemetry.observe_sample(probe, provider="p", probe_job="j")
            timings[n].append((time.perf_counter_ns() - start) / args.probes / 1000)
    base = statistics.median(timings[0])
    for n in sizes:
        median = statistics.median(timings[n])
        print(f"gaps={n:3d}  observe_sample {median:7.1f} us/probe  (+{median - base:6.1f} us over no gaps)")
    telemetry.close(timeout_s=0.1)


if __name__ == "__main__":
    main()
