"""Alerting's metrics, created on the registry the caller hands in (no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

# `sent`: the receiver accepted it; `failed`: permanent failure or retries exhausted; `retried`: a
# transient failure, to be tried again; `suppressed`: held back by a silence.
OUTCOMES = ("sent", "failed", "retried", "suppressed")


class AlertMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.notifications = Counter(
            "ttft_monitor_notifications_total",
            "Notification delivery attempts per receiver, by outcome (sent, failed, retried, suppressed).",
            ("receiver", "outcome"),
            registry=registry,
        )
        self.outbox_pending = Gauge(
            "ttft_monitor_alert_outbox_pending",
            "Notifications waiting in the outbox (due now or waiting to retry), as last seen by this process.",
            registry=registry,
        )

    def count(self, receiver: str, outcome: str) -> None:
        self.notifications.labels(receiver=receiver, outcome=outcome).inc()
