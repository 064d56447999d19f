"""The durable outbox: every notification is a row in `alert_outbox` before anything is sent.

Writing (`Outbox`): the probe path records a state change with one short insert per receiver and
returns; it never waits for a receiver. Each row's `dedup_key` (state change + receiver) is unique,
so the same change is enqueued once however many daemons see it (INSERT ... ON CONFLICT DO NOTHING).
Routing and silences are applied here; a silenced notification is stored as `suppressed`.

Sending (`Dispatcher`, its own task): a row is claimed with one
`UPDATE ... SET claimed_by, claimed_until WHERE id = ? AND status = 'pending' AND (unclaimed or
the claim expired)`, and only the process whose update changed one row sends it. Results are
recorded with the attempt in `alert_deliveries`. Transient failures are retried with exponential
backoff and full jitter (Retry-After honoured) until `max_attempts` or `max_age_s`; permanent ones
are marked `failed` at once. A claim outlives a crash by at most the receiver's timeout plus a
margin, after which any dispatcher picks the row up: delivery is at least once, and exactly once
unless a process dies between a receiver's answer and recording it.

Order per incident and receiver: a newer state change supersedes older rows not yet sent, and a row
is not claimed while an older row of the same incident and receiver is still pending, so a receiver
never sees `resolved` before `firing`.

Row statuses: pending, sent, failed, suppressed, superseded.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.alert.deliver import deliver
from monitor.alert.metrics import AlertMetrics
from monitor.alert.model import Notification
from monitor.alert.receivers import KINDS
from monitor.alert.routing import active_silence, describe_silence, route
from monitor.alert.transport import SendResult, Transport
from monitor.config.models import Alerts, Receiver
from monitor.store.engine import write_transaction
from monitor.store.models import AlertDeliveryRow, AlertOutboxRow, IncidentRow
from monitor.store.statements import upsert_insert

PENDING, SENT, FAILED, SUPPRESSED, SUPERSEDED = "pending", "sent", "failed", "suppressed", "superseded"
OUTBOX: sa.Table = AlertOutboxRow.__table__  # type: ignore[assignment]
DELIVERIES: sa.Table = AlertDeliveryRow.__table__  # type: ignore[assignment]
INCIDENTS: sa.Table = IncidentRow.__table__  # type: ignore[assignment]
FIRING_EVENTS = ("firing", "renotify")
PRUNE_INTERVAL_S = 3600.0


def utc_now() -> datetime:
    return datetime.now(UTC)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def event_of(notification: Notification) -> str:
    if notification.state == "firing" and notification.repeat:
        return "renotify"
    return notification.state


def dedup_key(notification: Notification, receiver: str) -> str:
    return f"{notification.change_key()}/{receiver}"


def _insert(connection: AsyncConnection) -> Any:
    return upsert_insert(connection, OUTBOX)


_transaction = write_transaction


@dataclass(frozen=True, slots=True)
class Enqueued:
    """One row `enqueue` asked for: `inserted` is False when that state change was already there."""

    receiver: str
    status: str
    inserted: bool
    reason: str | None = None


# ---------------------------------------------------------------- writing


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
        self._engine = engine
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
        alerts = self._alerts
        if notification.state == "resolved" and not alerts.send_resolved:
            return []
        receivers = route(notification, alerts.routes, alerts.receivers)
        silence = active_silence(notification, alerts.silences, now)
        reason = describe_silence(*silence) if silence is not None else None
        if connection is not None:
            out = await self._enqueue_in(connection, notification, receivers, now, reason)
        else:
            async with _transaction(self._engine) as own:
                out = await self._enqueue_in(own, notification, receivers, now, reason)
        self._after_enqueue(notification, out)
        return out

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
            async with _transaction(self._engine) as own:
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
            told = await connection.scalars(
                sa.select(OUTBOX.c.receiver)
                .where(OUTBOX.c.incident_id == notification.incident_id, OUTBOX.c.event.in_(FIRING_EVENTS))
                .distinct()
                .order_by(OUTBOX.c.receiver)
            )
            names += [name for name in told.all() if name in self._alerts.receivers and name not in names]
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

    @staticmethod
    async def _incident_ref(connection: AsyncConnection, incident_id: uuid.UUID) -> uuid.UUID | None:
        # The outbox refers to `incidents` when the incident is stored there; informational events
        # without an incident row are delivered all the same, just not ordered against others.
        found = await connection.scalar(sa.select(INCIDENTS.c.id).where(INCIDENTS.c.id == incident_id))
        return incident_id if found is not None else None

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
            told = (
                (
                    await connection.execute(
                        sa.select(OUTBOX.c.status).where(
                            OUTBOX.c.incident_id == incident_ref,
                            OUTBOX.c.receiver == name,
                            OUTBOX.c.event.in_(FIRING_EVENTS),
                        )
                    )
                )
                .scalars()
                .all()
            )
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
        insert = _insert(connection).values(values).on_conflict_do_nothing(index_elements=["dedup_key"])
        result = await connection.execute(insert)
        inserted = result.rowcount == 1
        if inserted and status == PENDING and incident_ref is not None:
            # Older notices of this incident not yet sent are stale now; sending them after this one
            # would, for instance, reopen a resolved PagerDuty incident.
            await connection.execute(
                sa.update(OUTBOX)
                .where(
                    OUTBOX.c.incident_id == incident_ref,
                    OUTBOX.c.receiver == name,
                    OUTBOX.c.status == PENDING,
                    OUTBOX.c.id != row_id,
                    sa.or_(OUTBOX.c.claimed_until.is_(None), OUTBOX.c.claimed_until < now),
                )
                .values(status=SUPERSEDED, last_error=f"superseded by {event_of(notification)}")
            )
        return Enqueued(name, status, inserted, reason)


# ---------------------------------------------------------------- sending


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2^(n-1))),
    at least what Retry-After asked; give up after `max_attempts` or once the row is `max_age_s` old."""

    base_s: float = 1.0
    cap_s: float = 300.0
    max_attempts: int = 30
    max_age_s: float = 6 * 3600.0

    def delay(self, attempts: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        wait = rng.uniform(0, min(self.cap_s, self.base_s * 2 ** max(attempts - 1, 0)))
        return max(wait, retry_after_s) if retry_after_s is not None else wait


@dataclass(slots=True)
class DispatchReport:
    """What one `dispatch_due` pass did."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    superseded: int = 0
    lost_claims: int = 0
    attempted: int = 0
    # (receiver, new status, result) of each attempt; `run` keeps none, it lives for days.
    outcomes: list[tuple[str, str, SendResult]] = field(default_factory=list)
    keep_outcomes: bool = True


@dataclass(frozen=True, slots=True)
class _Claimed:
    id: uuid.UUID
    incident_id: uuid.UUID | None
    receiver: str
    event: str
    payload: dict[str, Any]
    attempts: int
    created_at: datetime


class Dispatcher:
    """Delivers due outbox rows. `run(stop)` as its own task in the daemon; `dispatch_due(now)` for one
    pass (the `once` command, tests); `renotify_due(now)` enqueues reminders of incidents still open."""

    def __init__(
        self,
        engine: AsyncEngine,
        alerts: Alerts,
        transport: Transport,
        *,
        worker_id: str | None = None,
        retry: RetryPolicy | None = None,
        poll_interval_s: float = 1.0,
        renotify_check_s: float = 15.0,
        keep_days: float = 30.0,
        concurrency: int = 8,
        claim_margin_s: float = 30.0,
        metrics: AlertMetrics | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._engine = engine
        self._alerts = alerts
        self._transport = transport
        self.worker_id = worker_id or default_worker_id()
        self.retry = retry or RetryPolicy()
        self._poll_interval_s = poll_interval_s
        self._renotify_check_s = renotify_check_s
        self._keep_days = keep_days
        self._concurrency = concurrency
        self._claim_margin_s = claim_margin_s
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._clock = clock
        self._wake = asyncio.Event()
        self._log = structlog.get_logger().bind(worker=self.worker_id)
        self.outbox = Outbox(engine, alerts, metrics=metrics, on_enqueue=self.wake)

    def update_config(self, alerts: Alerts) -> None:
        """Take a reloaded config: receivers, routes, silences, intervals."""
        self._alerts = alerts
        self.outbox.update_config(alerts)

    def wake(self) -> None:
        """Look for due rows now instead of at the next poll."""
        self._wake.set()

    # ------------------------------------------------------------ claiming

    async def _candidates(self, now: datetime, limit: int, exclude: set[uuid.UUID]) -> list[tuple[uuid.UUID, str]]:
        older = OUTBOX.alias("older")
        blocked = (
            sa.select(older.c.id)
            .where(
                older.c.incident_id == OUTBOX.c.incident_id,
                older.c.receiver == OUTBOX.c.receiver,
                older.c.status == PENDING,
                older.c.created_at < OUTBOX.c.created_at,
            )
            .exists()
        )
        query = (
            sa.select(OUTBOX.c.id, OUTBOX.c.receiver)
            .where(
                OUTBOX.c.status == PENDING,
                OUTBOX.c.next_attempt_at <= now,
                sa.or_(OUTBOX.c.claimed_until.is_(None), OUTBOX.c.claimed_until < now),
                ~blocked,
            )
            .order_by(OUTBOX.c.next_attempt_at, OUTBOX.c.created_at, OUTBOX.c.id)
            .limit(limit + len(exclude))
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return [(row.id, row.receiver) for row in rows if row.id not in exclude][:limit]

    def _claim_ttl(self, receiver: str) -> float:
        config = self._alerts.receivers.get(receiver)
        return (config.timeout_s if config is not None else 10.0) + self._claim_margin_s

    async def claim(self, now: datetime, limit: int, *, exclude: set[uuid.UUID] | None = None) -> list[_Claimed]:
        """Claim up to `limit` due rows. Each claim is one UPDATE that only one process can win; rows
        are claimed in id order, so two dispatchers' transactions cannot deadlock on each other."""
        candidates = sorted(await self._candidates(now, limit, exclude or set()))
        if not candidates:
            return []
        won: list[uuid.UUID] = []
        async with _transaction(self._engine) as connection:
            for row_id, receiver in candidates:
                until = now + timedelta(seconds=self._claim_ttl(receiver))
                result = await connection.execute(
                    sa.update(OUTBOX)
                    .where(
                        OUTBOX.c.id == row_id,
                        OUTBOX.c.status == PENDING,
                        sa.or_(OUTBOX.c.claimed_until.is_(None), OUTBOX.c.claimed_until < now),
                    )
                    .values(claimed_by=self.worker_id, claimed_until=until)
                )
                if result.rowcount == 1:  # otherwise another dispatcher won it
                    won.append(row_id)
            rows = (await connection.execute(sa.select(OUTBOX).where(OUTBOX.c.id.in_(won)))).all() if won else []
        by_id = {row.id: row for row in rows}
        return [
            _Claimed(row.id, row.incident_id, row.receiver, row.event, row.payload, row.attempts, row.created_at)
            for row in (by_id[row_id] for row_id in won)
        ]

    async def release(self, row_ids: Iterable[uuid.UUID]) -> None:
        """Give claims back (on shutdown) so another dispatcher need not wait for them to expire."""
        ids = list(row_ids)
        if not ids:
            return
        async with _transaction(self._engine) as connection:
            await connection.execute(
                sa.update(OUTBOX)
                .where(OUTBOX.c.id.in_(ids), OUTBOX.c.claimed_by == self.worker_id)
                .values(claimed_by=None, claimed_until=None)
            )

    # ------------------------------------------------------------ delivering

    async def _send(self, row: _Claimed, now: datetime) -> SendResult:
        receiver = self._alerts.receivers.get(row.receiver)
        if receiver is None:
            return SendResult("permanent", None, f"receiver '{row.receiver}' is no longer in alerts.receivers")
        try:
            notification = Notification.from_json(row.payload)
        except (KeyError, TypeError, ValueError) as exc:
            return SendResult("permanent", None, f"unreadable outbox payload ({type(exc).__name__}: {exc})")
        try:
            # deliver() bounds the request by the receiver's timeout; this bounds everything else too.
            return await asyncio.wait_for(
                deliver(notification, row.receiver, receiver, transport=self._transport, now=now, log=self._log),
                timeout=receiver.timeout_s + 5,
            )
        except TimeoutError:
            return SendResult("transient", None, f"no answer within {receiver.timeout_s:g} s (timeout)")

    def _interval(self, receiver: Receiver) -> float | None:
        """How often a still-firing incident is sent again to this receiver; None for never."""
        options = []
        if self._alerts.renotify_interval_s > 0:
            options.append(self._alerts.renotify_interval_s)
        kind = KINDS.get(receiver.type)
        if kind is not None and kind.resend_interval_s is not None:
            options.append(kind.resend_interval_s)
        return min(options) if options else None

    async def _deliver_and_record(self, row: _Claimed, now: datetime, report: DispatchReport) -> None:
        result = await self._send(row, now)
        status = await self._record(row, result, now)
        report.attempted += 1
        if report.keep_outcomes:
            report.outcomes.append((row.receiver, status or "", result))
        log = self._log.bind(
            receiver=row.receiver,
            incident_id=str(row.incident_id) if row.incident_id else row.payload.get("incident_id"),
            alert_event=row.event,
            attempt=row.attempts + 1,
            http_status=result.status,
            duration_ms=None if result.duration_ms is None else round(result.duration_ms, 1),
        )
        if status is None:
            report.lost_claims += 1
            log.warning("alert_claim_lost", detail=result.detail)
            return
        if status == SENT:
            report.sent += 1
            log.info("alert_sent")
        elif status == PENDING:
            report.retried += 1
            log.warning("alert_retry", outcome=result.outcome, detail=result.detail)
        elif status == SUPERSEDED:
            report.superseded += 1
            log.info("alert_superseded", detail=result.detail)
        else:
            report.failed += 1
            log.error("alert_failed", permanent=result.outcome == "permanent", detail=result.detail)
        if self._metrics is not None:
            outcome = {SENT: "sent", PENDING: "retried"}.get(status, "failed" if status == FAILED else None)
            if outcome is not None:
                self._metrics.count(row.receiver, outcome)

    async def _record(self, row: _Claimed, result: SendResult, now: datetime) -> str | None:
        """Store the attempt and the row's new status; None when our claim was lost meanwhile."""
        attempts = row.attempts + 1
        values: dict[str, Any] = {"attempts": attempts, "claimed_by": None, "claimed_until": None}
        async with _transaction(self._engine) as connection:
            if result.ok:
                values.update(status=SENT, sent_at=now, last_error=None)
            elif result.outcome == "transient" and self._may_retry(row, attempts, now):
                if await self._has_newer(connection, row):
                    values.update(status=SUPERSEDED, last_error=f"superseded after: {result.describe()}")
                else:
                    delay = self.retry.delay(attempts, self._rng, result.retry_after_s)
                    values.update(
                        status=PENDING,
                        next_attempt_at=now + timedelta(seconds=delay),
                        last_error=result.describe(),
                    )
            else:
                why = "permanent" if result.outcome == "permanent" else f"gave up after {_attempts(attempts)}"
                values.update(status=FAILED, last_error=f"{why}: {result.describe()}")
            changed = await connection.execute(
                sa.update(OUTBOX).where(OUTBOX.c.id == row.id, OUTBOX.c.claimed_by == self.worker_id).values(**values)
            )
            await connection.execute(
                sa.insert(DELIVERIES).values(
                    outbox_id=row.id,
                    attempted_at=now,
                    outcome=result.outcome,
                    http_status=result.status,
                    error=None if result.ok else result.detail,
                    duration_ms=result.duration_ms,
                )
            )
        return str(values["status"]) if changed.rowcount == 1 else None

    def _may_retry(self, row: _Claimed, attempts: int, now: datetime) -> bool:
        return attempts < self.retry.max_attempts and (now - row.created_at).total_seconds() < self.retry.max_age_s

    async def _has_newer(self, connection: AsyncConnection, row: _Claimed) -> bool:
        if row.incident_id is None:
            return False
        found = await connection.scalar(
            sa.select(OUTBOX.c.id)
            .where(
                OUTBOX.c.incident_id == row.incident_id,
                OUTBOX.c.receiver == row.receiver,
                OUTBOX.c.status == PENDING,
                OUTBOX.c.created_at > row.created_at,
            )
            .limit(1)
        )
        return found is not None

    async def dispatch_due(self, now: datetime | None = None) -> DispatchReport:
        """Claim and deliver every row due at `now` (one pass; rows retried in it wait for the next)."""
        now = now or self._clock()
        report = DispatchReport()
        seen: set[uuid.UUID] = set()
        while True:
            rows = await self.claim(now, self._concurrency, exclude=seen)
            if not rows:
                break
            seen.update(row.id for row in rows)
            await asyncio.gather(*(self._deliver_and_record(row, now, report) for row in rows))
        await self._update_pending_gauge()
        return report

    async def _update_pending_gauge(self) -> None:
        if self._metrics is None:
            return
        async with self._engine.connect() as connection:
            query = sa.select(sa.func.count()).select_from(OUTBOX).where(OUTBOX.c.status == PENDING)
            count = await connection.scalar(query)
        self._metrics.outbox_pending.set(int(count or 0))

    # ------------------------------------------------------------ reminders

    async def renotify_due(self, now: datetime | None = None) -> int:
        """Enqueue a reminder for every open incident whose last firing notice to a receiver is one
        interval old (`renotify_interval_s`, or the receiver's own resend interval). The n-th reminder
        has its own dedup key, so daemons racing here enqueue it once. Returns how many were added."""
        now = now or self._clock()
        query = (
            sa.select(
                OUTBOX.c.incident_id,
                OUTBOX.c.receiver,
                OUTBOX.c.payload,
                OUTBOX.c.created_at,
                INCIDENTS.c.baseline_ms,
                INCIDENTS.c.observed_ms,
                INCIDENTS.c.ratio,
                INCIDENTS.c.error,
            )
            .join(INCIDENTS, INCIDENTS.c.id == OUTBOX.c.incident_id)
            .where(INCIDENTS.c.resolved_at.is_(None), OUTBOX.c.event == "firing")
            .order_by(OUTBOX.c.created_at)
        )
        busy_query = sa.select(OUTBOX.c.incident_id, OUTBOX.c.receiver).where(
            OUTBOX.c.status == PENDING, OUTBOX.c.incident_id.is_not(None)
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
            busy = {(row.incident_id, row.receiver) for row in (await connection.execute(busy_query)).all()}
        latest: dict[tuple[uuid.UUID, str], Any] = {}
        for row in rows:  # ordered by created_at: the last one wins
            latest[(row.incident_id, row.receiver)] = row
        added = 0
        for (incident_id, name), row in latest.items():
            receiver = self._alerts.receivers.get(name)
            if receiver is None or (incident_id, name) in busy:
                continue
            interval = self._interval(receiver)
            if interval is None:
                continue
            repeat = int((now - row.created_at).total_seconds() // interval)
            if repeat < 1:
                continue
            first = Notification.from_json(row.payload)
            reminder = first.with_changes(
                repeat=repeat,
                baseline_ms=row.baseline_ms if row.baseline_ms is not None else first.baseline_ms,
                observed_ms=row.observed_ms if row.observed_ms is not None else first.observed_ms,
                ratio=row.ratio if row.ratio is not None else first.ratio,
                error_class=row.error if row.error is not None else first.error_class,
            )
            silence = active_silence(reminder, self._alerts.silences, now)
            reason = describe_silence(*silence) if silence is not None else None
            done = await self.outbox.enqueue(reminder, [name], now=now, suppressed=reason)
            added += sum(1 for item in done if item.inserted)
        return added

    # ------------------------------------------------------------ housekeeping

    async def prune(self, now: datetime | None = None) -> int:
        """Delete finished rows (and their attempts) older than `keep_days`. The first firing notice of
        an incident still open is kept: reminders count from it, and it stops a re-enqueue."""
        now = now or self._clock()
        open_incidents = sa.select(INCIDENTS.c.id).where(INCIDENTS.c.resolved_at.is_(None))
        async with _transaction(self._engine) as connection:
            result = await connection.execute(
                sa.delete(OUTBOX).where(
                    OUTBOX.c.status.in_((SENT, FAILED, SUPPRESSED, SUPERSEDED)),
                    OUTBOX.c.created_at < now - timedelta(days=self._keep_days),
                    sa.not_(sa.and_(OUTBOX.c.event == "firing", OUTBOX.c.incident_id.in_(open_incidents))),
                )
            )
        return int(result.rowcount or 0)

    # ------------------------------------------------------------ the task

    async def run(self, stop: asyncio.Event, *, grace_s: float = 5.0) -> None:
        """Deliver until `stop` is set, then wait up to `grace_s` for deliveries in flight, cancel the
        rest and give their claims back. Database trouble is logged and retried, never raised."""
        loop = asyncio.get_running_loop()
        inflight: dict[uuid.UUID, asyncio.Task[None]] = {}
        report = DispatchReport(keep_outcomes=False)
        last_renotify = last_prune = float("-inf")
        failures = 0
        self._log.info("alert_dispatcher_started", concurrency=self._concurrency)

        def finished(row_id: uuid.UUID) -> Callable[[asyncio.Task[None]], None]:
            def done(task: asyncio.Task[None]) -> None:
                inflight.pop(row_id, None)
                if not task.cancelled() and task.exception() is not None:
                    self._log.warning("alert_delivery_crashed", error=type(task.exception()).__name__)
                self._wake.set()  # a slot is free

            return done

        while not stop.is_set():
            self._wake.clear()
            now = self._clock()
            try:
                if loop.time() - last_prune >= PRUNE_INTERVAL_S:
                    last_prune = loop.time()
                    pruned = await self.prune(now)
                    if pruned:
                        self._log.info("alert_outbox_pruned", rows=pruned, keep_days=self._keep_days)
                if loop.time() - last_renotify >= self._renotify_check_s:
                    await self.renotify_due(now)
                    await self._update_pending_gauge()
                    last_renotify = loop.time()
                free = self._concurrency - len(inflight)
                if free > 0:
                    for row in await self.claim(now, free, exclude=set(inflight)):
                        task = asyncio.create_task(self._deliver_and_record(row, now, report))
                        inflight[row.id] = task
                        task.add_done_callback(finished(row.id))
                failures = 0
                wait = self._poll_interval_s
            except Exception as exc:
                failures += 1
                wait = min(self._poll_interval_s * 2**failures, 30.0)
                self._log.warning("alert_dispatch_failed", error=type(exc).__name__, retry_in_s=wait)
            await _wait_any(stop, self._wake, seconds=wait)

        if inflight:
            _, pending = await asyncio.wait(set(inflight.values()), timeout=grace_s)
            cancelled = [row_id for row_id, task in inflight.items() if task in pending]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            try:
                await asyncio.wait_for(self.release(cancelled), timeout=grace_s)
            except Exception as exc:
                self._log.warning("alert_release_failed", error=type(exc).__name__)
        else:
            cancelled = []
        self._log.info(
            "alert_dispatcher_stopped",
            sent=report.sent,
            retried=report.retried,
            failed=report.failed,
            cancelled=len(cancelled),
        )


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event, *, seconds: float) -> None:
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
