"""Generic webhook: the documented JSON below, signed per Standard Webhooks (standardwebhooks.com).

Headers: `webhook-id` (stable per state change, so a retry is recognisable), `webhook-timestamp`
(Unix seconds) and, with a secret, `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`.
The secret must be `whsec_<base64>` (the standard's format) and is used as the decoded bytes, as the
standard's libraries do; `ttft-monitor alert new-secret` makes one. The loader refuses any other.
The body schema is documented in docs/alerting.md; change both together.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime
from typing import Any

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import BuildError, Receiver, ReceiverKind, dumps, post, require_url, url_problems
from monitor.alert.text import headline, measurement_fields, plain_text, series_labels, window_fields
from monitor.config.secrets import webhook_secret_key
from monitor.timefmt import iso


def payload(notification: Notification, now: datetime) -> dict[str, Any]:
    n = notification
    return {
        "type": f"incident.{n.state}",
        "timestamp": iso(now, whole_seconds=True),
        "data": {
            "incident_id": str(n.incident_id),
            "state": n.state,
            "kind": n.kind,
            "severity": n.severity,
            "repeat": n.repeat,
            **window_fields(n),
            "series": series_labels(n),
            **measurement_fields(n),
            "title": headline(n),
            "summary": n.summary,
            "text": plain_text(n, now),
            "link": n.link,
            # One page per outage: the group this speaks for and its members (null for one series).
            "group": {"id": str(n.group_id), "summary": n.group, "members": list(n.members)} if n.grouped else None,
        },
    }


def secret_key(secret: str) -> bytes:
    try:
        return webhook_secret_key(secret)
    except ValueError as exc:
        raise BuildError(str(exc)) from None


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<signature>` per Standard Webhooks."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest:
    url = require_url(receiver)
    body = dumps(payload(notification, now))
    message_id = notification.message_id()
    timestamp = int(now.timestamp())
    headers = {"webhook-id": message_id, "webhook-timestamp": str(timestamp)}
    secret = receiver.secret()
    if secret:
        headers["webhook-signature"] = sign(secret, message_id, timestamp, body)
    return post(url, body, receiver, headers)


def problems(receiver: Receiver) -> list[str]:
    out = url_problems(receiver)
    secret = receiver.secret()
    if secret:
        try:
            secret_key(secret)
        except BuildError as exc:
            out.append(str(exc))
    return out


KIND = ReceiverKind(build=build, problems=problems)
