"""OpenTelemetry export end to end: `once` and the real daemon against the simulator, sending to a
loopback OTLP/HTTP receiver that decodes with the official opentelemetry-proto messages; a dead or
hung collector neither delays a probe nor loses a sample, and header secrets never reach the logs."""

from __future__ import annotations

import contextlib
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from monitor.otel import semconv
from tests.conftest import ROOT, SimProcess, run_cli, silent_listener
from tests.support.daemon import (
    http_get,
    sqlite_rows,
    start_daemon,
    stop_daemon,
    upgrade,
    wait_ready,
    write_config,
)
from tests.support.otlp_receiver import REQUEST_ID_PREFIX, attributes, metrics_by_name, otlp_receiver
from tests.support.ports import free_port

SECRET = "otlp-s3cret-token-4711"


def with_otel(config: Path, otel: str) -> Path:
    config.write_text(config.read_text() + otel)
    return config


def tolerant(config: Path) -> Path:
    """These tests are about export, not the monitor's own lateness: on a loaded machine (two shared
    cores) samples past the default 5 ms self-delay bound would be disturbed and left out of the timings."""
    config.write_text(config.read_text() + "probe_self_delay_bound_ms: 1000\n")
    return config


def stored(folder: Path) -> list[tuple[float | None, float | None, float | None, int | None]]:
    return sqlite_rows(
        folder, "select ttft_us / 1000.0, first_event_us / 1000.0, total_us / 1000.0, prompt_tokens from samples"
    )


def last_point(metrics: dict[str, list], name: str):
    assert name in metrics, f"{name} not exported; got {sorted(metrics)}"
    return metrics[name][-1]


def test_once_exports_genai_metrics_that_match_the_stored_samples(sim: SimProcess, tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        config = tolerant(write_config(tmp_path, sim, rounds=3))
        upgrade(config)
        with_otel(
            config,
            f"""otel:
  endpoint: "{receiver.url}"
  headers: {{x-api-key: "${{OTLP_KEY}}"}}
  resource_attributes: {{deployment.environment.name: test}}
""",
        )
        result = run_cli("once", "--config", str(config), env={"OTLP_KEY": SECRET})
        assert result.code == 0, str(result)
        requests = receiver.of("metrics")
    assert requests, "once exited without exporting its metrics"
    assert all(r.headers.get("x-api-key") == SECRET for r in requests)
    assert SECRET not in result.stdout + result.stderr

    # Three probes of a healthy simulator: every stored field is set (a None would fail the sums below).
    rows = cast(list[tuple[float, float, float, int]], stored(tmp_path))
    assert len(rows) == 3
    metrics = metrics_by_name(requests)
    resource = attributes(requests[-1].message.resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "ttft-monitor"
    assert resource["deployment.environment.name"] == "test"

    ttfc = last_point(metrics, semconv.TIME_TO_FIRST_CHUNK)
    assert ttfc.unit == "s"
    (point,) = ttfc.histogram.data_points
    assert list(point.explicit_bounds) == list(semconv.GENAI_SECONDS_BUCKETS)
    assert point.count == 3
    assert point.sum == pytest.approx(sum(r[1] for r in rows) / 1000, rel=1e-9)
    attrs = attributes(point.attributes)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "openai"  # an OpenAI-compatible server speaks OpenAI's API
    assert attrs["gen_ai.request.model"] == "gpt-4o-mini"
    assert attrs["server.address"] == "127.0.0.1"
    assert attrs["server.port"] == int(sim.url.rsplit(":", 1)[1])
    assert attrs["user_agent.synthetic.type"] == "test"
    assert attrs["ttft_monitor.target"] == "fast"
    assert "error.type" not in attrs

    # One observation per gap between consecutive token chunks: tokens - 1 per probe; their sum is each
    # probe's decode time, which the stored decode rate gives back (the client's own formula).
    chunks = sqlite_rows(tmp_path, "select token_events, completion_tokens, decode_tps from samples")
    assert all(events > 1 for events, _, _ in chunks), chunks
    per_chunk = last_point(metrics, semconv.TIME_PER_OUTPUT_CHUNK)
    assert per_chunk.unit == "s"
    (gaps,) = per_chunk.histogram.data_points
    assert list(gaps.explicit_bounds) == list(semconv.GENAI_SECONDS_BUCKETS)
    assert gaps.count == sum(events - 1 for events, _, _ in chunks)
    # No decode rate: every token chunk came in one read (a loaded machine), so every gap is 0 s.
    decode_s = sum(((tokens or events) - 1) / tps if tps else 0.0 for events, tokens, tps in chunks)
    assert gaps.sum == pytest.approx(decode_s, rel=1e-6, abs=1e-9)
    assert attributes(gaps.attributes)["gen_ai.request.model"] == "gpt-4o-mini"

    # The whole operation from the request's start, set-up included: its span's duration (the conventions).
    (duration,) = last_point(metrics, semconv.DURATION).histogram.data_points
    assert duration.count == 3
    whole = sqlite_rows(tmp_path, "select setup_us / 1000.0, total_us / 1000.0 from samples")
    assert all(setup is not None and setup > 0 for setup, _ in whole), whole
    assert duration.sum == pytest.approx(sum(setup + total for setup, total in whole) / 1000, rel=1e-9)

    ttft = last_point(metrics, semconv.TTFT)
    (ttft_point,) = ttft.histogram.data_points
    assert ttft_point.count == 3
    assert ttft_point.sum == pytest.approx(sum(r[0] for r in rows) / 1000, rel=1e-9)
    assert ttft_point.min == pytest.approx(min(r[0] for r in rows) / 1000, rel=1e-9)

    usage = last_point(metrics, semconv.USAGE_INPUT)
    assert usage.unit == "{token}"
    assert usage.sum.is_monotonic
    (tokens,) = usage.sum.data_points
    assert tokens.as_int == sum(r[3] for r in rows)
    assert attributes(tokens.attributes)["gen_ai.token.modality"] == "text"

    (probes,) = last_point(metrics, semconv.PROBES).sum.data_points
    assert probes.as_int == 3


def test_the_standard_environment_turns_export_on_and_its_headers_stay_secret(
    sim: SimProcess,
    tmp_path: Path,
) -> None:
    with otlp_receiver() as receiver:
        config = tolerant(write_config(tmp_path, sim, rounds=1))
        upgrade(config)
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{SECRET}",
            "OTEL_SERVICE_NAME": "synthetic-llm",
        }
        result = run_cli("once", "--config", str(config), env=env)
        assert result.code == 0, str(result)
        requests = receiver.of("metrics")
    assert requests
    assert requests[-1].headers["Authorization"] == f"Bearer {SECRET}"
    assert attributes(requests[-1].message.resource_metrics[0].resource.attributes)["service.name"] == "synthetic-llm"
    assert SECRET not in result.stdout + result.stderr


def test_a_loopback_collector_is_reached_directly_though_a_proxy_is_set(
    sim: SimProcess,
    tmp_path: Path,
) -> None:
    # The project's proxy policy (monitor.probe.proxy): loopback is never proxied. The OTLP exporter's
    # HTTP library would send it to the (dead) proxy of the environment.
    with otlp_receiver() as receiver:
        config = tolerant(write_config(tmp_path, sim, rounds=1))
        upgrade(config)
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "HTTP_PROXY": "http://127.0.0.1:9",
            "HTTPS_PROXY": "http://127.0.0.1:9",
        }
        result = run_cli("once", "--config", str(config), env=env)
        assert result.code == 0, str(result)
        assert receiver.of("metrics"), result.stdout + result.stderr


def median_ttft(folder: Path) -> float:
    return statistics.median(r[0] for r in stored(folder) if r[0] is not None)


@contextlib.contextmanager
def collector_away(kind: str) -> Iterator[int]:
    """A collector that is away: `hung` accepts and never answers, `dead` refuses (nothing listens)."""
    if kind == "hung":
        with silent_listener() as port:
            yield port
    else:
        yield free_port()


@pytest.mark.realtime
@pytest.mark.timeout(180)  # two `once` runs of five probes and their exits, on a loaded machine
@pytest.mark.parametrize("kind", ["hung", "dead"])
def test_a_collector_that_is_away_delays_no_probe_and_loses_no_sample(
    sim: SimProcess, tmp_path: Path, kind: str
) -> None:
    rounds = 5
    off = tmp_path / "off"
    off.mkdir()
    config_off = tolerant(write_config(off, sim, rounds=rounds))
    upgrade(config_off)
    started = time.monotonic()
    result_off = run_cli("once", "--config", str(config_off))
    took_off = time.monotonic() - started
    assert result_off.code == 0, str(result_off)

    on = tmp_path / "on"
    on.mkdir()
    with collector_away(kind) as port:
        config_on = with_otel(
            tolerant(write_config(on, sim, rounds=rounds)),
            f"""otel:
  endpoint: "http://127.0.0.1:{port}"
  timeout_s: 1
  export_interval_s: 0.2
  traces: true
  headers: {{x-api-key: "{SECRET}"}}
""",
        )
        upgrade(config_on)
        started = time.monotonic()
        result_on = run_cli("once", "--config", str(config_on))
        took_on = time.monotonic() - started
    assert result_on.code == 0, str(result_on)
    assert len(stored(on)) == len(stored(off)) == rounds
    # The simulator without noise answers alike each time: an export the probe waited on would add its
    # 1 s timeout (hung) or its retries (dead) to the TTFT; the margin is for the shared machine's jitter.
    assert abs(median_ttft(on) - median_ttft(off)) < 50, (median_ttft(on), median_ttft(off))
    assert "otel_export_failed" in result_on.stdout
    assert SECRET not in result_on.stdout + result_on.stderr
    # Exit waits for the last export at most about the bound per signal, never for the collector.
    assert took_on < took_off + 3 * (1 + 1) + 2, (took_on, took_off)


def test_the_daemon_counts_failed_exports_to_a_dead_collector(sim: SimProcess, tmp_path: Path) -> None:
    dead = free_port()  # nothing listens there
    config = with_otel(
        write_config(tmp_path, sim, schedule="* * * * * */1", rounds=1),
        f"""otel:
  endpoint: "http://127.0.0.1:{dead}"
  timeout_s: 0.5
  export_interval_s: 0.3
""",
    )
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("otel_export_failed", timeout=20)
        daemon.wait_for("probe_sample", count=2, timeout=20)
        _, body = http_get(daemon.metrics_url + "/metrics")
    finally:
        assert stop_daemon(daemon) == 0
    failed = re.search(r'ttft_monitor_otel_exports_total\{outcome="failed",signal="metrics"\} (\S+)', body)
    assert failed is not None and float(failed.group(1)) >= 1, body
    assert re.search(r'ttft_monitor_otel_dropped_total\{signal="metrics"\} [1-9]', body), body
    assert sqlite_rows(tmp_path, "select count(*) from samples")[0][0] >= 2


def test_traces_join_the_request_by_traceparent_and_carry_the_phases(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        config = tmp_path / "config.yaml"
        config.write_text(
            f"""
database:
  url: "sqlite+aiosqlite:///{tmp_path}/ttft.db"
  state_dir: "{tmp_path}/state"
probe_self_delay_bound_ms: 1000
providers:
  standin:
    base_url: "{receiver.url}/v1"
    api: openai-chat
targets:
  t:
    provider: standin
    model: stand-in
    params: {{max_tokens: 4}}
prompts:
  short: {{tokens: 128}}
jobs:
  - {{name: j, schedule: "*/5 * * * *", targets: [t], prompts: [short], rounds: 2, warmup: 0, pause_s: 0}}
"""
        )
        upgrade(config)
        with_otel(config, f'otel: {{endpoint: "{receiver.url}", traces: true}}\n')
        result = run_cli("once", "--config", str(config))
        assert result.code == 0, str(result)
        sent = [h["traceparent"] for h in receiver.chat_headers]
        traces = receiver.of("traces")
        metrics = metrics_by_name(receiver.of("metrics"))
    spans = [span for r in traces for rs in r.message.resource_spans for ss in rs.scope_spans for span in ss.spans]
    spans = [span for span in spans if span.kind == span.SPAN_KIND_CLIENT]  # the run's span aside (the next test)
    assert len(sent) == len(spans) == 2
    assert sorted(attributes(s.attributes)["ttft_monitor.request_id"] for s in spans) == [
        f"{REQUEST_ID_PREFIX}{n}" for n in (1, 2)
    ]
    # The conventions: the duration metric equals the span's duration (to the microsecond of the span's stamps).
    (duration,) = last_point(metrics, semconv.DURATION).histogram.data_points
    span_s = sum((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 for span in spans)
    assert duration.count == 2
    assert abs(duration.sum - span_s) < 2 * 2e-6, (duration.sum, span_s)
    rows = sqlite_rows(
        tmp_path, "select ttft_us / 1000.0, first_event_us / 1000.0, total_us / 1000.0 from samples order by sent_at"
    )
    by_id = {(span.trace_id.hex(), span.span_id.hex()): span for span in spans}
    for traceparent in sent:
        version, trace_id, span_id, flags = traceparent.split("-")
        assert (version, flags) == ("00", "01")
        span = by_id[(trace_id, span_id)]  # the span the server was told is its parent
        assert span.name == "chat stand-in"
        assert span.kind == span.SPAN_KIND_CLIENT
        attrs = attributes(span.attributes)
        assert attrs["user_agent.synthetic.type"] == "test"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["gen_ai.response.model"] == "stand-in"
        assert attrs["gen_ai.usage.input_tokens"] == 7
        assert attrs["ttft_monitor.request_id"].startswith(REQUEST_ID_PREFIX)  # the server's id, to join its logs
        assert attrs["ttft_monitor.sample_id"]
        events = {event.name: event.time_unix_nano for event in span.events}
        assert {"request_sent", "response_head", "first_event", "first_token", "first_answer_token"} <= set(events)
        # The first chunk (role only) comes before the first token: the mapping docs/opentelemetry.md states.
        assert events["first_event"] <= events["first_token"]
        ttft_s = (events["first_token"] - events["request_sent"]) / 1e9
        assert any(abs(ttft_s - row[0] / 1000) < 1e-5 for row in rows), (ttft_s, rows)
        assert any(abs(attrs["gen_ai.response.time_to_first_chunk"] - row[1] / 1000) < 1e-9 for row in rows)


def test_incidents_reach_the_collector_as_log_records(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from monitor.otel.export import OtelTelemetry
    from monitor.otel.incident import IncidentReading
    from monitor.otel.settings import OtelConfig, resolve

    with otlp_receiver() as receiver:
        settings = resolve(OtelConfig(endpoint=receiver.url), {})
        assert settings is not None
        telemetry = OtelTelemetry(
            settings, registry=CollectorRegistry(), location="lab", endpoints={}, ttft_buckets_s=(0.1, 1)
        )
        telemetry.observe_incident(
            IncidentReading(
                "open",  # the detector's word (detect.rules.Action)
                series=("fast", "short", "lab"),
                kind="regression",
                severity="page",
                baseline_ms=200.0,
                observed_ms=520.0,
                ratio=2.6,
                error_class=None,
            )
        )
        telemetry.close()
        logs = receiver.wait_for("logs")
    records = [rec for r in logs for rl in r.message.resource_logs for sl in rl.scope_logs for rec in sl.log_records]
    (record,) = records
    assert record.event_name == "ttft_monitor.incident.opened"
    attrs = attributes(record.attributes)
    assert attrs["ttft_monitor.target"] == "fast"
    assert attrs["ttft_monitor.incident.severity"] == "page"
    assert attrs["ttft_monitor.incident.ratio"] == 2.6
    assert record.severity_text == "WARN"


def test_a_run_is_the_parent_span_of_its_probes_in_one_trace(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        config = tmp_path / "config.yaml"
        config.write_text(
            f"""
database:
  url: "sqlite+aiosqlite:///{tmp_path}/ttft.db"
  state_dir: "{tmp_path}/state"
location: lab
probe_self_delay_bound_ms: 1000
providers:
  standin:
    base_url: "{receiver.url}/v1"
    api: openai-chat
targets:
  a: {{provider: standin, model: stand-in-a, params: {{max_tokens: 4}}}}
  b: {{provider: standin, model: stand-in-b, params: {{max_tokens: 4}}}}
prompts:
  short: {{tokens: 128}}
jobs:
  - {{name: j, schedule: "*/5 * * * *", targets: [a, b], prompts: [short], rounds: 2, warmup: 0, pause_s: 0}}
"""
        )
        upgrade(config)
        with_otel(config, f'otel: {{endpoint: "{receiver.url}", traces: true}}\n')
        result = run_cli("once", "--config", str(config))
        assert result.code == 0, str(result)
        sent = [h["traceparent"] for h in receiver.chat_headers]
        traces = receiver.of("traces")
    spans = [span for r in traces for rs in r.message.resource_spans for ss in rs.scope_spans for span in ss.spans]
    (run,) = [span for span in spans if span.name == "ttft_monitor.run j"]
    probes = [span for span in spans if span is not run]
    assert len(probes) == len(sent) == 4
    assert run.kind == run.SPAN_KIND_INTERNAL
    assert run.parent_span_id == b""  # the root of the run's trace
    attrs = attributes(run.attributes)
    assert attrs["ttft_monitor.probe_job"] == "j"
    assert attrs["ttft_monitor.location"] == "lab"
    assert attrs["ttft_monitor.run.probes"] == 4
    assert attrs["ttft_monitor.run.errors"] == 0
    assert {span.trace_id for span in spans} == {run.trace_id}  # one trace
    for probe in probes:
        assert probe.kind == probe.SPAN_KIND_CLIENT
        assert probe.parent_span_id == run.span_id
        assert run.start_time_unix_nano <= probe.start_time_unix_nano
        assert probe.end_time_unix_nano <= run.end_time_unix_nano
    assert run.start_time_unix_nano == min(p.start_time_unix_nano for p in probes)
    assert run.end_time_unix_nano == max(p.end_time_unix_nano for p in probes)
    by_id = {(span.trace_id.hex(), span.span_id.hex()): span for span in probes}
    for traceparent in sent:  # what the server saw: the run's trace, and its own probe span as parent
        _, trace_id, span_id, _ = traceparent.split("-")
        assert trace_id == run.trace_id.hex()
        assert by_id[(trace_id, span_id)].parent_span_id == run.span_id
    assert len({tp.split("-")[2] for tp in sent}) == 4


def test_runs_that_never_end_are_forgotten_beyond_the_cap(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from prometheus_client import CollectorRegistry

    from monitor.otel.export import PENDING_RUNS_MAX, OtelTelemetry
    from monitor.otel.settings import OtelConfig, resolve
    from monitor.probe.result import Sample
    from monitor.probe.run import RunKey, current_run

    with otlp_receiver() as receiver:
        settings = resolve(OtelConfig(endpoint=receiver.url, traces=True), {})
        assert settings is not None
        telemetry = OtelTelemetry(
            settings, registry=CollectorRegistry(), location="lab", endpoints={}, ttft_buckets_s=(0.1, 1)
        )
        tick = datetime(2026, 1, 1, tzinfo=UTC)
        runs = [RunKey("j", tick + timedelta(minutes=i)) for i in range(PENDING_RUNS_MAX + 1)]
        samples = {}
        for run in runs:  # each run sends one probe and none ends yet
            sample = Sample("t", "m", "openai-chat", "p", 1, intended_at=run.intended_at, sent_at=run.intended_at)
            token = current_run.set(run)
            try:
                telemetry.headers_for(sample)
            finally:
                current_run.reset(token)
            samples[run] = sample
        for run in (runs[0], runs[-1]):
            telemetry.observe_run(probe_job="j", intended_at=run.intended_at, samples=[samples[run]])
        telemetry.close()
        traces = receiver.of("traces")
    spans = [span for r in traces for rs in r.message.resource_spans for ss in rs.scope_spans for span in ss.spans]
    (run_span,) = spans  # the oldest run was forgotten when the cap was passed; the newest one ended
    assert attributes(run_span.attributes)["ttft_monitor.run.intended_at"] == runs[-1].intended_at.isoformat()


@pytest.mark.realtime
def test_once_stopped_by_sigterm_mid_run_exports_what_it_measured(sim: SimProcess, tmp_path: Path) -> None:
    # A CronJob evicted halfway through its run: the probes stored are the probes exported, and the run
    # (cut short) still closes its span over them, before `once` exits.
    sim.post("/sim/models/slow-model", {"ttft_base_ms": 400, "prefill_ms_per_1k": 0, "decode_tps": 50})
    with otlp_receiver() as receiver:
        config = tolerant(write_config(tmp_path, sim, model="slow-model", rounds=20, grace=5))
        upgrade(config)
        with_otel(config, f'otel: {{endpoint: "{receiver.url}", traces: true}}\n')  # metrics every 60 s
        log = tmp_path / "once.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "monitor", "once", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and log.read_text().count('"probe_sample"') < 2:
                time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        requests = receiver.of("metrics")
        traces = receiver.of("traces")
    text = log.read_text()
    assert code == 4, text[-3000:]
    rows = cast(list[tuple[float, float, float, int]], stored(tmp_path))
    assert 2 <= len(rows) < 20, rows
    assert requests, "once exited on SIGTERM without exporting its metrics"
    metrics = metrics_by_name(requests)
    (ttft,) = last_point(metrics, semconv.TTFT).histogram.data_points
    assert ttft.count == len(rows)
    assert ttft.sum == pytest.approx(sum(r[0] for r in rows) / 1000, rel=1e-9)
    spans = [span for r in traces for rs in r.message.resource_spans for ss in rs.scope_spans for span in ss.spans]
    (run,) = [span for span in spans if span.name == "ttft_monitor.run tick"]
    assert attributes(run.attributes)["ttft_monitor.run.probes"] == len(rows)
    assert len([span for span in spans if span.kind == span.SPAN_KIND_CLIENT]) == len(rows)


def test_without_traces_a_probe_carries_no_traceparent_and_no_span_is_sent(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        config = tmp_path / "config.yaml"
        config.write_text(
            f"""
database:
  url: "sqlite+aiosqlite:///{tmp_path}/ttft.db"
  state_dir: "{tmp_path}/state"
probe_self_delay_bound_ms: 1000
providers:
  standin: {{base_url: "{receiver.url}/v1", api: openai-chat}}
targets:
  t: {{provider: standin, model: stand-in, params: {{max_tokens: 4}}}}
prompts:
  short: {{tokens: 128}}
jobs:
  - {{name: j, schedule: "*/5 * * * *", targets: [t], prompts: [short], rounds: 2, warmup: 0, pause_s: 0}}
otel: {{endpoint: "{receiver.url}"}}
"""
        )
        upgrade(config)
        result = run_cli("once", "--config", str(config))
        assert result.code == 0, str(result)
        headers = receiver.chat_headers
        assert receiver.of("metrics")  # export is on, metrics only
        assert not receiver.of("traces")
    assert len(headers) == 2
    assert all("traceparent" not in {name.lower() for name in h} for h in headers), headers
