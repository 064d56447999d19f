"""PagerDuty Events API v2: `trigger` when firing, `resolve` when resolved, one `dedup_key` per incident.

The routing key (integration key) is the receiver's secret. `info` notifications (a served model
changed) are change events, not incidents: they go to the Change Events endpoint beside `url`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import BuildError, Receiver, ReceiverKind, json_request
from monitor.alert.text import headline, measurement_fields, series_labels, truncate
from monitor.timefmt import iso

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}
SUMMARY_LIMIT = 1024


def dedup_key(notification: Notification) -> str:
    """The same for every event of one incident, so PagerDuty groups and resolves them together."""
    return f"ttft-monitor/{notification.incident_id}"


def change_events_url(url: str) -> str:
    return url[: -len("enqueue")] + "change/enqueue" if url.endswith("/v2/enqueue") else url


def details(notification: Notification) -> dict[str, Any]:
    n = notification
    return {
        "series": n.series,
        **series_labels(n),
        "kind": n.kind,
        **measurement_fields(n),
        "since": iso(n.since, whole_seconds=True),
        "summary": n.summary,
        "incident_id": str(n.incident_id),
    }


def payload(notification: Notification, routing_key: str, now: datetime) -> dict[str, Any]:
    n = notification
    if n.state == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key(n)}
    body: dict[str, Any] = {"routing_key": routing_key}
    event: dict[str, Any] = {
        "summary": truncate(headline(n), SUMMARY_LIMIT),
        "source": f"{n.target}@{n.location}",
    }
    if n.state == "info":
        event["timestamp"] = iso(now, whole_seconds=True)
        event["custom_details"] = details(n)
        body["payload"] = event
    else:
        body["event_action"] = "trigger"
        body["dedup_key"] = dedup_key(n)
        event.update(
            severity=SEVERITY.get(n.severity, "error"),
            timestamp=iso(n.since, whole_seconds=True),
            component=n.target,
            group=n.job,
            custom_details=details(n),
        )
        event["class"] = n.kind
        body["payload"] = event
        body["client"] = "ttft-monitor"
        if n.link:
            body["client_url"] = n.link
    if n.link:
        body["links"] = [{"href": n.link, "text": "TTFT series"}]
    return body


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest:
    routing_key = receiver.secret()
    if not routing_key:
        raise BuildError("pagerduty receiver needs its routing key in `secret_env` or `secret_file`")
    url = receiver.resolved_url() or DEFAULT_URL
    if notification.state == "info":
        url = change_events_url(url)
    return json_request(url, payload(notification, routing_key, now), receiver)


def problems(receiver: Receiver) -> list[str]:
    if receiver.secret_env is None and receiver.secret_file is None:
        return ["a pagerduty receiver needs the integration's routing key in `secret_env` or `secret_file`"]
    return []


KIND = ReceiverKind(build=build, problems=problems, stateful=True)
