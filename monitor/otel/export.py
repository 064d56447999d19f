"""The OpenTelemetry SDK side: instruments, OTLP/HTTP exporters, and how export failures are reported.

Nothing here runs an export on the probes' loop. Recording a measurement is a dict lookup in
ttft-monitor's own aggregation (`aggregate.py`, as cheap as prometheus_client; the SDK's instruments
cost half a millisecond per probe); a thread of its own takes a snapshot every `export_interval_s` and
hands it to a child process that encodes and sends it through the official OTLP exporter (encoder.py),
and spans and log records wait in bounded queues drained by the SDK's worker threads. A collector that
is away or hung costs those threads (and the child) at most the export timeout per export, and never
a probe: failed exports and dropped items are counted (`ttft_monitor_otel_*`) and logged when
export starts failing and when it recovers, not at every attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import requests
import structlog

try:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, LogRecordExportResult
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricExportResult,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        set_span_in_context,
    )
except ImportError as exc:  # the optional extra is missing
    raise ImportError(
        "OpenTelemetry export is configured but its packages are not installed: pip install 'ttft-monitor[otel]'"
    ) from exc
from prometheus_client import CollectorRegistry

from monitor import __version__
from monitor.otel import semconv
from monitor.otel.aggregate import Aggregates, Instrument, Key, Snapshot, key_of
from monitor.otel.counters import ExportCounters
from monitor.otel.encoder import EncoderProcess, EncoderSpec
from monitor.otel.incident import IncidentReading
from monitor.otel.settings import Resolved
from monitor.probe.proxy import ProxyEnvironment, route_for
from monitor.probe.result import Sample
from monitor.probe.run import RunKey, current_run
from monitor.probe.self_delay import SELF_DELAY_BUCKETS_S
from monitor.redact import mask_url

# How often a collector that stays away is mentioned again, with the count since the last line.
FAILING_REMINDER_S = 600.0
PHASE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
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
        self._inner.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated

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
# Runs whose probes went out but whose end (`observe_run`) has not come, at most: a run that never ends
# (its job failed outright) is forgotten, oldest first, and its probes' spans name a parent never exported.
PENDING_RUNS_MAX = 256


def otlp_session(url: str | None, proxies: ProxyEnvironment) -> requests.Session:
    """The HTTP session an OTLP exporter posts with, routed as every other outbound client is
    (monitor.probe.proxy): the environment's HTTP(S)_PROXY unless NO_PROXY names the collector, and
    never for a loopback collector. requests' own reading of the environment is off, so it cannot
    proxy a collector on 127.0.0.1 that the policy sends direct."""
    session = requests.Session()
    session.trust_env = False
    route = route_for(url, None, proxies) if url else None
    if route is not None:
        proxy = route.url
        if route.username is not None:
            parts = urlsplit(route.url)
            login = quote(route.username, safe="") + (f":{quote(route.password, safe='')}" if route.password else "")
            proxy = urlunsplit((parts.scheme, f"{login}@{parts.netloc}", parts.path, parts.query, parts.fragment))
        session.proxies = {"http": proxy, "https": proxy}
    return session


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1e9)


def _probe_start(sample: Sample) -> datetime:
    assert sample.sent_at is not None
    return sample.sent_at


def _probe_end(sample: Sample) -> datetime:
    """Where a probe's span ends: its send (after set-up) plus its total time."""
    sent = _probe_start(sample) + timedelta(milliseconds=sample.setup_ms or 0)
    return sent + timedelta(milliseconds=sample.total_ms or 0)


def quiet_sdk_loggers() -> None:
    """The exporters log every retry and failure; `ExportHealth` says it once per outage instead.

    Errors in the SDK itself (a bad attribute, a broken instrument) still come through.
    """
    logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)
    logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.ERROR)


# Series keys kept at most (a reload or a new model adds some; labels are bounded, so this is a backstop).
SERIES_KEYS_MAX = 10_000


@dataclass(frozen=True)
class _SeriesKeys:
    attributes: dict[str, Any]
    base: Key
    text_tokens: Key
    unknown_tokens: Key
    outcome: Key
    phases: tuple[Key, ...]


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
        proxies: ProxyEnvironment | None = None,
        encoder_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        proxies = proxies if proxies is not None else ProxyEnvironment()
        self.location = location
        self.configure(endpoints)
        counters = ExportCounters(registry)
        counters.start(tuple(s for s, url in settings.endpoints.items() if url is not None))
        self.health = ExportHealth(counters, settings.endpoints, secrets=settings.secrets)
        quiet_sdk_loggers()
        resource = Resource(dict(settings.resource))
        self._resource = resource
        self.aggregates = Aggregates(instruments(tuple(ttft_buckets_s)), start_ns=time.time_ns())
        self._export_lock = threading.Lock()  # one export at a time: the thread's, or the last one at close
        self._stop = threading.Event()
        self._metric_exporter: OTLPMetricExporter | None = None
        self._encoder: EncoderProcess | None = None
        self._exporter_thread: threading.Thread | None = None
        if settings.endpoints["metrics"] is not None:
            self._metric_exporter = OTLPMetricExporter(
                endpoint=settings.endpoints["metrics"],
                headers=settings.headers["metrics"],
                timeout=settings.timeout_for("metrics"),
                session=otlp_session(settings.endpoints["metrics"], proxies),
            )
            # Periodic exports are encoded in a child process (otel/encoder.py): encoding holds the GIL
            # for tens of milliseconds, which the probes' loop would pay in its stamps.
            self._encoder = EncoderProcess(
                EncoderSpec(settings, tuple(self.aggregates.instruments.values()), proxies),
                **(encoder_options or {}),
            )
            self._exporter_thread = threading.Thread(target=self._export_loop, name="ttft-otel-metrics", daemon=True)
            self._exporter_thread.start()
        self._tracer_provider: TracerProvider | None = None
        self._span_processor: BatchSpanProcessor | None = None
        if settings.endpoints["traces"] is not None:
            span_exporter = OTLPSpanExporter(
                endpoint=settings.endpoints["traces"],
                headers=settings.headers["traces"],
                timeout=settings.timeout_for("traces"),
                session=otlp_session(settings.endpoints["traces"], proxies),
            )
            self._span_processor = BatchSpanProcessor(
                _CountedSpanExporter(span_exporter, self.health),
                max_queue_size=settings.queue_size,
                max_export_batch_size=min(512, settings.queue_size),
                export_timeout_millis=settings.timeout_for("traces") * 1000,
            )
            self._ids = _PresetIds()
            self._tracer_provider = TracerProvider(resource=resource, id_generator=self._ids, shutdown_on_exit=False)
            self._tracer_provider.add_span_processor(self._span_processor)
        self._logger_provider: LoggerProvider | None = None
        self._log_processor: BatchLogRecordProcessor | None = None
        if settings.endpoints["logs"] is not None:
            log_exporter = OTLPLogExporter(
                endpoint=settings.endpoints["logs"],
                headers=settings.headers["logs"],
                timeout=settings.timeout_for("logs"),
                session=otlp_session(settings.endpoints["logs"], proxies),
            )
            self._log_processor = BatchLogRecordProcessor(
                _CountedLogExporter(log_exporter, self.health),
                max_queue_size=settings.queue_size,
                max_export_batch_size=min(512, settings.queue_size),
                export_timeout_millis=settings.timeout_for("logs") * 1000,
            )
            self._logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
            self._logger_provider.add_log_record_processor(self._log_processor)
        # sample id -> (trace id, its span's id, its run span's id or None), from its request to its span.
        self._pending: OrderedDict[str, tuple[int, int, int | None]] = OrderedDict()
        # run -> (trace id, run span id): made at the run's first probe, turned into its span at its end.
        self._runs: OrderedDict[RunKey, tuple[int, int]] = OrderedDict()
        self._pending_lock = threading.Lock()
        self._random = RandomIdGenerator()
        self._closed = False

    @property
    def tracing(self) -> OtelTelemetry | None:
        """This object as the probe client's `RequestTracing` when traces are exported, else None."""
        return self if self._tracer_provider is not None else None

    def headers_for(self, sample: Sample) -> dict[str, str]:
        """The `traceparent` of the span this sample will be exported as (sampled: the flag is 01), in
        its run's trace when it is sent within a run (monitor.probe.run), in a trace of its own otherwise."""
        run = current_run.get()
        span_id = self._random.generate_span_id()
        with self._pending_lock:
            if run is None:
                trace_id, parent = self._random.generate_trace_id(), None
            else:
                ids = self._runs.get(run)
                if ids is None:
                    ids = self._runs[run] = (self._random.generate_trace_id(), self._random.generate_span_id())
                    while len(self._runs) > PENDING_RUNS_MAX:
                        self._runs.popitem(last=False)
                trace_id, parent = ids
            self._pending[sample.sample_id] = (trace_id, span_id, parent)
            while len(self._pending) > PENDING_TRACES_MAX:
                self._pending.popitem(last=False)
        return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}

    def configure(self, endpoints: Mapping[str, semconv.Endpoint]) -> None:
        """Providers as a reload left them (their API and URL name the provider and server)."""
        self.endpoints = dict(endpoints)
        # Parsed once here, not per probe: a URL parse per sample is most of the recording's cost.
        self._endpoint_attributes = {name: e.attributes() for name, e in self.endpoints.items()}
        self._keys: dict[tuple[object, ...], _SeriesKeys] = {}

    # ------------------------------------------------------------------ recording (the probes' loop)

    def observe_sample(self, sample: Sample, *, provider: str, probe_job: str) -> None:
        ids = None
        if self._tracer_provider is not None:
            with self._pending_lock:
                ids = self._pending.pop(sample.sample_id, None)
        if sample.warmup:
            return
        keys = self._keys_for(sample, provider, probe_job)
        if ids is not None:
            self._span(sample, keys.attributes, ids)
        agg = self.aggregates
        if sample.self_delay_ms is not None:
            agg.record(semconv.SELF_DELAY, (("ttft_monitor.probe_job", probe_job),), sample.self_delay_ms / 1000)
        # Tokens were spent whether or not the monitor was late around the probe: the conventions count
        # every operation's usage, failed ones included; only the timings need an undisturbed probe.
        usage = sample.prompt_tokens is not None or sample.completion_tokens is not None
        tokens = keys.text_tokens if usage else keys.unknown_tokens
        agg.add(semconv.USAGE_INPUT, tokens, sample.prompt_tokens or 0)
        agg.add(semconv.USAGE_OUTPUT, tokens, sample.completion_tokens or 0)
        agg.add(semconv.USAGE_CACHE_READ, tokens, sample.cached_tokens or 0)
        if sample.disturbed:
            agg.add(semconv.DISTURBED, keys.base, 1)
            return
        if sample.total_ms is not None:
            # From the request's start (pool wait and connection set-up included) to its end: the CLIENT
            # span's duration, which the conventions ask the metric to equal.
            agg.record(semconv.DURATION, keys.base, ((sample.setup_ms or 0) + sample.total_ms) / 1000)
        if sample.first_event_ms is not None:
            agg.record(semconv.TIME_TO_FIRST_CHUNK, keys.base, sample.first_event_ms / 1000)
        if sample.ok:  # a cut-off stream's gaps end at the failure; the conventions time successful output
            agg.record_many(semconv.TIME_PER_OUTPUT_CHUNK, keys.base, sample.chunk_gaps_ms, scale=1e-3)
        agg.add(semconv.PROBES, keys.outcome, 1)
        if not sample.ok or sample.ttft_ms is None:
            return
        agg.record(semconv.TTFT, keys.base, sample.ttft_ms / 1000)
        if sample.ttfa_ms is not None:
            agg.record(semconv.TTFA, keys.base, sample.ttfa_ms / 1000)
        for (_phase, name), key in zip(semconv.PHASES, keys.phases, strict=True):
            value = getattr(sample, name)
            if value is not None:
                agg.record(semconv.PHASE, key, value / 1000)
        if sample.decode_tps is not None:
            agg.set(semconv.DECODE_RATE, keys.base, sample.decode_tps, time.time_ns())

    def _keys_for(self, sample: Sample, provider: str, probe_job: str) -> _SeriesKeys:
        """A series' attributes and their keys, worked out once and then reused: every label is bounded."""
        ident = (provider, probe_job, sample.target, sample.model, sample.served_model, sample.prompt, sample.error)
        keys = self._keys.get(ident)
        if keys is None:
            if len(self._keys) >= SERIES_KEYS_MAX:
                self._keys.clear()
            genai = semconv.genai_attributes(sample, self._endpoint_attributes.get(provider))
            attrs = {**genai, **semconv.monitor_attributes(sample, location=self.location, probe_job=probe_job)}
            keys = self._keys[ident] = _SeriesKeys(
                attributes=attrs,
                base=key_of(attrs),
                text_tokens=key_of({**attrs, "gen_ai.token.modality": "text"}),
                unknown_tokens=key_of({**attrs, "gen_ai.token.modality": "unknown"}),
                outcome=key_of({**attrs, "ttft_monitor.outcome": "ok" if sample.ok else "error"}),
                phases=tuple(key_of({**attrs, "ttft_monitor.phase": phase}) for phase, _ in semconv.PHASES),
            )
        return keys

    def observe_run(self, *, probe_job: str, intended_at: datetime, samples: Sequence[Sample]) -> None:
        """The run's span (INTERNAL, `ttft_monitor.run {job}`), parent of its probes' CLIENT spans: from
        the first probe's start to the last one's end, made after the fact like theirs."""
        if self._tracer_provider is None:
            return
        with self._pending_lock:
            ids = self._runs.pop(RunKey(probe_job, intended_at), None)
        traced = [s for s in samples if not s.warmup and s.sent_at is not None]
        if ids is None or not traced:  # no probe of it carried a traceparent, or only warm-ups did
            return
        attrs: dict[str, Any] = {
            "ttft_monitor.probe_job": probe_job,
            "ttft_monitor.location": self.location,
            "ttft_monitor.run.intended_at": intended_at.isoformat(),
            "ttft_monitor.run.probes": len(traced),
            "ttft_monitor.run.errors": sum(1 for s in traced if not s.ok),
            **semconv.SYNTHETIC,
        }
        start = min(_probe_start(s) for s in traced)
        end = max(_probe_end(s) for s in traced)
        span = self._start_span(f"ttft_monitor.run {probe_job}", SpanKind.INTERNAL, attrs, start, ids, None)
        if self._span_processor is not None and _queue_full(self._span_processor, self.settings.queue_size):
            self.health.dropped("traces")
        span.end(end_time=_ns(max(end, start)))

    def _start_span(
        self,
        name: str,
        kind: SpanKind,
        attrs: Mapping[str, Any],
        start: datetime,
        ids: tuple[int, int],
        parent: int | None,
    ) -> Any:
        """A span with the ids its `traceparent` announced; under the run span `parent` when given."""
        assert self._tracer_provider is not None
        tracer = self._tracer_provider.get_tracer("ttft-monitor", __version__)
        context = None
        if parent is not None:
            run = SpanContext(ids[0], parent, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            context = set_span_in_context(NonRecordingSpan(run))
        with self._pending_lock:  # the id generator is shared: one span at a time takes the preset ids
            self._ids.preset = ids
            try:
                return tracer.start_span(
                    name,
                    context=context,
                    kind=kind,
                    attributes=attrs,
                    start_time=_ns(start),
                    record_exception=False,
                )
            finally:
                self._ids.preset = None

    def _span(self, sample: Sample, attrs: Mapping[str, Any], ids: tuple[int, int, int | None]) -> None:
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
        name = f"{attrs.get('gen_ai.operation.name', 'chat')} {sample.model}"
        span = self._start_span(name, SpanKind.CLIENT, span_attrs, start, (ids[0], ids[1]), ids[2])
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
        end = _probe_end(sample)
        if self._span_processor is not None and _queue_full(self._span_processor, self.settings.queue_size):
            self.health.dropped("traces")
        span.end(end_time=_ns(max(end, start)))

    def observe_baseline(
        self, series: Sequence[str], *, baseline_ms: float | None, run_median_ms: float | None
    ) -> None:
        key = key_of(semconv.detector_attributes(tuple(series), location=self.location))
        now = time.time_ns()
        if run_median_ms is not None:
            self.aggregates.set(semconv.RUN_MEDIAN, key, run_median_ms / 1000, now)
        if baseline_ms is not None:
            self.aggregates.set(semconv.BASELINE, key, baseline_ms / 1000, now)
            if run_median_ms is not None:
                self.aggregates.set(semconv.RUN_RATIO, key, run_median_ms / baseline_ms, now)

    def observe_regression_state(self, series: Sequence[str], level: int) -> None:
        key = key_of(semconv.detector_attributes(tuple(series), location=self.location))
        self.aggregates.set(semconv.REGRESSION_STATE, key, level, time.time_ns())

    def observe_incident(self, reading: IncidentReading, *, at: datetime | None = None) -> None:
        """An incident opened, updated or resolved, as one log record (event `ttft_monitor.incident.opened`,
        `.updated`, `.resolved`, `.info`); WARN while it is open, INFO otherwise."""
        if self._logger_provider is None:
            return
        from opentelemetry._logs import SeverityNumber

        action = INCIDENT_ACTIONS.get(reading.action, reading.action)
        kind, series = reading.kind, reading.series

        attrs: dict[str, Any] = {
            **semconv.detector_attributes(tuple(series), location=self.location),
            "ttft_monitor.incident.action": action,
            "ttft_monitor.incident.kind": kind,
        }
        for key, value in (
            ("ttft_monitor.incident.severity", reading.severity),
            ("ttft_monitor.incident.baseline_ms", reading.baseline_ms),
            ("ttft_monitor.incident.observed_ms", reading.observed_ms),
            ("ttft_monitor.incident.ratio", reading.ratio),
            ("error.type", reading.error_class),
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

    @property
    def encoder_pid(self) -> int | None:
        """The export child's pid while one runs (otel/encoder.py)."""
        return self._encoder.pid if self._encoder is not None else None

    def _export_loop(self) -> None:
        while not self._stop.wait(self.settings.export_interval_s):
            self.export_metrics(in_child=True)

    def export_metrics(self, *, in_child: bool = False) -> bool:
        """Send a snapshot of every metric now (blocking, bounded by the metrics' export timeout); False
        when it did not go through. `in_child`: encoded and sent by the export child, this process only
        snapshots and pickles; in this process when there is no child to do it."""
        if self._metric_exporter is None:
            return True
        with self._export_lock:
            snapshot = self.aggregates.snapshot(now_ns=time.time_ns(), delta=self.settings.temporality == "delta")
            if not snapshot.points():
                return True
            ok = self._encoder.export(snapshot) if in_child and self._encoder is not None else None
            if ok is None:
                data = metrics_data(snapshot, self.aggregates.instruments.values(), self._resource, self.settings)
                try:
                    result = self._metric_exporter.export(
                        data, timeout_millis=self.settings.timeout_for("metrics") * 1000
                    )
                except Exception:  # the exporter's own failure must not end the export thread
                    result = MetricExportResult.FAILURE
                ok = result == MetricExportResult.SUCCESS
            self.health.exported("metrics", ok, snapshot.points())
            return ok

    def close(self, timeout_s: float | None = None) -> None:
        """Export what is left, then stop the threads and the export child (blocking: call it in a thread).

        Each signal's last export is bounded by its exporter's timeout; when the export thread is still
        stuck in a hung collector's export, the last metric export is not tried.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._exporter_thread is not None and self._metric_exporter is not None:
            bound = (timeout_s if timeout_s is not None else self.settings.timeout_for("metrics")) + 1
            if self._encoder is not None:
                bound += self._encoder.answer_bound_s
            self._exporter_thread.join(bound)
            if not self._exporter_thread.is_alive():
                if self._encoder is not None:
                    self._encoder.close()
                self.export_metrics()  # the last one in this process: no child to start at exit
            self._metric_exporter.shutdown()
        for processor in (self._span_processor, self._log_processor):
            if processor is not None:
                # Drains its queue; each export bounded by the exporter's timeout (the SDK leaves it unannotated).
                processor.shutdown()  # type: ignore[no-untyped-call]
        if self._encoder is not None:
            self._encoder.close()


def instruments(ttft_buckets: tuple[float, ...]) -> tuple[Instrument, ...]:
    """Every exported metric: name, kind, unit, meaning and (histograms) bucket boundaries."""
    genai = semconv.GENAI_SECONDS_BUCKETS
    return (
        Instrument(
            semconv.DURATION,
            "histogram",
            "s",
            "GenAI client inference operation duration: from the request's start (connection set-up included) to "
            "the last byte of the streamed response, or to the error; the probe span's duration.",
            genai,
        ),
        Instrument(
            semconv.TIME_TO_FIRST_CHUNK,
            "histogram",
            "s",
            "Time to the first event of the response stream (any event: a role-only chunk counts), not the first "
            "token; see ttft_monitor.time_to_first_token.",
            genai,
        ),
        Instrument(
            semconv.TIME_PER_OUTPUT_CHUNK,
            "histogram",
            "s",
            "Time between consecutive chunks that carry tokens, once per gap (tokens - 1 per successful probe; "
            "the first 256 gaps of a longer answer).",
            genai,
        ),
        Instrument(semconv.USAGE_INPUT, "counter", "{token}", "Input (prompt) tokens, as the server reported them."),
        Instrument(
            semconv.USAGE_OUTPUT, "counter", "{token}", "Output (completion) tokens, as the server reported them."
        ),
        Instrument(semconv.USAGE_CACHE_READ, "counter", "{token}", "Input tokens the server served from its cache."),
        Instrument(
            semconv.TTFT,
            "histogram",
            "s",
            "Time to the first generated token (content, reasoning or tool call).",
            ttft_buckets,
        ),
        Instrument(
            semconv.TTFA,
            "histogram",
            "s",
            "Time to the first visible answer token (after any reasoning).",
            ttft_buckets,
        ),
        Instrument(
            semconv.PHASE,
            "histogram",
            "s",
            "Phases of a probe by ttft_monitor.phase: dns, connect, tls (fresh connections only), setup (pool wait "
            "and set-up), response_head, first_event, each from sending the request.",
            PHASE_BUCKETS_S,
        ),
        Instrument(semconv.DECODE_RATE, "gauge", "{token}/s", "Decode rate of the most recent successful probe."),
        Instrument(semconv.PROBES, "counter", "{probe}", "Probes by ttft_monitor.outcome (ok, error) and error.type."),
        Instrument(
            semconv.DISTURBED,
            "counter",
            "{probe}",
            "Probes during which the monitor itself was late beyond probe_self_delay_bound_ms: counted here instead "
            "of in the timing instruments.",
        ),
        Instrument(
            semconv.SELF_DELAY,
            "histogram",
            "s",
            "How late the monitor itself was around each probe's stamps.",
            SELF_DELAY_BUCKETS_S,
        ),
        Instrument(semconv.BASELINE, "gauge", "s", "The detector's TTFT baseline for the series."),
        Instrument(semconv.RUN_MEDIAN, "gauge", "s", "Median TTFT of the series' last evaluated run."),
        Instrument(semconv.RUN_RATIO, "gauge", "1", "The last evaluated run's median TTFT divided by the baseline."),
        Instrument(semconv.REGRESSION_STATE, "gauge", "1", "Open regression per series: 0 none, 1 ticket, 2 page."),
    )


def metrics_data(
    snapshot: Snapshot, instruments: Iterable[Instrument], resource: Resource, settings: Resolved
) -> MetricsData:
    """A snapshot as the SDK's data model, which the official OTLP exporter encodes and sends."""
    temporality = AggregationTemporality.DELTA if settings.temporality == "delta" else AggregationTemporality.CUMULATIVE
    start, end = snapshot.start_ns, snapshot.end_ns
    metrics: list[Metric] = []
    for inst in instruments:
        data: Any
        if inst.kind == "counter":
            counters = snapshot.counters.get(inst.name, {})
            points = [NumberDataPoint(dict(k), start, end, v) for k, v in counters.items()]
            data = Sum(points, temporality, is_monotonic=True)
            points_n = len(points)
        elif inst.kind == "histogram":
            states = snapshot.histograms.get(inst.name, {})
            buckets = [
                HistogramDataPoint(dict(k), start, end, h.count, h.sum, h.counts, inst.bounds, h.min, h.max)
                for k, h in states.items()
            ]
            data = Histogram(buckets, temporality)
            points_n = len(buckets)
        else:
            gauges = snapshot.gauges.get(inst.name, {})
            points = [NumberDataPoint(dict(k), start, at, v) for k, (v, at) in gauges.items()]
            data = Gauge(points)
            points_n = len(points)
        if points_n:
            metrics.append(Metric(inst.name, inst.description, inst.unit, data))
    scope = ScopeMetrics(InstrumentationScope("ttft-monitor", __version__), metrics, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])
