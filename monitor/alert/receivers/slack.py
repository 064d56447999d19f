"""Slack incoming webhook: a header, the detector's summary, the facts, and a link to the series."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from monitor.alert.model import HttpRequest, Notification
from monitor.alert.receivers.base import Receiver, ReceiverKind, json_request, require_url, url_problems
from monitor.alert.text import facts, headline, truncate

# Slack's limits: header text 150 characters, section text 3000.
HEADER_LIMIT = 150
SECTION_LIMIT = 3000


def escape(text: str) -> str:
    """Slack mrkdwn treats &, < and > as control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def icon(notification: Notification) -> str:
    if notification.state == "resolved":
        return ":white_check_mark:"
    if notification.state == "info":
        return ":information_source:"
    return ":red_circle:" if notification.severity == "page" else ":large_orange_circle:"


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, SECTION_LIMIT)}}


def payload(notification: Notification, now: datetime) -> dict[str, Any]:
    n = notification
    title = headline(n)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": truncate(title, HEADER_LIMIT), "emoji": True}}
    ]
    if n.summary:
        blocks.append(section(escape(n.summary)))
    blocks.append(section("\n".join(f"*{label}:* {escape(value)}" for label, value in facts(n, now))))
    if n.link:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{n.link}|Open the series>"}]})
    return {"text": f"{icon(n)} {title}", "blocks": blocks}


def build(notification: Notification, receiver: Receiver, now: datetime) -> HttpRequest:
    return json_request(require_url(receiver), payload(notification, now), receiver)


KIND = ReceiverKind(build=build, problems=url_problems)
