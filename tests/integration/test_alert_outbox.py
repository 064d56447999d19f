"""The outbox on both databases, delivering to real HTTP servers on loopback: enqueued once, delivered
once by several dispatchers, retried when transient, never when permanent, kept across restarts,
silenced, routed, re-notified, and in order per incident."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from monitor.alert.dispatcher import Dispatcher, RetryPolicy
from monitor.alert.metrics import AlertMetrics
from monitor.alert.outbox import Enqueued, Outbox
from monitor.alert.settings import Alerts, Route, Silence
from monitor.alert.transport import Transport
from monitor.store.models import IncidentRow, table_of
from tests.support.alert_fixtures import (
    T0,
    Loopback,
    Reply,
    alerts,
    deliveries,
    notification,
    outbox_rows,
    receiver,
    resolve_incident,
    store_incident,
)
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")


@pytest.fixture
def backend(alert_backend: Backend) -> Backend:
    """Both databases; PostgreSQL shared by this module's tests and emptied before each (see alert_backend)."""
    return alert_backend


def dispatcher(engine: AsyncEngine, config: Alerts, transport: Transport, **options: object) -> Dispatcher:
    options.setdefault("rng", random.Random(7))
    options.setdefault("poll_interval_s", 0.05)
    return Dispatcher(engine, config, transport, **options)  # type: ignore[arg-type]


def hook_alerts(loopback: Loopback, *paths: str, **fields: object) -> Alerts:
    return alerts({path.strip("/"): receiver("webhook", loopback.url(path)) for path in paths or ("/hook",)}, **fields)


def delivered(loopback: Loopback) -> list[tuple[str, str, str]]:
    """(path, event type, incident id) of every request the receiver got."""
    out = []
    for item in loopback.received:
        body = item.json()
        out.append((item.path, body["type"], body["data"]["incident_id"]))
    return out


def count(registry: CollectorRegistry, receiver_name: str, outcome: str) -> float:
    value = registry.get_sample_value(
        "ttft_monitor_notifications_total", {"receiver": receiver_name, "outcome": outcome}
    )
    return value or 0.0


# ---------------------------------------------------------------- enqueueing


async def test_a_state_change_is_enqueued_once_however_often_it_is_reported(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    incident = await store_incident(engine)
    outbox = Outbox(engine, hook_alerts(loopback))
    first = await outbox.notify(notification(incident_id=incident), now=T0)
    again = await outbox.notify(notification(incident_id=incident, observed_ms=1500.0), now=T0 + timedelta(minutes=5))
    assert [(e.receiver, e.status, e.inserted) for e in first] == [("hook", "pending", True)]
    assert [e.inserted for e in again] == [False]
    (row,) = await outbox_rows(engine)
    assert (row.status, row.event, row.incident_id, row.attempts) == ("pending", "firing", incident, 0)
    assert row.payload["observed_ms"] == 1234.0


async def test_two_daemons_reporting_the_same_change_enqueue_it_once(backend: Backend, loopback: Loopback) -> None:
    engines = [backend.engine(), backend.engine()]
    try:
        incident = await store_incident(engines[0])
        outboxes = [Outbox(e, hook_alerts(loopback)) for e in engines]
        results = await asyncio.gather(
            *(outboxes[i % 2].notify(notification(incident_id=incident), now=T0) for i in range(10))
        )
        assert sum(e.inserted for found in results for e in found) == 1
        assert len(await outbox_rows(engines[0])) == 1
    finally:
        for e in engines:
            await e.dispose()


async def test_notifications_commit_or_roll_back_with_the_callers_transaction(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    incident = await store_incident(engine)
    outbox = Outbox(engine, hook_alerts(loopback))
    async with engine.connect() as connection:
        transaction = await connection.begin()
        await outbox.notify(notification(incident_id=incident), now=T0, connection=connection)
        await transaction.rollback()  # the incident's state change failed: so did its notification
    assert await outbox_rows(engine) == []
    async with engine.begin() as connection:
        await outbox.notify(notification(incident_id=incident), now=T0, connection=connection)
    assert [row.status for row in await outbox_rows(engine)] == ["pending"]


# ---------------------------------------------------------------- delivering exactly once


async def test_a_pending_notification_survives_a_restart_and_is_delivered_once(
    backend: Backend, loopback: Loopback
) -> None:
    config = hook_alerts(loopback)
    before = backend.engine()
    incident = await store_incident(before)
    await Outbox(before, config).notify(notification(incident_id=incident), now=T0)
    await before.dispose()  # the daemon stops before its dispatcher sent anything

    after = backend.engine()
    try:
        async with Transport() as transport:
            fresh = dispatcher(after, config, transport)
            report = await fresh.dispatch_due(T0 + timedelta(seconds=30))
            again = await fresh.dispatch_due(T0 + timedelta(hours=1))
        assert (report.sent, again.attempted) == (1, 0)
        assert delivered(loopback) == [("/hook", "incident.firing", str(incident))]
        (row,) = await outbox_rows(after)
        assert (row.status, row.attempts, row.claimed_by) == ("sent", 1, None)
        assert row.sent_at == T0 + timedelta(seconds=30)
        (attempt,) = await deliveries(after)
        assert (attempt.outcome, attempt.http_status, attempt.error) == ("ok", 200, None)
    finally:
        await after.dispose()


async def test_two_dispatchers_on_one_database_deliver_each_state_change_exactly_once(
    backend: Backend, loopback: Loopback
) -> None:
    config = hook_alerts(loopback, "/a", "/b")
    engines = [backend.engine(), backend.engine()]
    try:
        incidents = [await store_incident(engines[0], target=f"model-{i}") for i in range(8)]
        outbox = Outbox(engines[0], config)
        for incident in incidents:
            await outbox.notify(notification(incident_id=incident), now=T0)
        async with Transport() as transport:
            pair = [dispatcher(e, config, transport, concurrency=3) for e in engines]
            reports = await asyncio.gather(*(d.dispatch_due(T0) for d in pair))
        assert sum(r.sent for r in reports) == 16
        seen = Counter(delivered(loopback))
        assert len(seen) == 16 and set(seen.values()) == {1}
        assert {row.status for row in await outbox_rows(engines[0])} == {"sent"}
    finally:
        for e in engines:
            await e.dispose()


async def all_sent(engine: AsyncEngine, *, count: int, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            rows = await outbox_rows(engine)
            if len(rows) == count and {row.status for row in rows} == {"sent"}:
                return
            await asyncio.sleep(0.05)


async def test_two_running_dispatchers_deliver_every_change_once(backend: Backend, loopback: Loopback) -> None:
    config = hook_alerts(loopback, "/a", "/b")
    engines = [backend.engine(), backend.engine()]
    stop = asyncio.Event()
    try:
        async with Transport() as transport:
            pair = [dispatcher(e, config, transport, concurrency=2) for e in engines]
            tasks = [asyncio.create_task(d.run(stop)) for d in pair]
            incidents = [await store_incident(engines[0], target=f"model-{i}") for i in range(5)]
            for index, incident in enumerate(incidents):
                await pair[index % 2].outbox.notify(notification(incident_id=incident))
            await loopback.wait_for(10)
            for index, incident in enumerate(incidents):
                resolved = notification(incident_id=incident, state="resolved", resolved_at=T0 + timedelta(hours=1))
                await pair[(index + 1) % 2].outbox.notify(resolved)
            await loopback.wait_for(20)
            # Every row sent and committed: no dispatcher claims a sent row again, so no duplicate can follow.
            await all_sent(engines[0], count=20)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
        seen = Counter(delivered(loopback))
        assert len(seen) == 20 and set(seen.values()) == {1}
        for path in ("/a", "/b"):
            events = [(body_type, incident) for p, body_type, incident in delivered(loopback) if p == path]
            for incident in incidents:
                # Per incident and receiver: firing strictly before resolved.
                assert [e for e, i in events if i == str(incident)] == ["incident.firing", "incident.resolved"]
    finally:
        for e in engines:
            await e.dispose()


async def test_racing_claims_never_hand_one_row_to_two_dispatchers(backend: Backend, loopback: Loopback) -> None:
    config = hook_alerts(loopback, "/a", "/b")
    engines = [backend.engine(), backend.engine()]
    try:
        outbox = Outbox(engines[0], config)
        for index in range(6):
            await outbox.notify(notification(incident_id=await store_incident(engines[0], target=f"m{index}")), now=T0)
        async with Transport() as transport:
            pair = [dispatcher(e, config, transport) for e in engines]
            # Both read the same 12 due rows, then race to claim each of them.
            claims = await asyncio.gather(*(d.claim(T0, 12) for d in pair))
        ids = [{row.id for row in claimed} for claimed in claims]
        assert len(ids[0] | ids[1]) == 12 and not ids[0] & ids[1]
    finally:
        for e in engines:
            await e.dispose()


async def test_a_crashed_dispatchers_claim_expires_and_another_delivers(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    await Outbox(engine, config).notify(notification(incident_id=incident), now=T0)
    async with Transport() as transport:
        crashed = dispatcher(engine, config, transport, claim_margin_s=30)
        assert len(await crashed.claim(T0, 10)) == 1  # ... and then the process dies
        survivor = dispatcher(engine, config, transport)
        assert (await survivor.dispatch_due(T0 + timedelta(seconds=5))).attempted == 0
        # The claim lasts the receiver's timeout (10 s) plus the margin (30 s).
        report = await survivor.dispatch_due(T0 + timedelta(seconds=41))
    assert report.sent == 1 and len(loopback.received) == 1


# ---------------------------------------------------------------- retries


async def test_a_5xx_is_retried_with_backoff_and_then_delivered(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(500, "boom"), Reply(200, "ok"))
    registry = CollectorRegistry()
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport, metrics=AlertMetrics(registry))
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        first = await d.dispatch_due(T0)
        (row,) = await outbox_rows(engine)
        assert (first.retried, row.status, row.attempts) == (1, "pending", 1)
        assert T0 < row.next_attempt_at <= T0 + timedelta(seconds=1)  # full jitter within base * 2^0
        assert row.last_error == "HTTP 500 (transient): boom"
        second = await d.dispatch_due(T0 + timedelta(seconds=2))
    assert second.sent == 1
    assert [(a.outcome, a.http_status) for a in await deliveries(engine)] == [("transient", 500), ("ok", 200)]
    assert (count(registry, "hook", "retried"), count(registry, "hook", "sent")) == (1, 1)


async def test_a_429_waits_at_least_as_long_as_retry_after_says(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(429, "slow down", {"Retry-After": "120"}), Reply(200, "ok"))
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0)
        (row,) = await outbox_rows(engine)
        assert row.next_attempt_at >= T0 + timedelta(seconds=120)
        assert (await d.dispatch_due(T0 + timedelta(seconds=119))).attempted == 0
        assert (await d.dispatch_due(T0 + timedelta(seconds=121))).sent == 1


async def test_a_4xx_is_permanent_and_never_retried(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(400, '{"error":"unknown field"}'))
    registry = CollectorRegistry()
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport, metrics=AlertMetrics(registry))
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        report = await d.dispatch_due(T0)
        later = await d.dispatch_due(T0 + timedelta(days=1))
    assert (report.failed, later.attempted, len(loopback.received)) == (1, 0, 1)
    (row,) = await outbox_rows(engine)
    assert row.status == "failed"
    assert row.last_error == 'permanent: HTTP 400 (permanent): {"error":"unknown field"}'
    assert count(registry, "hook", "failed") == 1


async def test_a_timeout_is_retried(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(200, "late", delay_s=2), Reply(200, "ok"))
    config = alerts({"hook": receiver("webhook", loopback.url("/hook"), timeout_s=0.3)})
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        first = await d.dispatch_due(T0)
        second = await d.dispatch_due(T0 + timedelta(seconds=5))
    assert (first.retried, second.sent) == (1, 1)
    assert [a.outcome for a in await deliveries(engine)] == ["transient", "ok"]


async def test_retries_stop_after_max_attempts(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(503, "down"))
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport, retry=RetryPolicy(max_attempts=3))
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        for minute in range(5):
            await d.dispatch_due(T0 + timedelta(minutes=minute * 10))
    (row,) = await outbox_rows(engine)
    assert (row.status, row.attempts, len(loopback.received)) == ("failed", 3, 3)
    assert row.last_error == "gave up after 3 attempts: HTTP 503 (transient): down"


async def test_retries_stop_once_the_notification_is_too_old(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(503, "down"))
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport, retry=RetryPolicy(max_age_s=600))
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0 + timedelta(minutes=11))
    (row,) = await outbox_rows(engine)
    assert row.last_error == "gave up after 1 attempt: HTTP 503 (transient): down"


def test_backoff_is_exponential_with_full_jitter_and_a_cap() -> None:
    policy = RetryPolicy(base_s=2, cap_s=60)
    rng = random.Random(1)
    for attempt, ceiling in [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (20, 60)]:
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert min(delays) >= 0 and max(delays) <= ceiling
        assert max(delays) > ceiling * 0.8  # spread over the whole range, not clustered
    assert policy.delay(1, rng, retry_after_s=90) == 90


# ---------------------------------------------------------------- order per incident


async def test_resolved_supersedes_a_firing_notice_not_yet_sent(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(503, "down"), Reply(200, "ok"))
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0)  # 503: waits to retry
        resolved = notification(incident_id=incident, state="resolved", resolved_at=T0 + timedelta(minutes=10))
        await d.outbox.notify(resolved, now=T0 + timedelta(minutes=10))
        report = await d.dispatch_due(T0 + timedelta(minutes=11))
    assert report.sent == 1
    assert [body_type for _, body_type, _ in delivered(loopback)] == ["incident.firing", "incident.resolved"]
    rows = {row.event: row for row in await outbox_rows(engine)}
    assert (rows["firing"].status, rows["resolved"].status) == ("superseded", "sent")


async def test_resolved_waits_for_a_firing_notice_in_flight(engine: AsyncEngine, loopback: Loopback) -> None:
    loopback.script("/hook", Reply(200, "ok", delay_s=0.6), Reply(200, "ok"))
    config = hook_alerts(loopback)
    incident = await store_incident(engine)
    async with Transport() as transport:
        first, second = dispatcher(engine, config, transport), dispatcher(engine, config, transport)
        await first.outbox.notify(notification(incident_id=incident), now=T0)
        sending = asyncio.create_task(first.dispatch_due(T0))
        await loopback.wait_for(1)  # the firing notice is on the wire
        resolved = notification(incident_id=incident, state="resolved", resolved_at=T0)
        await second.outbox.notify(resolved, now=T0 + timedelta(seconds=1))
        blocked = await second.dispatch_due(T0 + timedelta(seconds=1))
        await sending
        after = await second.dispatch_due(T0 + timedelta(seconds=2))
    assert (blocked.attempted, after.sent) == (0, 1)
    assert [body_type for _, body_type, _ in delivered(loopback)] == ["incident.firing", "incident.resolved"]


async def test_resolved_notices_can_be_switched_off(engine: AsyncEngine, loopback: Loopback) -> None:
    incident = await store_incident(engine)
    outbox = Outbox(engine, hook_alerts(loopback, send_resolved=False))
    await outbox.notify(notification(incident_id=incident), now=T0)
    assert await outbox.notify(notification(incident_id=incident, state="resolved", resolved_at=T0), now=T0) == []
    assert [row.event for row in await outbox_rows(engine)] == ["firing"]


# ---------------------------------------------------------------- silences and routing


async def test_a_silenced_notification_is_recorded_as_suppressed_and_not_sent(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    registry = CollectorRegistry()
    window = Silence(start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1), comment="GPU driver upgrade")
    config = hook_alerts(loopback, silences=[window])
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport, metrics=AlertMetrics(registry))
        (entry,) = await d.outbox.notify(notification(incident_id=incident), now=T0)
        report = await d.dispatch_due(T0)
        # It resolves after the window: nobody was told it fired, so nobody is told it resolved.
        resolved = notification(incident_id=incident, state="resolved", resolved_at=T0 + timedelta(hours=2))
        (after,) = await d.outbox.notify(resolved, now=T0 + timedelta(hours=2))
    assert (entry.status, entry.reason) == ("suppressed", "silenced by alerts.silences[0] (GPU driver upgrade)")
    assert (report.attempted, loopback.received) == (0, [])
    assert (after.status, after.reason) == ("suppressed", "its firing notifications were all silenced")
    assert count(registry, "hook", "suppressed") == 2
    assert [row.last_error for row in await outbox_rows(engine)] == [entry.reason, after.reason]


async def test_a_silence_for_one_target_lets_the_others_through(engine: AsyncEngine, loopback: Loopback) -> None:
    window = Silence(targets=["gpt-4o-mini"], start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1))
    outbox = Outbox(engine, hook_alerts(loopback, silences=[window]))
    silenced = await store_incident(engine, target="gpt-4o-mini")
    loud = await store_incident(engine, target="qwen3-8b")
    (a,) = await outbox.notify(notification(incident_id=silenced, target="gpt-4o-mini"), now=T0)
    (b,) = await outbox.notify(notification(incident_id=loud), now=T0)
    assert (a.status, b.status) == ("suppressed", "pending")


async def test_routes_send_each_severity_and_job_where_configured(engine: AsyncEngine, loopback: Loopback) -> None:
    config = hook_alerts(
        loopback,
        "/pager",
        "/chat",
        routes=[
            Route(receivers=["pager"], severities=["page"]),
            Route(receivers=["chat"], severities=["page", "ticket"], jobs=["every-5m"]),
        ],
    )
    page = await store_incident(engine, target="a")
    ticket = await store_incident(engine, target="b", severity="ticket")
    other_job = await store_incident(engine, target="c", severity="ticket")
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=page), now=T0)
        await d.outbox.notify(notification(incident_id=ticket, severity="ticket"), now=T0)
        await d.outbox.notify(notification(incident_id=other_job, severity="ticket", job="nightly"), now=T0)
        await d.dispatch_due(T0)
    assert sorted((path, incident) for path, _, incident in delivered(loopback)) == sorted(
        [("/pager", str(page)), ("/chat", str(page)), ("/chat", str(ticket))]
    )


async def test_resolved_reaches_whoever_was_told_it_fired(engine: AsyncEngine, loopback: Loopback) -> None:
    routes = [Route(receivers=["pager"], severities=["page"]), Route(receivers=["chat"], severities=["ticket"])]
    config = hook_alerts(loopback, "/pager", "/chat", routes=routes)
    incident = await store_incident(engine, severity="ticket")
    outbox = Outbox(engine, config)
    await outbox.notify(notification(incident_id=incident, severity="ticket"), now=T0)
    await outbox.notify(notification(incident_id=incident, severity="page"), now=T0 + timedelta(minutes=5))
    resolved = notification(incident_id=incident, severity="page", state="resolved", resolved_at=T0)
    entries = await outbox.notify(resolved, now=T0 + timedelta(minutes=30))
    assert sorted(e.receiver for e in entries) == ["chat", "pager"]


async def test_rows_of_a_receiver_no_longer_configured_fail_permanently(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    incident = await store_incident(engine)
    await Outbox(engine, hook_alerts(loopback, "/old")).notify(notification(incident_id=incident), now=T0)
    async with Transport() as transport:
        report = await dispatcher(engine, hook_alerts(loopback, "/new"), transport).dispatch_due(T0)
    assert report.failed == 1
    (row,) = await outbox_rows(engine)
    assert row.last_error == "permanent: no HTTP answer (permanent): receiver 'old' is no longer in alerts.receivers"


# ---------------------------------------------------------------- reminders


async def test_an_open_incident_is_renotified_every_interval_until_it_resolves(
    backend: Backend, loopback: Loopback
) -> None:
    config = hook_alerts(loopback, renotify_interval_s=3600)
    engines = [backend.engine(), backend.engine()]
    try:
        engine = engines[0]
        incident = await store_incident(engine)
        async with Transport() as transport:
            d, other = (dispatcher(e, config, transport) for e in engines)
            await d.outbox.notify(notification(incident_id=incident), now=T0)
            await d.dispatch_due(T0)
            assert await d.renotify_due(T0 + timedelta(minutes=59)) == 0
            async with engine.begin() as connection:
                table = table_of(IncidentRow)
                await connection.execute(sa.update(table).where(table.c.id == incident).values(observed_ms=2000.0))
            # Two daemons see the reminder due at the same moment: it is enqueued once.
            added = await asyncio.gather(*(x.renotify_due(T0 + timedelta(minutes=61)) for x in (d, other)))
            assert sorted(added) == [0, 1]
            await d.dispatch_due(T0 + timedelta(minutes=61))
            assert await d.renotify_due(T0 + timedelta(hours=2, minutes=1)) == 1
            await d.dispatch_due(T0 + timedelta(hours=2, minutes=1))
            await resolve_incident(engine, incident, T0 + timedelta(hours=2, minutes=30))
            assert await d.renotify_due(T0 + timedelta(hours=5)) == 0
        bodies = [item.json()["data"] for item in loopback.received]
        assert [(b["repeat"], b["observed_ms"]) for b in bodies] == [(0, 1234.0), (1, 2000.0), (2, 2000.0)]
        assert bodies[1]["title"].endswith("(still open)")
        assert len({item.headers["webhook-id"] for item in loopback.received}) == 3
    finally:
        for e in engines:
            await e.dispose()


async def test_no_reminders_when_the_interval_is_zero(engine: AsyncEngine, loopback: Loopback) -> None:
    config = hook_alerts(loopback, renotify_interval_s=0)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0)
        assert await d.renotify_due(T0 + timedelta(days=10)) == 0


async def test_no_reminder_while_the_first_notice_is_still_being_retried(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    loopback.script("/hook", Reply(503, "down"))
    config = hook_alerts(loopback, renotify_interval_s=60)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0)
        assert await d.renotify_due(T0 + timedelta(minutes=5)) == 0


async def test_alertmanager_receivers_get_the_alert_again_every_minute_while_it_fires(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = alerts({"am": receiver("alertmanager", loopback.url())}, renotify_interval_s=0)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0)
        assert await d.renotify_due(T0 + timedelta(seconds=59)) == 0
        assert await d.renotify_due(T0 + timedelta(seconds=61)) == 1
        await d.dispatch_due(T0 + timedelta(seconds=61))
    first, second = (item.json()[0] for item in loopback.at("/api/v2/alerts"))
    assert first["labels"] == second["labels"]
    assert (first["endsAt"], second["endsAt"]) == ("2026-03-02T09:04:00Z", "2026-03-02T09:05:01Z")


async def test_a_reminder_during_a_silence_is_suppressed(engine: AsyncEngine, loopback: Loopback) -> None:
    window = Silence(start=T0 + timedelta(minutes=30), end=T0 + timedelta(hours=3))
    config = hook_alerts(loopback, renotify_interval_s=3600, silences=[window])
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0)
        await d.renotify_due(T0 + timedelta(hours=1, minutes=1))
        await d.dispatch_due(T0 + timedelta(hours=1, minutes=1))
    assert len(loopback.received) == 1
    assert [row.status for row in await outbox_rows(engine)] == ["sent", "suppressed"]


# ---------------------------------------------------------------- housekeeping


async def test_finished_rows_are_pruned_after_keep_days_but_an_open_incidents_first_notice_stays(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = hook_alerts(loopback, renotify_interval_s=3600)
    still_open = await store_incident(engine, target="a")
    over = await store_incident(engine, target="b")
    async with Transport() as transport:
        d = dispatcher(engine, config, transport, keep_days=30)
        await d.outbox.notify(notification(incident_id=still_open), now=T0)
        await d.outbox.notify(notification(incident_id=over), now=T0)
        await d.dispatch_due(T0)
        await d.renotify_due(T0 + timedelta(hours=1))
        await d.dispatch_due(T0 + timedelta(hours=1))
        await resolve_incident(engine, over, T0 + timedelta(hours=2))
        resolved = notification(incident_id=over, state="resolved", resolved_at=T0 + timedelta(hours=2))
        await d.outbox.notify(resolved, now=T0 + timedelta(hours=2))
        await d.dispatch_due(T0 + timedelta(hours=2))
        assert await d.prune(T0 + timedelta(days=29)) == 0
        assert await d.prune(T0 + timedelta(days=31)) == 4
        # The open incident is still reminded, counting from its first notice, and not announced anew.
        assert await d.outbox.notify(notification(incident_id=still_open), now=T0 + timedelta(days=31)) == [
            Enqueued("hook", "pending", False)
        ]
    rows = await outbox_rows(engine)
    assert [(row.incident_id, row.event) for row in rows] == [(still_open, "firing")]
    assert len(await deliveries(engine)) == 1


# ---------------------------------------------------------------- the task


async def test_the_dispatcher_task_delivers_at_once_and_a_slow_receiver_holds_up_nobody(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    loopback.script("/slow", Reply(200, "finally", delay_s=5))
    config = alerts(
        {
            "slow": receiver("webhook", loopback.url("/slow"), timeout_s=8),
            "fast": receiver("webhook", loopback.url("/fast")),
        }
    )
    incident = await store_incident(engine)
    stop = asyncio.Event()
    async with Transport() as transport:
        d = dispatcher(engine, config, transport, poll_interval_s=5.0)  # only `wake` can make it quick
        task = asyncio.create_task(d.run(stop, grace_s=0.2))
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        await d.outbox.notify(notification(incident_id=incident))
        enqueue_s = time.perf_counter() - started
        await loopback.wait_for(1, path="/fast", seconds=2)
        fast_s = time.perf_counter() - started
        stop.set()
        async with asyncio.timeout(2):
            await task  # bounded by grace_s, although /slow has not answered
    assert enqueue_s < 0.5 and fast_s < 1.5
    rows = {row.receiver: row for row in await outbox_rows(engine)}
    assert rows["fast"].status == "sent"
    # The slow delivery was cancelled at shutdown and its claim given back for the next start.
    assert (rows["slow"].status, rows["slow"].claimed_by, rows["slow"].attempts) == ("pending", None, 0)


async def test_the_dispatcher_task_rides_out_a_database_outage(backend: Backend, loopback: Loopback, outage) -> None:  # type: ignore[no-untyped-def]
    config = hook_alerts(loopback)
    setup = backend.engine()
    try:
        incident = await store_incident(setup)
    finally:
        await setup.dispose()
    from monitor.store.engine import create_engine

    engine = create_engine(outage.app_url, sqlite_busy_timeout_ms=outage.sqlite_busy_timeout_ms)
    stop = asyncio.Event()
    try:
        async with Transport() as transport:
            d = dispatcher(engine, config, transport)
            await outage.cut()
            task = asyncio.create_task(d.run(stop))
            await asyncio.sleep(0.5)
            assert not task.done()
            await outage.restore()
            await Outbox(engine, config).notify(notification(incident_id=incident))
            d.wake()
            await loopback.wait_for(1, seconds=10)
            stop.set()
            await asyncio.wait_for(task, timeout=5)
    finally:
        await engine.dispose()


async def test_a_database_cut_right_after_the_receiver_answered_does_not_send_it_twice(
    backend: Backend,
    loopback: Loopback,
    outage,  # type: ignore[no-untyped-def]
) -> None:
    # The claim (timeout 1 s + margin 0.5 s) expires while the database is away (2 s): before, the
    # recording failed, the claim expired and the same notification was sent again.
    config = alerts({"hook": receiver("webhook", loopback.url("/hook"), timeout_s=1)})
    setup = backend.engine()
    try:
        incident = await store_incident(setup)
        await Outbox(setup, config).notify(notification(incident_id=incident))
    finally:
        await setup.dispose()
    from monitor.store.engine import create_engine

    blips: list[asyncio.Task[None]] = []

    async def blip() -> None:
        await outage.cut()
        await asyncio.sleep(2)
        await outage.restore()

    def cut_as_it_arrives(_item: object) -> None:
        if not blips:
            blips.append(asyncio.get_running_loop().create_task(blip()))

    loopback.verify("/hook", cut_as_it_arrives)
    loopback.script("/hook", Reply(200, "ok", delay_s=0.2))  # answered once the database is gone
    engine = create_engine(outage.app_url, sqlite_busy_timeout_ms=outage.sqlite_busy_timeout_ms)
    stop = asyncio.Event()
    try:
        async with Transport() as transport:
            d = dispatcher(engine, config, transport, claim_margin_s=0.5)
            task = asyncio.create_task(d.run(stop))
            await loopback.wait_for(1, seconds=5)
            await asyncio.gather(*blips)
            await all_sent(engine, count=1, timeout_s=10)
            await asyncio.sleep(2)  # long past the claim: time for a second send, if one were coming
            stop.set()
            await asyncio.wait_for(task, timeout=5)
        (row,) = await outbox_rows(engine)
        attempts = await deliveries(engine)
    finally:
        await engine.dispose()
    assert len(loopback.at("/hook")) == 1
    assert (row.status, row.attempts, row.claimed_by) == ("sent", 1, None)
    assert [a.outcome for a in attempts] == ["ok"]


async def test_a_stop_while_a_sent_outcome_waits_for_the_database_keeps_the_claim_and_a_restart_does_not_resend(
    backend: Backend,
    loopback: Loopback,
    outage,  # type: ignore[no-untyped-def]
) -> None:
    # The receiver answered 2xx, the database went away before the answer was written, and the daemon
    # is stopped (SIGTERM) before it comes back. Giving the claim back would have the next start send
    # the page again at once; the claim is kept, and nothing else needs giving back.
    config = alerts({"hook": receiver("webhook", loopback.url("/hook"), timeout_s=1)})
    setup = backend.engine()
    try:
        incident = await store_incident(setup)
        await Outbox(setup, config).notify(notification(incident_id=incident))
    finally:
        await setup.dispose()
    from monitor.store.engine import create_engine

    cuts: list[asyncio.Task[None]] = []

    def cut_as_it_arrives(_item: object) -> None:
        if not cuts:
            cuts.append(asyncio.get_running_loop().create_task(outage.cut()))

    loopback.verify("/hook", cut_as_it_arrives)
    loopback.script("/hook", Reply(200, "ok", delay_s=0.2))  # answered once the database is gone
    engine = create_engine(outage.app_url, sqlite_busy_timeout_ms=outage.sqlite_busy_timeout_ms)
    stop = asyncio.Event()
    try:
        async with Transport() as transport:
            with capture_logs() as logs:
                stopped = dispatcher(engine, config, transport, claim_margin_s=30)  # claim: 1 s + 30 s
                task = asyncio.create_task(stopped.run(stop, grace_s=1))
                await loopback.wait_for(1, seconds=5)
                await asyncio.gather(*cuts)
                deadline = time.monotonic() + 10
                while not any(e["event"] == "alert_record_retry" for e in logs):
                    assert time.monotonic() < deadline, logs
                    await asyncio.sleep(0.05)
                stop.set()
                await asyncio.wait_for(task, timeout=10)
            await outage.restore()
            (row,) = await outbox_rows(engine)
            restarted = dispatcher(engine, config, transport)
            at_restart = await restarted.dispatch_due()
    finally:
        await engine.dispose()
    events = [e["event"] for e in logs]
    assert len(loopback.at("/hook")) == 1
    assert at_restart.attempted == 0
    assert (row.status, row.attempts, row.claimed_by) == ("pending", 0, stopped.worker_id)
    (unrecorded,) = [e for e in logs if e["event"] == "alert_outcome_unrecorded"]
    assert unrecorded["rows"] == 1
    # Nothing else was in flight, so nothing was given back: no write to a database known to be away.
    assert "alert_release_failed" not in events, events
