"""One notification to one receiver: check its config, build the request, send it, read the answer.

Shared by the outbox dispatcher and `ttft-monitor alert test`, so a test exercises the real path.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import structlog

from monitor.alert.model import Notification
from monitor.alert.receivers import KINDS, BuildError
from monitor.alert.receivers.log import EVENT as LOG_EVENT
from monitor.alert.settings import Receiver
from monitor.alert.transport import SendResult, Transport
from monitor.redact import redact


def receiver_secrets(receiver: Receiver) -> list[str]:
    """Everything of the receiver's that must never appear in a log line or the database."""
    out = [receiver.secret(), receiver.resolved_url(), *receiver.headers.values(), *receiver.proxy.secrets()]
    return [value for value in out if value]


def config_problems(receiver: Receiver) -> list[str]:
    kind = KINDS.get(receiver.type)
    if kind is None:
        return [f"unknown receiver type '{receiver.type}' (known: {', '.join(KINDS)})"]
    return kind.problems(receiver)


async def deliver(
    notification: Notification,
    name: str,
    receiver: Receiver,
    *,
    transport: Transport,
    now: datetime,
    log: Any = None,
) -> SendResult:
    """Send `notification` to the receiver called `name`. Never raises for network or config trouble:
    a broken config is a permanent failure, a network problem a transient one."""
    problems = config_problems(receiver)
    if problems:
        return SendResult("permanent", None, f"alerts.receivers.{name}: " + "; ".join(problems))
    kind = KINDS[receiver.type]
    try:
        request = kind.build(notification, receiver, now)
    except BuildError as exc:
        return SendResult("permanent", None, f"alerts.receivers.{name}: {exc}")
    if request is None:
        fields = kind.log_fields(notification, now) if kind.log_fields is not None else {}
        logger = log if log is not None else structlog.get_logger()
        emit = logger.warning if notification.state == "firing" else logger.info
        emit(LOG_EVENT, receiver=name, **fields)
        return SendResult("ok", None, "written to the log")
    result = await transport.send(
        request, timeout_s=receiver.timeout_s, secrets=receiver_secrets(receiver), proxy=receiver.proxy
    )
    if result.ok and kind.check_answer is not None and result.status is not None:
        answer = kind.check_answer(result.status, result.body)
        if answer is not None:
            detail = redact(answer.detail, receiver_secrets(receiver))
            return SendResult(answer.outcome, result.status, detail, None, result.duration_ms, result.body)
    return result
