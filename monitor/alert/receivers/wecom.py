"""WeCom (WeChat Work) group robot: a markdown message to the robot's webhook URL (key in the URL).

WeCom answers HTTP 200 with a non-zero `errcode` on refusal; markdown content is capped at 4096 bytes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import Receiver, chat_bot_kind, json_request, require_url
from monitor.alert.text import escape_wecom, markdown_sections, truncate_bytes

# 45009: API frequency limit (20 messages a minute per robot).
TRANSIENT_CODES = frozenset({45009})
CONTENT_LIMIT_BYTES = 4096
# WeCom markdown knows three font colours.
COLOURS = {"firing": "warning", "resolved": "info", "info": "comment"}


def markdown(notification: Notification, now: datetime) -> str:
    n = notification
    heading = f'## <font color="{COLOURS[n.state]}">{{headline}}</font>'
    parts = markdown_sections(n, now, heading=heading, fact="> **{label}:** {value}", escape=escape_wecom)
    return truncate_bytes("\n".join(parts), CONTENT_LIMIT_BYTES)


def payload(notification: Notification, now: datetime) -> dict[str, Any]:
    return {"msgtype": "markdown", "markdown": {"content": markdown(notification, now)}}


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest:
    return json_request(require_url(receiver), payload(notification, now), receiver)


KIND = chat_bot_kind(build, code_keys=("errcode",), message_keys=("errmsg",), transient_codes=TRANSIENT_CODES)
