"""Alerting: notifications from incidents, routed, silenced, and delivered through a durable outbox.

The daemon's part, in full:

    metrics = AlertMetrics(registry)                       # optional
    transport = Transport()                                # one aiohttp session for every receiver
    dispatcher = Dispatcher(engine, config.alerts, transport, metrics=metrics)
    task = asyncio.create_task(dispatcher.run(stop))       # its own task; never awaited by probes
    ...
    await dispatcher.outbox.notify(notification)           # after each detector event (a DB insert)
    ...
    dispatcher.update_config(new_config.alerts)            # on SIGHUP
    stop.set(); await task; await transport.close()        # on shutdown (bounded by run's grace_s)

See docs/alerting.md for receivers, routing, silences, retries and the outbox's guarantees.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monitor.alert.metrics import AlertMetrics
    from monitor.alert.model import HttpRequest, Notification, series_link
    from monitor.alert.outbox import Dispatcher, DispatchReport, Enqueued, Outbox, RetryPolicy
    from monitor.alert.transport import SendResult, Transport

# Imported on first use: `alert test` should not pay for SQLAlchemy, nor the payload tests for aiohttp.
_EXPORTS = {
    "AlertMetrics": "monitor.alert.metrics",
    "DispatchReport": "monitor.alert.outbox",
    "Dispatcher": "monitor.alert.outbox",
    "Enqueued": "monitor.alert.outbox",
    "HttpRequest": "monitor.alert.model",
    "Notification": "monitor.alert.model",
    "Outbox": "monitor.alert.outbox",
    "RetryPolicy": "monitor.alert.outbox",
    "SendResult": "monitor.alert.transport",
    "Transport": "monitor.alert.transport",
    "series_link": "monitor.alert.model",
}
__all__ = [
    "AlertMetrics",
    "DispatchReport",
    "Dispatcher",
    "Enqueued",
    "HttpRequest",
    "Notification",
    "Outbox",
    "RetryPolicy",
    "SendResult",
    "Transport",
    "series_link",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'monitor.alert' has no attribute '{name}'")
