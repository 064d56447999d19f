"""The console: one structured log line per notification (`alert_notification`), for the demo and
for setups that ship logs to their alerting already. Nothing is sent over HTTP."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import Receiver, ReceiverKind
from monitor.alert.text import headline, measurement_fields, series_labels, window_fields

EVENT = "alert_notification"


def fields(notification: Notification, now: datetime) -> dict[str, Any]:
    n = notification
    return {
        "message": headline(n),
        "state": n.state,
        "kind": n.kind,
        "severity": n.severity,
        "series": n.series,
        **series_labels(n),
        **measurement_fields(n),
        **window_fields(n),
        "summary": n.summary,
        # Where the time went (monitor.detect.attribution), for regressions of runs with server metrics.
        "cause": n.cause,
        "attribution": n.attribution or None,
        "link": n.link,
        "incident_id": str(n.incident_id),
        "repeat": n.repeat,
    }


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest | None:
    return None


def problems(receiver: Receiver) -> list[str]:
    return []


KIND = ReceiverKind(build=build, problems=problems, log_fields=fields)
