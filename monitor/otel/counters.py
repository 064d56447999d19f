"""The Prometheus side of export: how many exports went through or failed, and what was dropped.

On the process's registry (like `alert.metrics`), without the OpenTelemetry SDK, so the metrics
reference lists them whether or not the extra is installed.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

SIGNALS = ("metrics", "traces", "logs")


class ExportCounters:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.exports = Counter(
            "ttft_monitor_otel_exports_total",
            "OTLP export requests by signal (metrics, traces, logs) and outcome (ok, failed: refused, unreachable, "
            "timed out or an error status, after the exporter's retries within `otel.timeout_s`).",
            ("signal", "outcome"),
            registry=registry,
        )
        self.dropped = Counter(
            "ttft_monitor_otel_dropped_total",
            "Telemetry items not delivered over OTLP, by signal: the data points, spans or log records of failed "
            "exports, and spans or log records pushed out of a full queue (`otel.queue_size`). Cumulative metrics "
            "lose only resolution: the next export that goes through carries the totals.",
            ("signal",),
            registry=registry,
        )

    def start(self, signals: tuple[str, ...] = SIGNALS) -> None:
        """Each signal's series at zero, so the first failure shows as an increase."""
        for signal in signals:
            self.dropped.labels(signal)
            for outcome in ("ok", "failed"):
                self.exports.labels(signal, outcome)
