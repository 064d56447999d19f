"""DingTalk group robot: a markdown message, signed when the robot has a secret.

Signing ("加签"): `timestamp` (Unix milliseconds) and
`sign = urlencode(base64(HMAC-SHA256(key = secret, message = "{timestamp}\\n{secret}")))` as query
parameters of the webhook URL. DingTalk answers HTTP 200 with a non-zero `errcode` on refusal.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import Receiver, chat_bot_kind, json_request, require_url
from monitor.alert.text import escape_dingtalk, headline, markdown_sections, one_line, truncate, truncate_bytes

# 130101: sending too fast (20 messages a minute per robot).
TRANSIENT_CODES = frozenset({130101})
TEXT_LIMIT_BYTES = 4000
TITLE_LIMIT = 64


def sign(secret: str, timestamp_ms: int) -> str:
    """The `sign` value before URL encoding."""
    message = f"{timestamp_ms}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), message, hashlib.sha256).digest()).decode()


def signed_url(url: str, secret: str, timestamp_ms: int) -> str:
    query = urlencode({"timestamp": str(timestamp_ms), "sign": sign(secret, timestamp_ms)})
    return f"{url}{'&' if '?' in url else '?'}{query}"


def markdown(notification: Notification, now: datetime) -> str:
    parts = markdown_sections(
        notification, now, heading="### {headline}", fact="- **{label}:** {value}", escape=escape_dingtalk
    )
    return truncate_bytes("\n\n".join(parts), TEXT_LIMIT_BYTES)


def payload(notification: Notification, now: datetime) -> dict[str, Any]:
    return {
        "msgtype": "markdown",
        # The title is plain text (the chat list's preview): not markdown, so not escaped; on one line.
        "markdown": {
            "title": truncate(one_line(headline(notification)), TITLE_LIMIT),
            "text": markdown(notification, now),
        },
    }


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest:
    url = require_url(receiver)
    secret = receiver.secret()
    if secret:
        url = signed_url(url, secret, int(now.timestamp() * 1000))
    return json_request(url, payload(notification, now), receiver)


KIND = chat_bot_kind(build, code_keys=("errcode",), message_keys=("errmsg",), transient_codes=TRANSIENT_CODES)
