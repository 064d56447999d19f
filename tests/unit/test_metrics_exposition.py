"""The fast text exposition writes what prometheus_client's generate_latest writes, byte for byte, and
`metrics.per_series` exposes the documented series per probe series in each mode."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from monitor.alert.metrics import AlertMetrics
from monitor.metrics import exposition
from monitor.metrics.definitions import PER_SERIES_MODES, Metrics, MonitorRegistry, PerSeries
from monitor.metrics.docs import series_per_probe_series
from monitor.metrics.exposition import render, render_parts
from monitor.probe.result import ErrorClass, Sample

HOSTILE = ("back\\slash", 'quote"d', "new\nline", "ünïcode", "", "plain")


def sample(target: str, prompt: str, round_: int, *, error: ErrorClass | None = None) -> Sample:
    if error is not None:
        return Sample(target=target, model="m", api="openai-chat", prompt=prompt, round=round_, error=error)
    return Sample(
        target=target,
        model=f"org/{target}",
        api="openai-chat",
        prompt=prompt,
        round=round_,
        ttft_ms=5.0 + 997.3 * round_,
        ttfa_ms=7.25 * (round_ + 1),
        ttfb_ms=1.5,
        setup_ms=0.0,
        decode_tps=1234567.0,  # past floatToGoString's switch to exponents
    )


def filled(mode: PerSeries) -> Metrics:
    metrics = Metrics(location="lab", per_series=mode)
    AlertMetrics(metrics.registry).outbox_pending.set(3)
    for target in HOSTILE:
        for prompt in ("short", "long"):
            for round_ in range(3):
                metrics.observe_sample(
                    sample(target, prompt, round_), provider="p", probe_job="j", slo_ttft_ms=500, slo_objective=0.99
                )
            metrics.observe_sample(sample(target, prompt, 9, error=ErrorClass.TIMEOUT_TOTAL), provider="p")
            metrics.observe_baseline(
                (target, prompt, "lab"), baseline_ms=300, run_median_ms=1e-7, ticket_ratio=1.5, ticket_min_delta_ms=50
            )
            metrics.observe_regression_state((target, prompt, "lab"), 2)
    metrics.start_job_series("j")
    metrics.job_last_run.labels("j").set(1.8e9)
    metrics.loop_lag.observe(0.003)
    metrics.spool_bytes.set(float("nan"))
    metrics.database_up.set(float("inf"))
    return metrics


@pytest.mark.parametrize("mode", PER_SERIES_MODES)
def test_the_daemons_registry_renders_exactly_as_generate_latest_writes_it(mode: PerSeries) -> None:
    registry = filled(mode).registry
    assert render(registry) == generate_latest(registry)


class Custom(Collector):
    def collect(self) -> list[Metric]:
        family = GaugeMetricFamily("custom_thing", "Help with \\ and\nnewline.", labels=["zeta", "alpha"])
        family.add_metric(["z", 'a"'], 2.5, timestamp=1700000000.123)
        return [family]


def test_other_collectors_and_plain_registries_render_as_generate_latest_writes_them() -> None:
    for registry in (MonitorRegistry(), CollectorRegistry()):
        Counter("events", "Events.", ["kind"], registry=registry).labels("x").inc(2)
        Gauge("plain", "No labels.", registry=registry).set(-3e9)
        Histogram("sizes", "Sizes.", ["b", "a"], buckets=(-1, 0.5, 10), registry=registry).labels("1", "2").observe(4)
        Summary("waits", "Waits.", registry=registry).observe(0.25)
        Info("build", "Build.", registry=registry).info({"version": "1"})
        gauge = Gauge("computed", "From a function.", registry=registry)
        gauge.set_function(lambda: 7)
        registry.register(Custom())
        # A plain registry keeps its `_created` series, as OpenMetrics-only gauges after each family.
        assert _without_created_values(render(registry)) == _without_created_values(generate_latest(registry))


def _without_created_values(text: bytes) -> list[bytes]:
    # `_created` is the time the metric was made: the same object, read twice, says the same.
    return [line.rsplit(b" ", 1)[0] if b"_created" in line else line for line in text.splitlines()]


def test_unregistered_metrics_leave_the_rendering() -> None:
    registry = MonitorRegistry()
    gone = Counter("gone", "Gone.", registry=registry)
    Counter("kept", "Kept.", registry=registry)
    registry.unregister(gone)
    assert b"gone" not in render(registry)
    assert render(registry) == generate_latest(registry)


@pytest.mark.parametrize(("mode", "per_probe_series"), [("full", 68), ("summary", 24), ("off", 0)])
def test_each_mode_exposes_the_documented_series_per_probe_series(mode: PerSeries, per_probe_series: int) -> None:
    assert series_per_probe_series(mode) == per_probe_series


def test_summary_mode_keeps_sum_and_count_under_the_histograms_names_and_off_mode_keeps_no_target() -> None:
    summary = render(filled("summary").registry).decode()
    assert "# TYPE ttft_monitor_ttft_seconds summary" in summary
    assert 'ttft_monitor_ttft_seconds_count{location="lab",model="org/plain",probe_job="j",' in summary
    assert "ttft_monitor_ttft_seconds_sum{" in summary and "ttft_monitor_ttfa_seconds_sum{" in summary
    assert "ttft_monitor_ttft_seconds_bucket" not in summary and "ttft_monitor_ttfa_seconds_bucket" not in summary
    assert "ttft_monitor_regression_state{" in summary
    off = render(filled("off").registry).decode()
    assert "target=" not in off
    assert "ttft_monitor_ttft_seconds" not in off
    assert 'ttft_monitor_job_runs_total{probe_job="j",result="ok"} 0.0' in off
    assert "ttft_monitor_alert_outbox_pending 3.0" in off


def test_metric_objects_it_cannot_read_are_rendered_through_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = filled("full").registry

    def moved(*_args: object) -> bool:
        raise AttributeError("'Counter' object has no attribute '_metrics'")  # a later prometheus_client

    monkeypatch.setattr(exposition._Lines, "wrapper", moved)
    assert render(registry) == generate_latest(registry)


def test_rendering_in_parts_holds_little_more_than_the_body_it_returns() -> None:
    # A daemon of 500 probe series renders 5 MB; holding every line as a str until the end, then the joined
    # str, then its bytes, took its resident memory 12 MB past what it needs at rest at every scrape.
    metrics = Metrics(location="lab", per_series="full")
    for t in range(40):
        for prompt in ("short", "long", "xl"):
            for round_ in range(3):
                metrics.observe_sample(sample(f"target-{t:03d}", prompt, round_), provider="p", probe_job="j")
            metrics.observe_baseline(
                (f"target-{t:03d}", prompt, "lab"), baseline_ms=300, run_median_ms=310, ticket_ratio=1.5,
                ticket_min_delta_ms=50,
            )  # fmt: skip
    render(metrics.registry)  # the label caches and the like, made once
    tracemalloc.start()
    try:
        parts = render_parts(metrics.registry)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = sum(map(len, parts))
    assert size > 300_000
    assert peak < 2 * size, f"rendering {size} bytes peaked at {peak} bytes"
    assert b"".join(parts) == render(metrics.registry) == generate_latest(metrics.registry)


async def test_the_listener_reuses_a_fresh_rendering_and_keeps_none_past_its_reuse() -> None:
    from monitor.metrics.server import _RenderedMetrics

    metrics = filled("full")
    rendered = _RenderedMetrics(metrics.registry, reuse_factor=0.0, min_reuse_s=0.2)
    first = await rendered.body()
    assert await rendered.body() is first  # scraped again within its reuse: the same rendering
    assert b"".join(first) == render(metrics.registry)
    await asyncio.sleep(0.3)
    assert rendered._body == []  # nothing held between scrapes (5 MB at 500 series)
    assert await rendered.body() is not first
