"""The fast text exposition writes what prometheus_client's generate_latest writes, byte for byte, and
`metrics.per_series` exposes the documented series per probe series in each mode."""

from __future__ import annotations

import asyncio
import gzip
import math
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from monitor.alert.metrics import AlertMetrics
from monitor.metrics import exposition, server
from monitor.metrics.definitions import PER_SERIES_MODES, Metrics, MonitorRegistry, PerSeries
from monitor.metrics.docs import series_per_probe_series
from monitor.metrics.exposition import render, render_parts
from monitor.metrics.lean import LeanBuckets, LeanCounter, LeanGauge, LeanHistogram, LeanSummary
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


def forty_targets(targets: int = 40) -> Metrics:
    metrics = Metrics(location="lab", per_series="full")
    for t in range(targets):
        for prompt in ("short", "long", "xl"):
            for round_ in range(3):
                metrics.observe_sample(sample(f"target-{t:03d}", prompt, round_), provider="p", probe_job="j")
            metrics.observe_baseline(
                (f"target-{t:03d}", prompt, "lab"), baseline_ms=300, run_median_ms=310, ticket_ratio=1.5,
                ticket_min_delta_ms=50,
            )  # fmt: skip
    return metrics


def rendered_peak(metrics: Metrics, *, gzip: bool) -> tuple[exposition.Rendering, int]:
    render(metrics.registry)  # the label caches and the like, made once
    tracemalloc.start()
    try:
        rendering = render_parts(metrics.registry, gzip=gzip)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return rendering, peak


def test_rendering_in_parts_holds_little_more_than_the_body_it_returns() -> None:
    # A daemon of 500 probe series renders 5 MB; holding every line as a str until the end, then the joined
    # str, then its bytes, took its resident memory 12 MB past what it needs at rest at every scrape.
    metrics = forty_targets()
    rendering, peak = rendered_peak(metrics, gzip=False)
    size = sum(map(len, rendering.pieces))
    assert size > 300_000 and size == rendering.text_bytes and not rendering.gzip
    assert peak < 1.3 * size, f"rendering {size} bytes peaked at {peak} bytes"
    assert b"".join(rendering.pieces) == render(metrics.registry) == generate_latest(metrics.registry)


def test_a_compressed_rendering_is_the_same_text_and_never_holds_it_whole() -> None:
    metrics = forty_targets(160)  # 480 probe series, about the daemon bench's 500
    rendering, peak = rendered_peak(metrics, gzip=True)
    text = generate_latest(metrics.registry)
    assert rendering.gzip and rendering.text_bytes == len(text)
    assert gzip.decompress(b"".join(rendering.pieces)) == text
    compressed = sum(map(len, rendering.pieces))
    assert compressed < len(text) / 5
    # The pieces of text are compressed as they are written: the text is never held whole.
    assert peak < len(text) / 5, f"{len(text)} bytes of text, compressed to {compressed}, peaked at {peak}"


async def test_the_text_for_a_client_without_gzip_comes_in_pieces_of_bounded_size() -> None:
    # Each compressed piece decompressed whole was about 1.1 MB of text at 480 series, held while the transport
    # buffered the last: a scrape without gzip took the daemon 2.5 MB over its resting peak.
    metrics = forty_targets(160)
    rendering = render_parts(metrics.registry, gzip=True)
    pieces = [piece async for piece in server._text_pieces(rendering)]
    assert b"".join(pieces) == generate_latest(metrics.registry)
    assert max(map(len, pieces)) <= server.METRICS_WRITE_BYTES < rendering.text_bytes / 4


def test_a_fast_path_failing_half_way_renders_everything_again_through_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = forty_targets()
    wrapper = exposition._Lines.wrapper
    calls = 0

    def fails_on_the_fourth(self: exposition._Lines, metric: object, out: list[str], take: object) -> bool:
        nonlocal calls
        calls += 1
        if calls == 4:  # after three families went into the (compressed) pieces
            raise KeyError("_metrics")
        return wrapper(self, metric, out, take)  # type: ignore[arg-type]

    monkeypatch.setattr(exposition._Lines, "wrapper", fails_on_the_fourth)
    for compressed in (False, True):
        calls = 0
        rendering = render_parts(metrics.registry, gzip=compressed)
        body = b"".join(rendering.pieces)
        assert (gzip.decompress(body) if compressed else body) == generate_latest(metrics.registry)


def test_lean_families_keep_no_lock_per_value_and_render_through_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def series(kind: type, registry: CollectorRegistry) -> object:
        family = kind("h", "H.", ["target"], buckets=(0.1, 1, 10), registry=registry)
        for i in range(300):
            family.labels(f"t{i}").observe(0.5)
        return family

    def size(kind: type) -> int:
        tracemalloc.start()
        try:
            kept = series(kind, CollectorRegistry())
            traced = tracemalloc.get_traced_memory()[0]
            del kept
        finally:
            tracemalloc.stop()
        return traced

    # The least of three: tracemalloc counts what every thread of the process allocates meanwhile (a test worker
    # has others), which only adds.
    sizes = {kind: min(size(kind) for _ in range(3)) for kind in (Histogram, LeanHistogram)}
    assert sizes[LeanHistogram] < 0.75 * sizes[Histogram], sizes
    registry = MonitorRegistry()
    series(LeanHistogram, registry)
    LeanCounter("c", "C.", ["k"], registry=registry).labels("x").inc(2)
    LeanGauge("g", "G.", registry=registry).set(3)
    LeanSummary("s", "S.", registry=registry).observe(4)
    expected = generate_latest(registry)

    def no_collect(self: object) -> list[Metric]:
        raise AssertionError("a lean family went through collect()")

    lean: tuple[type, ...] = (LeanHistogram, LeanCounter, LeanGauge, LeanSummary)
    for lean_kind in lean:
        monkeypatch.setattr(lean_kind, "collect", no_collect)
    assert render(registry) == expected


async def test_the_listener_reuses_a_fresh_rendering_and_keeps_none_past_its_reuse() -> None:
    from monitor.metrics.server import _RenderedMetrics

    metrics = filled("full")
    rendered = _RenderedMetrics(metrics.registry, reuse_factor=0.0, min_reuse_s=0.2)
    first = await rendered.body()
    assert await rendered.body() is first  # scraped again within its reuse: the same rendering
    assert gzip.decompress(b"".join(first.pieces)) == render(metrics.registry)
    await asyncio.sleep(0.3)
    assert rendered._body is None  # nothing held between scrapes
    assert await rendered.body() is not first


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("gzip, deflate", True),
        ("GZIP", True),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("identity", False),
        ("", False),
        ("br, deflate", False),
    ],
)
def test_gzip_is_sent_only_to_clients_that_accept_it(header: str, expected: bool) -> None:
    from monitor.metrics.server import accepts_gzip

    assert accepts_gzip(header) is expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([0.1, 1.0, 10.0, -1.0, 0.0]), st.floats(-5, 50)), max_size=40))
def test_a_lean_histogram_counts_into_the_buckets_prometheus_clients_own_does(values: list[float]) -> None:
    # Its counts live in one array per child (LeanBuckets): observe() indexes it as prometheus_client's
    # list of values, and the fast rendering reads the array.
    plain, lean = MonitorRegistry(), MonitorRegistry()
    for kind, registry in ((Histogram, plain), (LeanHistogram, lean)):
        family = kind("h", "H.", ["target"], buckets=(0.1, 1, 10), registry=registry)
        for index, value in enumerate(values):
            family.labels(f"t{index % 3}").observe(value)
    assert _without_created_values(render(lean)) == _without_created_values(generate_latest(plain))
    assert generate_latest(lean) == render(lean)


@pytest.mark.parametrize(
    "amount", [0.0, 0.005, 0.0051, 0.1, 2.5, 2.5000001, 1e9, -1.0, math.inf, -math.inf, math.nan, 3]
)
def test_a_lean_histogram_counts_each_observation_in_the_bucket_prometheus_client_does(amount: float) -> None:
    lean = LeanHistogram("lean_h", "h", ["a"], registry=None, buckets=(0.005, 0.1, 2.5))
    plain = Histogram("plain_h", "h", ["a"], registry=None, buckets=(0.005, 0.1, 2.5))
    lean.labels("x").observe(amount)
    plain.labels("x").observe(amount)
    lean_child, plain_child = lean.labels("x"), plain.labels("x")
    buckets = lean_child._buckets
    assert isinstance(buckets, LeanBuckets)
    assert list(buckets.counts()) == [b.get() for b in plain_child._buckets]
    assert str(lean_child._sum.get()) == str(plain_child._sum.get())


def test_a_lean_familys_children_are_found_as_prometheus_client_finds_them() -> None:
    gauge = LeanGauge("lean_g", "g", ["a", "b"], registry=None)
    child = gauge.labels("1", "x")
    assert gauge.labels("1", "x") is child and gauge.labels(a="1", b="x") is child
    assert gauge.labels(1, "x") is child  # not a str: converted as prometheus_client converts it
    with pytest.raises(ValueError, match="label count"):
        gauge.labels("1")
    with pytest.raises(ValueError, match="already has labels"):
        child.labels("1", "x")
    gauge.remove("1", "x")
    assert gauge.labels("1", "x") is not child


def test_a_lean_child_holds_its_familys_name_options_and_bounds_not_copies() -> None:
    histogram = LeanHistogram("lean_shared", "h", ["a"], registry=None, buckets=(0.1, 1.0))
    child = histogram.labels("x")
    for name in ("_name", "_kwargs", "_upper_bounds", "_documentation"):
        assert vars(child)[name] is vars(histogram)[name], name
