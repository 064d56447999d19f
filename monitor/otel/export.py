"""The OpenTelemetry SDK side: instruments, OTLP/HTTP exporters, and how export failures are reported.

Nothing here runs an export on the probes' loop. Recording a measurement is an in-memory aggregation
(what prometheus_client does too); the SDK's metric reader exports from its own thread every
`export_interval_s`, and spans and log records wait in bounded queues drained by the SDK's worker
threads. A collector that is away or hung costs those threads at most `timeout_s` per export and
never a probe: failed exports and dropped items are counted (`ttft_monitor_otel_*`) and logged when
export starts failing and when it recovers, not at every attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

try:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, LogRecordExportResult
    from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableCounter, UpDownCounter
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        MetricExporter,
        MetricExportResult,
        MetricsData,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # the optional extra is missing
    raise ImportError(
        "OpenTelemetry export is configured but its packages are not installed: pip install 'ttft-monitor[otel]'"
    ) from exc
from prometheus_client import CollectorRegistry

from monitor import __version__
from monitor.otel import semconv
from monitor.otel.counters import ExportCounters
from monitor.otel.settings import Resolved
from monitor.probe.result import Sample
from monitor.redact import mask_url

# How often a collector that stays away is mentioned again, with the count since the last line.
FAILING_REMINDER_S = 600.0
PHASE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SELF_DELAY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
# The detector's actions (detect.rules.Action) as the events' names say them.
INCIDENT_ACTIONS = {"open": "opened", "update": "updated", "resolve": "resolved"}


class ExportHealth:
    """Counts each export's outcome and logs when export starts failing, every 10 minutes while it
    keeps failing, and when it recovers. Called from the SDK's export threads."""

    def __init__(
        self,
        counters: ExportCounters,
        endpoints: Mapping[str, str | None],
        *,
        secrets: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counters = counters
        self._where = {s: mask_url(url, secrets) for s, url in endpoints.items() if url is not None}
        self._clock = clock
        self._lock = threading.Lock()
        self._failing: dict[str, tuple[float, int]] = {}  # signal -> (last line's time, failures since)
        self._log = structlog.get_logger()

    def exported(self, signal: str, ok: bool, items: int) -> None:
        self._counters.exports.labels(signal, "ok" if ok else "failed").inc()
        with self._lock:
            state = self._failing.get(signal)
            if ok:
                if state is not None:
                    del self._failing[signal]
                    self._log.info("otel_export_recovered", signal=signal, endpoint=self._where.get(signal))
                return
            self._counters.dropped.labels(signal).inc(items)
            now = self._clock()
            if state is None or now - state[0] >= FAILING_REMINDER_S:
                failures = 1 if state is None else state[1] + 1
                self._log.warning(
                    "otel_export_failed",
                    signal=signal,
                    endpoint=self._where.get(signal),
                    failures=failures,
                    items=items,
                    hint="the OTLP receiver refused, did not answer or was unreachable within otel.timeout_s; "
                    "probing goes on, and cumulative metrics catch up at the next export that goes through",
                )
                self._failing[signal] = (now, 0)
            else:
                self._failing[signal] = (state[0], state[1] + 1)

    def where(self, signal: str) -> str | None:
        """The signal's endpoint, fit to log (None: not exported)."""
        return self._where.get(signal)

    def dropped(self, signal: str, items: int = 1) -> None:
        self._counters.dropped.labels(signal).inc(items)


def _points(data: MetricsData) -> int:
    return sum(
        len(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    )


class _CountedMetricExporter(MetricExporter):
    """The OTLP exporter, with each outcome reported to `ExportHealth`."""

    def __init__(self, inner: MetricExporter, health: ExportHealth) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._health = health

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis)
        except Exception:  # the exporter's own failure must not end the reader's thread
            result = MetricExportResult.FAILURE
        self._health.exported("metrics", result == MetricExportResult.SUCCESS, _points(metrics_data))
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


class _CountedSpanExporter(SpanExporter):
    def __init__(self, inner: SpanExporter, health: ExportHealth) -> None:
        self._inner = inner
        self._health = health

    def export(self, spans: Any) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        self._health.exported("traces", result == SpanExportResult.SUCCESS, len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _CountedLogExporter(LogRecordExporter):
    def __init__(self, inner: LogRecordExporter, health: ExportHealth) -> None:
        self._inner = inner
        self._health = health

    def export(self, batch: Any) -> LogRecordExportResult:
        try:
            result = self._inner.export(batch)
        except Exception:
            result = LogRecordExportResult.FAILURE
        self._health.exported("logs", result == LogRecordExportResult.SUCCESS, len(batch))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


def _queue_full(processor: object, size: int) -> bool:
    # The SDK's batch processors drop the oldest item when their queue is full and only log it; the
    # queue is a deque on their private `_batch_processor`, read here (len() only) to count the drop.
    inner = getattr(processor, "_batch_processor", None)
    queue = getattr(inner, "_queue", None)
    return queue is not None and len(queue) >= size


class _PresetIds(IdGenerator):
    """Hands the SDK the ids a probe's `traceparent` already announced, so the span a traced server
    sees as parent is the one exported; random ids otherwise."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.preset: tuple[int, int] | None = None

    def generate_trace_id(self) -> int:
        return self.preset[0] if self.preset is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        return self.preset[1] if self.preset is not None else self._random.generate_span_id()


# Ids handed out but not yet turned into a span, at most: a sample that never reaches `observe_sample`
# (a cancelled run) must not keep its entry for the life of the process.
PENDING_TRACES_MAX = 10_000


def _temporality(kind: str) -> dict[type, AggregationTemporality]:
    if kind == "delta":
        delta = AggregationTemporality.DELTA
        return {
            Counter: delta,
            Histogram: delta,
            ObservableCounter: delta,
            UpDownCounter: AggregationTemporality.CUMULATIVE,
        }
    return {}


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1e9)


def quiet_sdk_loggers() -> None:
    """The exporters log every retry and failure; `ExportHealth` says it once per outage instead.

    Errors in the SDK itself (a bad attribute, a broken instrument) still come through.
    """
    logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)
    logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.ERROR)


class OtelTelemetry:
    """Every probe, detector reading and incident as OpenTelemetry metrics (and spans, log records).

    Built once per process (`app.open_telemetry`) and handed to `Metrics`, which forwards what it
    records. `close` flushes what is buffered within a bound and stops the SDK's threads.
    """

    def __init__(
        self,
        settings: Resolved,
        *,
        registry: CollectorRegistry,
        location: str,
        endpoints: Mapping[str, semconv.Endpoint],
        ttft_buckets_s: Sequence[float],
    ) -> None:
        self.settings = settings
        self.location = location
        self.endpoints = dict(endpoints)
        counters = ExportCounters(registry)
        counters.start(tuple(s for s, url in settings.endpoints.items() if url is not None))
        self.health = ExportHealth(counters, settings.endpoints, secrets=settings.secrets)
        quiet_sdk_loggers()
        resource = Resource(dict(settings.resource))
        timeout = settings.timeout_s
        metric_exporter = OTLPMetricExporter(
            endpoint=settings.endpoints["metrics"],
            headers=settings.headers["metrics"],
            timeout=timeout,
            preferred_temporality=_temporality(settings.temporality),
        )
        self._reader = PeriodicExportingMetricReader(
            _CountedMetricExporter(metric_exporter, self.health),
            export_interval_millis=settings.export_interval_s * 1000,
            export_timeout_millis=timeout * 1000,
        )
        # shutdown_on_exit=False: the daemon and `once` close it themselves, within their bound.
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader], shutdown_on_exit=False)
        self._tracer_provider: TracerProvider | None = None
        self._span_processor: BatchSpanProcessor | None = None
        if settings.endpoints["traces"] is not None:
            span_exporter = OTLPSpanExporter(
                endpoint=settings.endpoints["traces"], headers=settings.headers["traces"], timeout=timeout
            )
            self._span_processor = BatchSpanProcessor(
                _CountedSpanExporter(span_exporter, self.health),
                max_queue_size=settings.queue_size,
                max_export_batch_size=min(512, settings.queue_size),
                export_timeout_millis=timeout * 1000,
            )
            self._ids = _PresetIds()
            self._tracer_provider = TracerProvider(resource=resource, id_generator=self._ids, shutdown_on_exit=False)
            self._tracer_provider.add_span_processor(self._span_processor)
        self._logger_provider: LoggerProvider | None = None
        self._log_processor: BatchLogRecordProcessor | None = None
        if settings.endpoints["logs"] is not None:
            log_exporter = OTLPLogExporter(
                endpoint=settings.endpoints["logs"], headers=settings.headers["logs"], timeout=timeout
            )
            self._log_processor = BatchLogRecordProcessor(
                _CountedLogExporter(log_exporter, self.health),
                max_queue_size=settings.queue_size,
                max_export_batch_size=min(512, settings.queue_size),
                export_timeout_millis=timeout * 1000,
            )
            self._logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
            self._logger_provider.add_log_record_processor(self._log_processor)
        self._instruments(tuple(ttft_buckets_s))
        self._pending: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._pending_lock = threading.Lock()
        self._random = RandomIdGenerator()
        self._closed = False

    @property
    def tracing(self) -> OtelTelemetry | None:
        """This object as the probe client's `RequestTracing` when traces are exported, else None."""
        return self if self._tracer_provider is not None else None

    def headers_for(self, sample: Sample) -> dict[str, str]:
        """The `traceparent` of the span this sample will be exported as (sampled: the flag is 01)."""
        trace_id, span_id = self._random.generate_trace_id(), self._random.generate_span_id()
        with self._pending_lock:
            self._pending[sample.sample_id] = (trace_id, span_id)
            while len(self._pending) > PENDING_TRACES_MAX:
                self._pending.popitem(last=False)
        return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}

    def _instruments(self, ttft_buckets: tuple[float, ...]) -> None:
        meter = self.meter_provider.get_meter("ttft-monitor", __version__)
        genai = semconv.GENAI_SECONDS_BUCKETS
        self.duration = meter.create_histogram(
            semconv.DURATION,
            unit="s",
            description="GenAI client inference operation duration: from sending the request to the last byte "
            "of the streamed response, or to the error.",
            explicit_bucket_boundaries_advisory=genai,
        )
        self.time_to_first_chunk = meter.create_histogram(
            semconv.TIME_TO_FIRST_CHUNK,
            unit="s",
            description="Time to the first event of the response stream (any event: a role-only chunk counts), "
            "not the first token; see ttft_monitor.time_to_first_token.",
            explicit_bucket_boundaries_advisory=genai,
        )
        self.usage_input = meter.create_counter(
            semconv.USAGE_INPUT, unit="{token}", description="Input (prompt) tokens, as the server reported them."
        )
        self.usage_output = meter.create_counter(
            semconv.USAGE_OUTPUT, unit="{token}", description="Output (completion) tokens, as the server reported them."
        )
        self.usage_cache_read = meter.create_counter(
            semconv.USAGE_CACHE_READ, unit="{token}", description="Input tokens the server served from its cache."
        )
        self.ttft = meter.create_histogram(
            semconv.TTFT,
            unit="s",
            description="Time to the first generated token (content, reasoning or tool call).",
            explicit_bucket_boundaries_advisory=ttft_buckets,
        )
        self.ttfa = meter.create_histogram(
            semconv.TTFA,
            unit="s",
            description="Time to the first visible answer token (after any reasoning).",
            explicit_bucket_boundaries_advisory=ttft_buckets,
        )
        self.phase = meter.create_histogram(
            semconv.PHASE,
            unit="s",
            description="Phases of a probe by `ttft_monitor.phase`: dns, connect, tls (fresh connections only), "
            "setup (pool wait and set-up), response_head, first_event, each from sending the request.",
            explicit_bucket_boundaries_advisory=PHASE_BUCKETS_S,
        )
        self.decode_rate = meter.create_gauge(
            semconv.DECODE_RATE, unit="{token}/s", description="Decode rate of the most recent successful probe."
        )
        self.probes = meter.create_counter(
            semconv.PROBES, unit="{probe}", description="Probes by outcome (ok, error) and error.type."
        )
        self.disturbed = meter.create_counter(
            semconv.DISTURBED,
            unit="{probe}",
            description="Probes during which the monitor itself was late beyond probe_self_delay_bound_ms: "
            "counted here instead of in the timing instruments.",
        )
        self.self_delay = meter.create_histogram(
            semconv.SELF_DELAY,
            unit="s",
            description="How late the monitor itself was around each probe's stamps.",
            explicit_bucket_boundaries_advisory=SELF_DELAY_BUCKETS_S,
        )
        self.baseline = meter.create_gauge(
            semconv.BASELINE, unit="s", description="The detector's TTFT baseline for the series."
        )
        self.run_median = meter.create_gauge(
            semconv.RUN_MEDIAN, unit="s", description="Median TTFT of the series' last evaluated run."
        )
        self.run_ratio = meter.create_gauge(
            semconv.RUN_RATIO, unit="1", description="The last evaluated run's median TTFT divided by the baseline."
        )
        self.regression_state = meter.create_gauge(
            semconv.REGRESSION_STATE, unit="1", description="Open regression per series: 0 none, 1 ticket, 2 page."
        )

    def configure(self, endpoints: Mapping[str, semconv.Endpoint]) -> None:
        """Providers as a reload left them (their API and URL name the provider and server)."""
        self.endpoints = dict(endpoints)

    # ------------------------------------------------------------------ recording (the probes' loop)

    def observe_sample(self, sample: Sample, *, provider: str, probe_job: str) -> None:
        ids = None
        if self._tracer_provider is not None:
            with self._pending_lock:
                ids = self._pending.pop(sample.sample_id, None)
        if sample.warmup:
            return
        genai = semconv.genai_attributes(sample, self.endpoints.get(provider))
        attrs = {**genai, **semconv.monitor_attributes(sample, location=self.location, probe_job=probe_job)}
        if ids is not None:
            self._span(sample, attrs, ids)
        if sample.self_delay_ms is not None:
            self.self_delay.record(sample.self_delay_ms / 1000, {"ttft_monitor.probe_job": probe_job})
        if sample.disturbed:
            self.disturbed.add(1, attrs)
            return
        if sample.total_ms is not None:
            self.duration.record(sample.total_ms / 1000, attrs)
        if sample.first_event_ms is not None:
            self.time_to_first_chunk.record(sample.first_event_ms / 1000, attrs)
        usage = sample.prompt_tokens is not None or sample.completion_tokens is not None
        tokens = {**attrs, "gen_ai.token.modality": "text" if usage else "unknown"}
        self.usage_input.add(sample.prompt_tokens or 0, tokens)
        self.usage_output.add(sample.completion_tokens or 0, tokens)
        self.usage_cache_read.add(sample.cached_tokens or 0, tokens)
        outcome = {**attrs, "ttft_monitor.outcome": "ok" if sample.ok else "error"}
        self.probes.add(1, outcome)
        if not sample.ok or sample.ttft_ms is None:
            return
        self.ttft.record(sample.ttft_ms / 1000, attrs)
        if sample.ttfa_ms is not None:
            self.ttfa.record(sample.ttfa_ms / 1000, attrs)
        for phase, name in semconv.PHASES:
            value = getattr(sample, name)
            if value is not None:
                self.phase.record(value / 1000, {**attrs, "ttft_monitor.phase": phase})
        if sample.decode_tps is not None:
            self.decode_rate.set(sample.decode_tps, attrs)

    def _span(self, sample: Sample, attrs: Mapping[str, Any], ids: tuple[int, int]) -> None:
        """One CLIENT span per probe, made after the fact from the sample's stamps (nothing on the probe's
        path but the ids): events at each phase's end, the conventions' attributes, the status."""
        assert self._tracer_provider is not None
        if sample.sent_at is None:
            return
        start = sample.sent_at
        sent = start + timedelta(milliseconds=sample.setup_ms or 0)
        span_attrs: dict[str, Any] = {
            **attrs,
            "gen_ai.request.stream": True,
            "ttft_monitor.sample_id": sample.sample_id,
        }
        if sample.first_event_ms is not None:
            span_attrs["gen_ai.response.time_to_first_chunk"] = sample.first_event_ms / 1000
        for key, value in (
            ("gen_ai.usage.input_tokens", sample.prompt_tokens),
            ("gen_ai.usage.output_tokens", sample.completion_tokens),
            ("gen_ai.usage.cache_read.input_tokens", sample.cached_tokens),
            ("http.response.status_code", sample.http_status),
            ("ttft_monitor.request_id", sample.request_id),
            ("ttft_monitor.time_to_first_token", sample.ttft_ms / 1000 if sample.ttft_ms is not None else None),
        ):
            if value is not None:
                span_attrs[key] = value
        tracer = self._tracer_provider.get_tracer("ttft-monitor", __version__)
        name = f"{attrs.get('gen_ai.operation.name', 'chat')} {sample.model}"
        with self._pending_lock:  # the id generator is shared: one span at a time takes the preset ids
            self._ids.preset = ids
            try:
                span = tracer.start_span(
                    name, kind=SpanKind.CLIENT, attributes=span_attrs, start_time=_ns(start), record_exception=False
                )
            finally:
                self._ids.preset = None
        setup_end = start
        for event, offset_ms in (("dns", sample.dns_ms), ("connect", sample.connect_ms), ("tls", sample.tls_ms)):
            if offset_ms is not None:
                setup_end = setup_end + timedelta(milliseconds=offset_ms)
                span.add_event(event, {"ttft_monitor.duration_ms": offset_ms}, timestamp=_ns(setup_end))
        span.add_event("request_sent", timestamp=_ns(sent))
        for event, offset_ms in (
            ("response_head", sample.ttfb_ms),
            ("first_event", sample.first_event_ms),
            ("first_token", sample.ttft_ms),
            ("first_answer_token", sample.ttfa_ms),
        ):
            if offset_ms is not None:
                span.add_event(event, timestamp=_ns(sent + timedelta(milliseconds=offset_ms)))
        if sample.error is not None:
            span.set_status(Status(StatusCode.ERROR, sample.error.value))
        end = sent + timedelta(milliseconds=sample.total_ms or 0)
        if self._span_processor is not None and _queue_full(self._span_processor, self.settings.queue_size):
            self.health.dropped("traces")
        span.end(end_time=_ns(max(end, start)))

    def observe_baseline(
        self, series: Sequence[str], *, baseline_ms: float | None, run_median_ms: float | None
    ) -> None:
        attrs = semconv.detector_attributes(tuple(series), location=self.location)
        if run_median_ms is not None:
            self.run_median.set(run_median_ms / 1000, attrs)
        if baseline_ms is not None:
            self.baseline.set(baseline_ms / 1000, attrs)
            if run_median_ms is not None:
                self.run_ratio.set(run_median_ms / baseline_ms, attrs)

    def observe_regression_state(self, series: Sequence[str], level: int) -> None:
        self.regression_state.set(level, semconv.detector_attributes(tuple(series), location=self.location))

    def observe_incident(
        self,
        action: str,
        *,
        series: Sequence[str],
        kind: str,
        severity: str | None,
        baseline_ms: float | None,
        observed_ms: float | None,
        ratio: float | None,
        error_class: str | None,
        at: datetime | None = None,
    ) -> None:
        """An incident opened, updated or resolved, as one log record (event `ttft_monitor.incident.opened`,
        `.updated`, `.resolved`, `.info`); WARN while it is open, INFO otherwise."""
        if self._logger_provider is None:
            return
        from opentelemetry._logs import SeverityNumber

        action = INCIDENT_ACTIONS.get(action, action)

        attrs: dict[str, Any] = {
            **semconv.detector_attributes(tuple(series), location=self.location),
            "ttft_monitor.incident.action": action,
            "ttft_monitor.incident.kind": kind,
        }
        for key, value in (
            ("ttft_monitor.incident.severity", severity),
            ("ttft_monitor.incident.baseline_ms", baseline_ms),
            ("ttft_monitor.incident.observed_ms", observed_ms),
            ("ttft_monitor.incident.ratio", ratio),
            ("error.type", error_class),
        ):
            if value is not None:
                attrs[key] = value
        if self._log_processor is not None and _queue_full(self._log_processor, self.settings.queue_size):
            self.health.dropped("logs")
        opened = action in ("opened", "updated")
        self._logger_provider.get_logger("ttft-monitor", __version__).emit(
            timestamp=int(at.timestamp() * 1e9) if at is not None else time.time_ns(),
            severity_number=SeverityNumber.WARN if opened else SeverityNumber.INFO,
            severity_text="WARN" if opened else "INFO",
            body=f"{kind} incident {action} on {'/'.join(str(s) for s in series)}",
            attributes=attrs,
            event_name=f"ttft_monitor.incident.{action}",
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout_s: float | None = None) -> bool:
        """Export what is buffered now (blocking: call it in a thread); False when it did not all go."""
        millis = (timeout_s if timeout_s is not None else self.settings.timeout_s) * 1000
        ok = self.meter_provider.force_flush(millis)
        if self._tracer_provider is not None:
            ok = self._tracer_provider.force_flush(int(millis)) and ok
        if self._logger_provider is not None:
            ok = bool(self._logger_provider.force_flush(int(millis))) and ok
        return ok

    def close(self, timeout_s: float | None = None) -> None:
        """Export what is left, then stop the SDK's threads (blocking: call it in a thread).

        Each signal's last export is bounded by the exporter's timeout (`otel.timeout_s`), so a hung
        collector costs about that much per signal, once.
        """
        if self._closed:
            return
        self._closed = True
        millis = ((timeout_s if timeout_s is not None else self.settings.timeout_s) + 1) * 1000
        # The reader's shutdown runs its last collection and export in its own thread and waits for it.
        self.meter_provider.shutdown(timeout_millis=millis)
        for processor in (self._span_processor, self._log_processor):
            if processor is not None:
                processor.shutdown()  # drains its queue; each export bounded by the exporter's timeout
