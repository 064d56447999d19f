"""The outbox, sending side: deliver due rows of `alert_outbox`, retry, remind, prune.

A row is claimed with one `UPDATE ... SET claimed_by, claimed_until WHERE id = ? AND status =
'pending' AND (unclaimed or the claim expired)`, and only the process whose update changed one row
sends it. Results are recorded with the attempt in `alert_deliveries`. Transient failures are
retried with exponential backoff and full jitter (Retry-After honoured) until `max_attempts` or
`max_age_s`; permanent ones are marked `failed` at once. A claim outlives a crash by at most the
receiver's timeout plus a margin, after which any dispatcher picks the row up: delivery is at least
once, and exactly once unless a process dies between a receiver's answer and recording it. When the
database fails just then, the answer is kept and its recording retried until it is written; the row
stays in flight meanwhile, so this dispatcher never sends it again.

A row is not claimed while an older row of the same incident and receiver is still pending, so a
receiver never sees `resolved` before `firing`. Enqueueing is monitor.alert.outbox; the SQL lives in
monitor/store/outbox.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.deliver import deliver
from monitor.alert.metrics import AlertMetrics
from monitor.alert.model import Notification
from monitor.alert.outbox import Outbox, utc_now
from monitor.alert.receivers import KINDS
from monitor.alert.routing import active_silence, describe_silence
from monitor.alert.settings import Alerts, Receiver
from monitor.alert.transport import SendResult, Transport
from monitor.store.engine import is_bad_data
from monitor.store.outbox import FAILED, PENDING, SENT, SUPERSEDED, ClaimedRow, Delivery, OutboxStore
from monitor.store.writer import logged_failure

# Giving the cancelled rows' claims back is one short UPDATE: it gets at least this long however short the
# grace (a loaded database took over 0.2 s, and the claims then waited for their expiry to be sent).
RELEASE_MIN_S = 1.0

PRUNE_INTERVAL_S = 3600.0
# Writing a delivery's outcome is retried from 0.2 s, doubling, up to every 5 s, as long as it takes.
RECORD_RETRY_BASE_S = 0.2
RECORD_RETRY_CAP_S = 5.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


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
        self._store = OutboxStore(engine)
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
        self._unrecorded: set[uuid.UUID] = set()  # answered by the receiver, the answer not yet written
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

    def _claim_ttl(self, receiver: str) -> float:
        config = self._alerts.receivers.get(receiver)
        return (config.timeout_s if config is not None else 10.0) + self._claim_margin_s

    async def claim(self, now: datetime, limit: int, *, exclude: set[uuid.UUID] | None = None) -> list[ClaimedRow]:
        """Claim up to `limit` due rows. Each claim is one UPDATE that only one process can win; rows
        are claimed in id order, so two dispatchers' transactions cannot deadlock on each other."""
        candidates = sorted(await self._store.due(now, limit, exclude or set()))
        if not candidates:
            return []
        claims = [(row_id, now + timedelta(seconds=self._claim_ttl(receiver))) for row_id, receiver in candidates]
        return await self._store.claim(claims, worker_id=self.worker_id, now=now)

    async def release(self, row_ids: Iterable[uuid.UUID]) -> None:
        """Give claims back (on shutdown) so another dispatcher need not wait for them to expire."""
        ids = list(row_ids)
        if not ids:
            return
        await self._store.release(ids, worker_id=self.worker_id)

    # ------------------------------------------------------------ delivering

    async def _send(self, row: ClaimedRow, now: datetime) -> SendResult:
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

    def _interval(self, receiver: Receiver, *, acked: bool = False) -> float | None:
        """How often a still-firing incident is sent again to this receiver; None for never. Once it is
        acknowledged, only a receiver's own resend interval remains: Alertmanager's re-sends are a
        keep-alive (it resolves an alert whose endsAt passes), not a reminder to a person."""
        options = []
        if self._alerts.renotify_interval_s > 0 and not acked:
            options.append(self._alerts.renotify_interval_s)
        kind = KINDS.get(receiver.type)
        if kind is not None and kind.resend_interval_s is not None:
            options.append(kind.resend_interval_s)
        return min(options) if options else None

    async def _deliver_and_record(self, row: ClaimedRow, now: datetime, report: DispatchReport) -> None:
        result = await self._send(row, now)
        status = await self._record_kept(row, result, now)
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

    async def _record_kept(self, row: ClaimedRow, result: SendResult, now: datetime) -> str | None:
        """`_record`, tried again while the database fails: the receiver has answered, and sending again
        because the answer could not be written is how a page arrives twice. Until it is written the
        row stays in flight here, so this dispatcher does not claim it again (another one could once
        the claim expires: the claim's margin is what a blip may last for exactly once)."""
        self._unrecorded.add(row.id)
        failures = 0
        try:
            while True:
                try:
                    status = await self._record(row, result, now)
                except Exception as exc:
                    if is_bad_data(exc):  # the values refused: writing them again cannot succeed
                        raise
                    failures += 1
                    wait = min(RECORD_RETRY_CAP_S, RECORD_RETRY_BASE_S * 2 ** (failures - 1))
                    if logged_failure(failures):
                        self._log.warning(
                            "alert_record_retry",
                            receiver=row.receiver,
                            outcome=result.outcome,
                            error=type(exc).__name__,
                            failures=failures,
                            action="keeping the outcome and writing it when the database answers; not sending again",
                        )
                    await asyncio.sleep(wait)
                    continue
                if failures:
                    self._log.info(
                        "alert_recorded_late", receiver=row.receiver, outcome=result.outcome, tries=failures + 1
                    )
                return status
        finally:
            self._unrecorded.discard(row.id)

    async def _record(self, row: ClaimedRow, result: SendResult, now: datetime) -> str | None:
        """Store the attempt and the row's new status; None when our claim was lost meanwhile."""
        attempts = row.attempts + 1
        values: dict[str, Any] = {"attempts": attempts, "claimed_by": None, "claimed_until": None}
        async with self._store.transaction() as connection:
            if result.ok:
                values.update(status=SENT, sent_at=now, last_error=None)
            elif result.outcome == "transient" and self._may_retry(row, attempts, now):
                if await self._store.has_newer_pending(connection, row):
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
            delivery = Delivery(
                attempted_at=now,
                outcome=result.outcome,
                http_status=result.status,
                error=None if result.ok else result.detail,
                duration_ms=result.duration_ms,
            )
            changed = await self._store.record(
                connection, row.id, worker_id=self.worker_id, values=values, delivery=delivery
            )
        return str(values["status"]) if changed else None

    def _may_retry(self, row: ClaimedRow, attempts: int, now: datetime) -> bool:
        return attempts < self.retry.max_attempts and (now - row.created_at).total_seconds() < self.retry.max_age_s

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
        self._metrics.outbox_pending.set(await self._store.pending_count())

    # ------------------------------------------------------------ reminders

    async def renotify_due(self, now: datetime | None = None) -> int:
        """Enqueue a reminder for every open incident whose last firing notice to a receiver is one
        interval old (`renotify_interval_s`, or the receiver's own resend interval). The n-th reminder
        has its own dedup key, so daemons racing here enqueue it once. Returns how many were added."""
        now = now or self._clock()
        rows, busy = await self._store.firing_of_open_incidents()
        latest: dict[tuple[uuid.UUID, str], Any] = {}
        for row in rows:  # ordered by created_at: the last one wins
            latest[(row.incident_id, row.receiver)] = row
        added = 0
        for (incident_id, name), row in latest.items():
            receiver = self._alerts.receivers.get(name)
            if receiver is None or (incident_id, name) in busy:
                continue
            interval = self._interval(receiver, acked=bool(row.acked))
            if interval is None:
                continue
            repeat = int((now - row.created_at).total_seconds() // interval)
            if repeat < 1:
                continue
            first = Notification.from_json(row.payload)
            if not row.incident_open:
                # A group's lead recovered while other members did not: its values now say "back to
                # normal", which the group's page is not; remind with what the page said.
                reminder = first.with_changes(repeat=repeat)
            else:
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
        return await self._store.prune(now - timedelta(days=self._keep_days))

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
            # A row sent but not yet recorded keeps its claim: given back, the next start would send it again.
            unrecorded = [row_id for row_id in cancelled if row_id in self._unrecorded]
            cancelled = [row_id for row_id in cancelled if row_id not in self._unrecorded]
            if unrecorded:
                self._log.warning(
                    "alert_outcome_unrecorded",
                    rows=len(unrecorded),
                    detail="sent, but the database did not take the outcome before the stop; "
                    "the claim is kept, so it is sent again only once the claim expires",
                )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            try:
                await asyncio.wait_for(self.release(cancelled), timeout=max(grace_s, RELEASE_MIN_S))
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
