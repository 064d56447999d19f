"""Prometheus Alertmanager: POST {url}/api/v2/alerts, as Prometheus itself does.

Alertmanager forgets an alert whose `endsAt` passes, so while an incident is firing it is re-sent
every RESEND_INTERVAL_S with `endsAt` ENDS_AT_HORIZON_S ahead (Prometheus uses 4x its resend
delay); a missed re-send or two does not resolve it, a dead monitor does within minutes. Resolving
sends the same labels with `endsAt` = the moment it resolved. The receiver's secret, if any, is sent
as a bearer token.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import Receiver, ReceiverKind, json_request, require_url, url_problems
from monitor.alert.text import headline, plain_text, series_labels
from monitor.timefmt import iso

RESEND_INTERVAL_S = 60.0
ENDS_AT_HORIZON_S = 4 * RESEND_INTERVAL_S
API_PATH = "/api/v2/alerts"
ALERT_NAMES = {
    "regression": "TTFTRegression",
    "availability": "TTFTAvailability",
    "slo": "TTFTSLOBreach",
    "slo_burn": "TTFTSLOBurnRate",
    "model_changed": "TTFTModelChanged",
    "tokens_jump": "TTFTTokensPerProbeJumped",
    "cache_stopped": "TTFTPromptCacheStopped",
    "test": "TTFTMonitorTest",
}


def alerts_url(url: str) -> str:
    """`http://am:9093` (or `http://am:9093/prefix/`) -> its `/api/v2/alerts`; a full API URL is kept."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if not path.endswith(API_PATH):
        path += API_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def alert_labels(notification: Notification) -> dict[str, str]:
    """The alert's identity: equal on every re-send and on the resolve, so Alertmanager matches them."""
    n = notification
    return {
        "alertname": ALERT_NAMES.get(n.kind, "TTFT" + n.kind.title().replace("_", "")),
        "severity": n.severity,
        "kind": n.kind,
        **series_labels(n),
        "incident_id": str(n.incident_id),
    } | ({"group_id": str(n.group_id)} if n.group_id is not None else {})


def alert_annotations(notification: Notification, now: datetime) -> dict[str, str]:
    n = notification
    out = {"summary": headline(n), "description": plain_text(n, now), "since": iso(n.since, whole_seconds=True)}
    for name in ("baseline_ms", "observed_ms", "ratio"):
        value = getattr(n, name)
        if value is not None:
            out[name] = f"{value:g}"
    if n.error_class:
        out["error_class"] = n.error_class
    if n.link:
        out["link"] = n.link
    return out


def payload(notification: Notification, now: datetime) -> list[dict[str, Any]]:
    n = notification
    resolved = n.state == "resolved"
    ends_at = (n.resolved_at or now) if resolved else now + timedelta(seconds=ENDS_AT_HORIZON_S)
    alert: dict[str, Any] = {
        "labels": alert_labels(n),
        "annotations": alert_annotations(n, now),
        "startsAt": iso(n.since, whole_seconds=True),
        "endsAt": iso(ends_at, whole_seconds=True),
    }
    if n.link:
        alert["generatorURL"] = n.link
    return [alert]


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest:
    secret = receiver.secret()
    auth = {"Authorization": f"Bearer {secret}"} if secret else None
    return json_request(alerts_url(require_url(receiver)), payload(notification, now), receiver, auth)


KIND = ReceiverKind(build=build, problems=url_problems, resend_interval_s=RESEND_INTERVAL_S, stateful=True)
