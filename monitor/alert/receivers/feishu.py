"""Feishu / Lark custom bot: a rich-text (`post`) message, signed when the bot has a secret.

Signing (Feishu's "signature verification"): `timestamp` (Unix seconds) and
`sign = base64(HMAC-SHA256(key = "{timestamp}\\n{secret}", message = empty))` in the body.
Feishu answers HTTP 200 with a non-zero `code` when it refuses a message; see `check_answer`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime
from typing import Any

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import Receiver, chat_bot_kind, json_request, require_url
from monitor.alert.text import facts, headline

# 9499: too many requests; 11232: the bot's frequency limit. Everything else will not improve by retrying.
TRANSIENT_CODES = frozenset({9499, 11232})


def sign(secret: str, timestamp: int) -> str:
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def content(notification: Notification, now: datetime) -> dict[str, Any]:
    n = notification
    rows: list[list[dict[str, str]]] = []
    if n.summary:
        rows.append([{"tag": "text", "text": n.summary}])
    rows += [[{"tag": "text", "text": f"{label}: {value}"}] for label, value in facts(n, now)]
    if n.link:
        rows.append([{"tag": "a", "text": "Open the series", "href": n.link}])
    return {"post": {"zh_cn": {"title": headline(n), "content": rows}}}


def payload(notification: Notification, now: datetime, secret: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if secret:
        timestamp = int(now.timestamp())
        body = {"timestamp": str(timestamp), "sign": sign(secret, timestamp)}
    body["msg_type"] = "post"
    body["content"] = content(notification, now)
    return body


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest:
    return json_request(require_url(receiver), payload(notification, now, receiver.secret()), receiver)


KIND = chat_bot_kind(
    build, code_keys=("code", "StatusCode"), message_keys=("msg", "StatusMessage"), transient_codes=TRANSIENT_CODES
)
