"""OpenTelemetry export in this process, to a loopback OTLP/HTTP receiver that decodes with the official
opentelemetry-proto messages: the detector's incidents as log records (through the real detection
service and store, SQLite and PostgreSQL), and a disturbed probe's tokens, counted though its timings
are left out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from monitor.detect.service import DetectionService
from monitor.metrics.definitions import Metrics
from monitor.otel import semconv
from monitor.otel.export import OtelTelemetry
from monitor.otel.settings import OtelConfig, resolve
from monitor.store.models import IncidentRow
from monitor.store.repository import Repository
from tests.support.detection import PROMPTS, config, outage, rows, run_ticks
from tests.support.otlp_receiver import Receiver, attributes, metrics_by_name, otlp_receiver
from tests.support.store_fixtures import T0, Backend, make_samples

pytest_plugins = ("tests.support.store_fixtures",)


def telemetry_to(receiver: Receiver) -> OtelTelemetry:
    settings = resolve(OtelConfig(endpoint=receiver.url), {})
    assert settings is not None
    return OtelTelemetry(settings, registry=CollectorRegistry(), location="lab", endpoints={}, ttft_buckets_s=(0.1, 1))


def log_records(receiver: Receiver) -> list[Any]:
    return [
        record
        for request in receiver.of("logs")
        for resource in request.message.resource_logs
        for scope in resource.scope_logs
        for record in scope.log_records
    ]


async def test_incidents_the_detector_opens_and_resolves_reach_the_collector_with_their_figures(
    backend: Backend,
) -> None:
    engine = backend.engine()
    with otlp_receiver() as receiver:
        telemetry = telemetry_to(receiver)
        try:
            metrics = Metrics(location="lab", telemetry=telemetry)
            service = DetectionService(engine, Repository(engine), config(), outbox=None, metrics=metrics)
            with capture_logs() as logged:
                await run_ticks(engine, service, outage({"a1": 3.0}), targets=("a1",))
            incidents = await rows(engine, IncidentRow)
        finally:
            telemetry.close()
            await engine.dispose()
        receiver.wait_for("logs")
        records = log_records(receiver)
    # Two series of a1 (its two prompts) paged and recovered: each incident one record opened, one resolved.
    assert len(incidents) == 2 and all(i.resolved_at is not None for i in incidents), incidents
    names = sorted(record.event_name for record in records)
    assert names == ["ttft_monitor.incident.opened"] * 2 + ["ttft_monitor.incident.resolved"] * 2, names
    opened = [attributes(r.attributes) for r in records if r.event_name.endswith(".opened")]

    def figures(attrs: dict[str, Any]) -> tuple[Any, ...]:
        keys = ("prompt", "incident.severity", "incident.baseline_ms", "incident.observed_ms", "incident.ratio")
        return tuple(attrs[f"ttft_monitor.{key}"] for key in keys)

    # Opened with the figures the detector's own log line gave; resolved with those the store kept last.
    said = sorted(
        (e["prompt"], e["severity"], e["baseline_ms"], e["observed_ms"], e["ratio"])
        for e in logged
        if e["event"] == "incident_open"
    )
    assert len(said) == 2
    assert sorted(figures(a) for a in opened) == said
    resolved = [attributes(r.attributes) for r in records if r.event_name.endswith(".resolved")]
    stored = sorted((i.severity, i.baseline_ms, i.observed_ms, i.ratio) for i in incidents)
    assert sorted(figures(a)[1:] for a in resolved) == stored
    for attrs in opened:
        assert attrs["ttft_monitor.target"] == "a1"
        assert attrs["ttft_monitor.location"] == "lab"
        assert attrs["ttft_monitor.incident.kind"] == "regression"
    assert sorted(a["ttft_monitor.prompt"] for a in opened) == sorted(PROMPTS)
    assert {r.severity_text for r in records if r.event_name.endswith(".opened")} == {"WARN"}
    assert {r.severity_text for r in records if r.event_name.endswith(".resolved")} == {"INFO"}


def test_a_disturbed_probe_counts_its_tokens_but_none_of_its_timings() -> None:
    with otlp_receiver() as receiver:
        telemetry = telemetry_to(receiver)
        try:
            clean, late = (s for s in make_samples("fast", "short", at=T0, rounds=2, warmup=0))
            late = replace(late, disturbed=True, self_delay_ms=80.0)
            for sample in (clean, late):
                telemetry.observe_sample(sample, provider="p", probe_job="j")
        finally:
            telemetry.close()
        metrics = metrics_by_name(receiver.wait_for("metrics"))
    assert clean.prompt_tokens is not None and late.prompt_tokens is not None
    (tokens,) = metrics[semconv.USAGE_INPUT][-1].sum.data_points
    assert tokens.as_int == clean.prompt_tokens + late.prompt_tokens  # both probes spent them
    (output,) = metrics[semconv.USAGE_OUTPUT][-1].sum.data_points
    assert output.as_int == (clean.completion_tokens or 0) + (late.completion_tokens or 0)
    for name in (semconv.DURATION, semconv.TIME_TO_FIRST_CHUNK, semconv.TTFT):
        (point,) = metrics[name][-1].histogram.data_points
        assert point.count == 1, name  # the clean probe only
    (disturbed,) = metrics[semconv.DISTURBED][-1].sum.data_points
    assert disturbed.as_int == 1
