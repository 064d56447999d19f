"""The durable outbox, writing side: every notification is a row in `alert_outbox` before anything is sent.

The probe path records a state change with one short insert per receiver and returns; it never waits
for a receiver. Each row's `dedup_key` (state change + receiver) is unique, so the same change is
enqueued once however many daemons see it (INSERT ... ON CONFLICT DO NOTHING). Routing and silences
are applied here; a silenced notification is stored as `suppressed`.

Order per incident and receiver: a newer state change supersedes older rows not yet sent (and
`monitor.alert.dispatcher` does not claim a row while an older one of the same incident and
receiver is pending), so a receiver never sees `resolved` before `firing`.

Row statuses: pending, sent, failed, suppressed, superseded. The SQL lives in monitor/store/outbox.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.alert.metrics import AlertMetrics
from monitor.alert.model import Notification
from monitor.alert.routing import active_silence, describe_silence, route
from monitor.alert.settings import Alerts
from monitor.alert.text import annotation_text, fmt_time
from monitor.store.outbox import FIRING_EVENTS, PENDING, SUPPRESSED, OutboxStore
from monitor.store.triage import ANNOTATION_WINDOW, TriageStore

__all__ = ["FIRING_EVENTS", "Enqueued", "Outbox", "dedup_key", "event_of", "utc_now"]


def utc_now() -> datetime:
    return datetime.now(UTC)


def event_of(notification: Notification) -> str:
    if notification.state == "firing" and notification.repeat:
        return "renotify"
    return notification.state


def dedup_key(notification: Notification, receiver: str) -> str:
    return f"{notification.change_key()}/{receiver}"


@dataclass(frozen=True, slots=True)
class Enqueued:
    """One row `enqueue` asked for: `inserted` is False when that state change was already there."""

    receiver: str
    status: str
    inserted: bool
    reason: str | None = None


class Outbox:
    """Records notifications for delivery. Cheap and bounded: safe to call from the probe path."""

    def __init__(
        self,
        engine: AsyncEngine,
        alerts: Alerts,
        *,
        metrics: AlertMetrics | None = None,
        on_enqueue: Callable[[], None] | None = None,
    ) -> None:
        self._store = OutboxStore(engine)
        self._alerts = alerts
        self._metrics = metrics
        # The dispatcher's `wake`, so a new notification goes out now rather than at the next poll.
        self._on_enqueue = on_enqueue

    def update_config(self, alerts: Alerts) -> None:
        self._alerts = alerts

    async def notify(
        self, notification: Notification, *, now: datetime | None = None, connection: AsyncConnection | None = None
    ) -> list[Enqueued]:
        """Route `notification`, apply silences and `send_resolved`, and enqueue it. Idempotent: call
        it with every detector event; repeats of a state change already enqueued are no-ops.

        Pass `connection` to enqueue inside the caller's transaction (the one that stores the incident's
        new state), so the state change and its notifications commit or fail together.
        """
        now = now or utc_now()
        if notification.state == "resolved" and not self._alerts.send_resolved:
            return []
        if connection is not None:
            notification, out = await self._notify_in(connection, notification, now)
        else:
            async with self._store.transaction() as own:
                notification, out = await self._notify_in(own, notification, now)
        self._after_enqueue(notification, out)
        return out

    async def _notify_in(
        self, connection: AsyncConnection, notification: Notification, now: datetime
    ) -> tuple[Notification, list[Enqueued]]:
        alerts = self._alerts
        notification = await self._annotated(connection, notification, now)
        receivers = route(notification, alerts.routes, alerts.receivers)
        silence = active_silence(notification, alerts.silences, now)
        reason = describe_silence(*silence) if silence is not None else None
        if reason is None and notification.state == "firing":
            # Someone is on it: a severity change of an acknowledged incident is recorded, not sent.
            # Its first notice went out before anyone could acknowledge it, and its resolve still does.
            acked = await TriageStore.acknowledged(connection, notification.incident_id)
            if acked is not None:
                reason = f"acknowledged by {acked[0] or 'someone'} at {fmt_time(acked[1])}"
        return notification, await self._enqueue_in(connection, notification, receivers, now, reason)

    @staticmethod
    async def _annotated(connection: AsyncConnection, notification: Notification, now: datetime) -> Notification:
        """The notification naming the change markers (`ttft-monitor annotate`) of its target (a
        group's: of any member's), or of every target, from an hour before the incident began until now."""
        if notification.annotation:
            return notification
        targets = [notification.target]
        if notification.group_id is not None:
            targets += await TriageStore.group_targets(connection, notification.group_id)
        marks = await TriageStore.annotations_between(
            connection, notification.since - ANNOTATION_WINDOW, now, targets=targets, limit=3
        )
        if not marks:
            return notification
        return notification.with_changes(annotation=annotation_text([(mark.text, mark.at) for mark in marks]))

    async def enqueue(
        self,
        notification: Notification,
        receivers: Iterable[str],
        *,
        now: datetime | None = None,
        suppressed: str | None = None,
        connection: AsyncConnection | None = None,
    ) -> list[Enqueued]:
        """One row per receiver for this state change, in one transaction (the caller's, given
        `connection`); `suppressed` (a reason) records them as held back by a silence, not pending.
        No routing, no silences: `notify` applies those."""
        now = now or utc_now()
        if connection is not None:
            out = await self._enqueue_in(connection, notification, receivers, now, suppressed, route_resolved=False)
        else:
            async with self._store.transaction() as own:
                out = await self._enqueue_in(own, notification, receivers, now, suppressed, route_resolved=False)
        self._after_enqueue(notification, out)
        return out

    async def _enqueue_in(
        self,
        connection: AsyncConnection,
        notification: Notification,
        receivers: Iterable[str],
        now: datetime,
        suppressed: str | None,
        *,
        route_resolved: bool = True,
    ) -> list[Enqueued]:
        names = list(dict.fromkeys(receivers))
        if notification.state == "resolved" and route_resolved:
            # Whoever was told it fires is told it resolved, even if the routes changed since.
            told = await self._store.receivers_told_firing(connection, notification.incident_id)
            names += [name for name in told if name in self._alerts.receivers and name not in names]
        if not names:
            return []
        incident_ref = await self._incident_ref(connection, notification.incident_id)
        return [
            await self._enqueue_one(connection, notification, name, now, suppressed, incident_ref) for name in names
        ]

    def _after_enqueue(self, notification: Notification, out: list[Enqueued]) -> None:
        # After the commit when the transaction is ours; a caller's may still roll back (then the
        # dispatcher merely wakes for nothing, and the log line overstates).
        for item in out:
            if item.inserted and item.status == SUPPRESSED and self._metrics is not None:
                self._metrics.count(item.receiver, "suppressed")
        if any(item.inserted and item.status == PENDING for item in out) and self._on_enqueue is not None:
            self._on_enqueue()
        log = structlog.get_logger()
        for item in out:
            if item.inserted:
                log.info(
                    "alert_enqueued",
                    receiver=item.receiver,
                    incident_id=str(notification.incident_id),
                    alert_event=event_of(notification),
                    status=item.status,
                    reason=item.reason,
                )

    async def _incident_ref(self, connection: AsyncConnection, incident_id: uuid.UUID) -> uuid.UUID | None:
        # The outbox refers to `incidents` when the incident is stored there; informational events
        # without an incident row are delivered all the same, just not ordered against others.
        return incident_id if await self._store.incident_stored(connection, incident_id) else None

    async def _enqueue_one(
        self,
        connection: AsyncConnection,
        notification: Notification,
        name: str,
        now: datetime,
        suppressed: str | None,
        incident_ref: uuid.UUID | None,
    ) -> Enqueued:
        status, reason = (SUPPRESSED, suppressed) if suppressed else (PENDING, None)
        if status == PENDING and notification.state == "resolved" and incident_ref is not None:
            told = await self._store.firing_statuses(connection, incident_ref, name)
            if told and all(item == SUPPRESSED for item in told):
                status, reason = SUPPRESSED, "its firing notifications were all silenced"
        row_id = uuid.uuid4()
        values = {
            "id": row_id,
            "dedup_key": dedup_key(notification, name),
            "incident_id": incident_ref,
            "receiver": name,
            "event": event_of(notification),
            "payload": notification.to_json(),
            "status": status,
            "attempts": 0,
            "next_attempt_at": now,
            "claimed_by": None,
            "claimed_until": None,
            "created_at": now,
            "sent_at": None,
            "last_error": reason,
        }
        inserted = await self._store.insert(connection, values)
        if inserted and status == PENDING and incident_ref is not None:
            # Older notices of this incident not yet sent are stale now; sending them after this one
            # would, for instance, reopen a resolved PagerDuty incident.
            await self._store.supersede_pending(
                connection,
                incident_id=incident_ref,
                receiver=name,
                keep=row_id,
                now=now,
                why=f"superseded by {event_of(notification)}",
            )
        return Enqueued(name, status, inserted, reason)
