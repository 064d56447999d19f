"""Triage on both databases: ack stops reminders and escalations but not the resolve, a manual resolve
is notified and forgotten by the detector, labels make the precision table, and change markers are
named in the notifications of incidents that began within an hour after them."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.dispatcher import Dispatcher
from monitor.alert.outbox import Outbox
from monitor.alert.settings import Alerts
from monitor.alert.transport import Transport
from monitor.commands.incidents import format_table
from monitor.config.models import Config
from monitor.store.models import DetectorStateRow, IncidentRow, table_of
from monitor.store.triage import IncidentLookupError, TriageStore, prefix_bounds
from monitor.triage.service import Triage, TriageRefused
from monitor.triage.stats import PrecisionRow, format_precision, precision_table
from monitor.web.incidents import list_incidents
from tests.support.alert_fixtures import T0, Loopback, alerts, notification, outbox_rows, receiver, store_incident
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")


@pytest.fixture
def backend(alert_backend: Backend) -> Backend:
    return alert_backend


@pytest.fixture
async def engine(backend: Backend) -> AsyncEngine:  # type: ignore[misc]
    engine = backend.engine()
    yield engine
    await engine.dispose()


def hook(loopback: Loopback, **fields: object) -> Alerts:
    return alerts({"hook": receiver("webhook", loopback.url("/hook"))}, **fields)


def triage(engine: AsyncEngine, config: Alerts, at: object = None) -> Triage:
    moment = at or T0 + timedelta(minutes=30)
    return Triage(engine, Config().model_copy(update={"alerts": config}), clock=lambda: moment)  # type: ignore[arg-type,return-value]


def dispatcher(engine: AsyncEngine, config: Alerts, transport: Transport) -> Dispatcher:
    return Dispatcher(engine, config, transport, rng=random.Random(7), poll_interval_s=0.05)


# ---------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        # kind, severity, label, count -> (kind, severity, precision, tp, fp, expected, unlabelled)
        ([], []),
        (
            [("regression", "page", "true-positive", 3), ("regression", "page", "false-positive", 1)],
            [("regression", "page", 0.75, 3, 1, 0, 0), ("all", "all", 0.75, 3, 1, 0, 0)],
        ),
        (
            [("regression", "ticket", "expected", 2), ("regression", "ticket", None, 4)],
            [("regression", "ticket", None, 0, 0, 2, 4), ("all", "all", None, 0, 0, 2, 4)],
        ),
        (
            [
                ("slo", "page", "false-positive", 1),
                ("availability", "page", "true-positive", 2),
                ("regression", "page", "expected", 5),
                ("regression", "page", "true-positive", 1),
            ],
            [
                ("availability", "page", 1.0, 2, 0, 0, 0),
                ("regression", "page", 1.0, 1, 0, 5, 0),
                ("slo", "page", 0.0, 0, 1, 0, 0),
                ("all", "all", 0.75, 3, 1, 5, 0),
            ],
        ),
    ],
)
def test_precision_is_true_over_true_plus_false_with_expected_apart(
    counts: list[tuple[str, str, str | None, int]], expected: list[tuple[object, ...]]
) -> None:
    rows = precision_table(counts)
    got = [(r.kind, r.severity, r.precision, r.true_positive, r.false_positive, r.expected, r.unlabelled) for r in rows]
    assert got == expected


def test_the_precision_table_prints_percentages_and_a_dash_before_any_label() -> None:
    text = format_precision([PrecisionRow("regression", "page", 3, 1, 1, 2), PrecisionRow("slo", "ticket", 0, 0, 0, 4)])
    lines = text.splitlines()
    assert lines[0].split() == ["KIND", "SEVERITY", "PRECISION", "TRUE-POS", "FALSE-POS", "EXPECTED", "UNLABELLED"]
    assert lines[1].split() == ["regression", "page", "75%", "3", "1", "1", "2"]
    assert lines[2].split() == ["slo", "ticket", "-", "0", "0", "0", "4"]
    assert format_precision([]) == "no incidents to count\n"


@pytest.mark.parametrize("given", ["", "abc", "xyz123", "0e6f1a52-zz", "0" * 33, "'; DROP TABLE incidents; --"])
def test_an_id_that_is_not_a_hex_prefix_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match="is not an incident id"):
        prefix_bounds(given)


def test_an_id_prefix_spans_every_uuid_starting_with_it() -> None:
    low, high = prefix_bounds("0E6F-1a52")
    assert (str(low), str(high)) == ("0e6f1a52-0000-0000-0000-000000000000", "0e6f1a52-ffff-ffff-ffff-ffffffffffff")


# ---------------------------------------------------------------- ack


async def test_an_acknowledged_incident_gets_no_reminders_nor_escalations_but_its_resolve(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = hook(loopback, renotify_interval_s=600)
    incident = await store_incident(engine, severity="ticket")
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident, severity="ticket"), now=T0)
        await d.dispatch_due(T0)
        acked = await triage(engine, config).ack(str(incident)[:8], by="alice")
        assert not acked.already
        assert await d.renotify_due(T0 + timedelta(hours=2)) == 0
        escalated = await d.outbox.notify(
            notification(incident_id=incident, severity="page"), now=T0 + timedelta(hours=2)
        )
        assert [(e.status, e.reason) for e in escalated] == [
            ("suppressed", "acknowledged by alice at 2026-03-02 09:30 UTC")
        ]
        resolved = notification(incident_id=incident, state="resolved", resolved_at=T0 + timedelta(hours=3))
        assert [e.status for e in await d.outbox.notify(resolved, now=T0 + timedelta(hours=3))] == ["pending"]
        await d.dispatch_due(T0 + timedelta(hours=3))
    assert [item.json()["type"] for item in loopback.received] == ["incident.firing", "incident.resolved"]


async def test_without_an_ack_the_same_incident_is_reminded(engine: AsyncEngine, loopback: Loopback) -> None:
    # The control for the test above: the reminder and the escalation are due and sent.
    config = hook(loopback, renotify_interval_s=600)
    incident = await store_incident(engine, severity="ticket")
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident, severity="ticket"), now=T0)
        await d.dispatch_due(T0)
        assert await d.renotify_due(T0 + timedelta(hours=2)) == 1
        escalated = await d.outbox.notify(
            notification(incident_id=incident, severity="page"), now=T0 + timedelta(hours=2)
        )
        assert [e.status for e in escalated] == ["pending"]


async def test_acking_twice_keeps_the_first_and_a_resolved_incident_cannot_be_acked(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = hook(loopback)
    incident = await store_incident(engine)
    await triage(engine, config).ack(str(incident), by="alice")
    again = await triage(engine, config, T0 + timedelta(hours=1)).ack(str(incident), by="bob")
    assert again.already and again.facts.acked_by == "alice"
    await triage(engine, config).resolve(str(incident), by="alice", note=None)
    with pytest.raises(TriageRefused, match="was resolved at 2026-03-02 09:30 UTC; only an open incident"):
        await triage(engine, config).ack(str(incident), by="bob")


async def test_unknown_and_ambiguous_ids_are_named(engine: AsyncEngine, loopback: Loopback) -> None:
    config = hook(loopback)
    await store_incident(engine, incident_id=uuid.UUID("abcd0000-0000-4000-8000-000000000001"))
    await store_incident(engine, incident_id=uuid.UUID("abcd0000-0000-4000-8000-000000000002"), target="other")
    with pytest.raises(IncidentLookupError, match="no incident with id 'ffff'"):
        await triage(engine, config).ack("ffff", by="x")
    with pytest.raises(IncidentLookupError, match="'abcd' matches several incidents"):
        await triage(engine, config).label("abcd", "expected", by="x")
    with pytest.raises(IncidentLookupError, match="is not an incident id"):
        await triage(engine, config).ack("not-an-id", by="x")
    facts = await triage(engine, config).label("abcd0000-0000-4000-8000-000000000002", "expected", by="x")
    assert facts.target == "other"


# ---------------------------------------------------------------- resolve


async def test_a_manual_resolve_closes_it_stores_the_note_notifies_and_the_detector_forgets_it(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = hook(loopback)
    incident = await store_incident(engine)
    state_table = table_of(DetectorStateRow)
    async with engine.begin() as connection:
        series_id = await connection.scalar(sa.select(IncidentRow.series_id).where(IncidentRow.id == incident))
        detector_state = {"version": 1, "page_streak": 3, "incidents": {"regression": {"x": 1}, "slo": {"y": 2}}}
        await connection.execute(
            sa.insert(state_table).values(series_id=series_id, state=detector_state, version=4, updated_at=T0)
        )
    outbox = Outbox(engine, config)
    await outbox.notify(notification(incident_id=incident), now=T0)
    done = await triage(engine, config).resolve(str(incident)[:8], by="alice", note="rolled back vLLM")
    assert [(e.receiver, e.status) for e in done.enqueued] == [("hook", "pending")]
    rows = await outbox_rows(engine)
    # The firing notice was never sent: the resolve supersedes it, as for a detector resolve.
    assert [(r.event, r.status) for r in rows] == [("firing", "superseded"), ("resolved", "pending")]
    sent = rows[1].payload
    assert sent["state"] == "resolved" and sent["summary"] == "Resolved by hand by alice: rolled back vLLM"
    assert sent["observed_ms"] is None and sent["ratio"] is None  # nobody measured it back to normal
    async with engine.connect() as connection:
        resolved_at = await connection.scalar(sa.select(IncidentRow.resolved_at).where(IncidentRow.id == incident))
        state = (await connection.execute(sa.select(state_table.c.state, state_table.c.version))).one()
        record = (await TriageStore.records(connection, [incident]))[incident]
    assert resolved_at == T0 + timedelta(minutes=30)
    assert state.state["incidents"] == {"slo": {"y": 2}} and state.state["page_streak"] == 3 and state.version == 5
    assert (record.resolved_by, record.note) == ("alice", "rolled back vLLM")
    with pytest.raises(TriageRefused, match="is already resolved at 2026-03-02 09:30 UTC"):
        await triage(engine, config).resolve(str(incident), by="bob", note=None)


async def test_a_manual_resolve_of_an_incident_never_notified_is_built_from_the_row(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = hook(loopback, base_url="https://grafana.example.com/d/ttft")
    incident = await store_incident(engine)
    await triage(engine, config).resolve(str(incident), by="alice", note=None)
    (row,) = await outbox_rows(engine)
    assert row.payload["job"] == "every-5m" and row.payload["target"] == "qwen3-8b"
    assert row.payload["summary"] == "Resolved by hand by alice."
    assert row.payload["link"].startswith("https://grafana.example.com/d/ttft?var-target=qwen3-8b")


# ---------------------------------------------------------------- labels and stats


async def test_labels_make_the_precision_table(engine: AsyncEngine, loopback: Loopback) -> None:
    config = hook(loopback)
    ids = [await store_incident(engine, target=f"t{i}", severity="page") for i in range(4)]
    ids.append(await store_incident(engine, target="t9", severity="ticket"))
    t = triage(engine, config)
    await t.label(str(ids[0]), "false-positive", by="a")
    await t.label(str(ids[0]), "true-positive", by="a")  # relabelled: the last label counts
    await t.label(str(ids[1]), "true-positive", by="a")
    await t.label(str(ids[2]), "false-positive", by="a")
    await t.label(str(ids[3]), "expected", by="a")
    rows = {(r.kind, r.severity): r for r in await t.stats(days=None)}
    page = rows[("regression", "page")]
    assert (page.true_positive, page.false_positive, page.expected, page.unlabelled) == (2, 1, 1, 0)
    assert page.precision == pytest.approx(2 / 3)
    assert rows[("regression", "ticket")].unlabelled == 1 and rows[("regression", "ticket")].precision is None
    assert await triage(engine, config, T0 + timedelta(days=30)).stats(days=1) == []


# ---------------------------------------------------------------- annotations


async def test_a_notification_names_the_change_marker_from_the_hour_before(
    engine: AsyncEngine, loopback: Loopback
) -> None:
    config = hook(loopback)
    store = TriageStore(engine)
    await store.annotate("old change", target=None, by="a", now=T0 - timedelta(minutes=61))
    await store.annotate("vLLM upgraded", target="qwen3-8b", by="a", now=T0 - timedelta(minutes=58))
    await store.annotate("other target", target="gpt-4o-mini", by="a", now=T0 - timedelta(minutes=30))
    await store.annotate("after it", target=None, by="a", now=T0 + timedelta(minutes=10))
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0 + timedelta(minutes=5))
        await d.dispatch_due(T0 + timedelta(minutes=5))
        unrelated = await store_incident(engine, target="llama")
        await d.outbox.notify(notification(incident_id=unrelated, target="llama"), now=T0 + timedelta(minutes=5))
        await d.dispatch_due(T0 + timedelta(minutes=5))
    first, second = (item.json()["data"]["text"] for item in loopback.received)
    assert "Change: after annotation 'vLLM upgraded' at 08:02 UTC" in first
    assert "old change" not in first and "other target" not in first and "after it" not in first
    assert "Change:" not in second
    listed = await list_incidents(engine, now=T0 + timedelta(minutes=20), recent_days=7)
    by_id = {item.id: item for item in listed}
    assert [m.text for m in by_id[incident].annotations] == ["vLLM upgraded", "after it"]
    assert [m.text for m in by_id[unrelated].annotations] == ["after it"]


async def test_incidents_lists_acks_labels_notes_and_annotations(engine: AsyncEngine, loopback: Loopback) -> None:
    config = hook(loopback)
    now = T0 + timedelta(minutes=40)
    incident = await store_incident(engine)
    await TriageStore(engine).annotate("vLLM upgraded", target=None, by="bob", now=T0 - timedelta(minutes=10))
    t = triage(engine, config)
    await t.ack(str(incident), by="alice")
    await t.label(str(incident), "true-positive", by="alice")
    await t.resolve(str(incident), by="alice", note="rolled back")
    listed = await list_incidents(engine, now=now, recent_days=7)
    (item,) = listed
    data = item.to_json()
    assert (data["acked_by"], data["label"], data["resolved_by"], data["note"]) == (
        "alice",
        "true-positive",
        "alice",
        "rolled back",
    )
    assert data["acked_at"] == "2026-03-02T09:30:00Z"
    assert [a["text"] for a in data["annotations"]] == ["vLLM upgraded"]
    async with engine.connect() as connection:
        marks = await TriageStore.annotations_between(connection, T0 - timedelta(days=1), now)
    text = format_table(listed, now, 7, marks)
    assert "  acked: by alice at 2026-03-02 09:30" in text
    assert "  resolved by hand: by alice: rolled back" in text
    assert "  label: true-positive" in text
    assert "  change: after annotation 'vLLM upgraded' at 08:50 UTC" in text
    assert text.endswith("annotations in the last 7 days:\n  2026-03-02 08:50  all targets: vLLM upgraded (by bob)\n")


async def test_the_incidents_api_shows_the_triage_fields(engine: AsyncEngine, loopback: Loopback) -> None:
    from monitor.web import queries

    config = hook(loopback)
    incident = await store_incident(engine)
    untouched = await store_incident(engine, target="gpt-4o-mini")
    await TriageStore(engine).annotate("vLLM upgraded", target="qwen3-8b", by="bob", now=T0 - timedelta(minutes=5))
    t = triage(engine, config)
    await t.ack(str(incident), by="alice")
    await t.label(str(incident), "expected", by="alice")
    items = await queries.incidents(engine, start=T0 - timedelta(days=1), end=T0 + timedelta(hours=1))
    by_id = {item["id"]: item for item in items}
    mine, other = by_id[str(incident)], by_id[str(untouched)]
    assert (mine["acked_by"], mine["acked_at"], mine["label"], mine["note"]) == (
        "alice",
        "2026-03-02T09:30:00Z",
        "expected",
        None,
    )
    assert [a["text"] for a in mine["annotations"]] == ["vLLM upgraded"]
    assert (other["acked_by"], other["label"], other["annotations"]) == (None, None, [])


async def test_alertmanager_keeps_its_keepalive_re_sends_after_an_ack(engine: AsyncEngine, loopback: Loopback) -> None:
    # Alertmanager resolves an alert whose endsAt passes: its 60 s re-sends are a keep-alive, not a
    # reminder to a person, so an ack must not stop them (Alertmanager dedups them itself).
    config = alerts({"am": receiver("alertmanager", loopback.url())}, renotify_interval_s=600)
    incident = await store_incident(engine)
    async with Transport() as transport:
        d = dispatcher(engine, config, transport)
        await d.outbox.notify(notification(incident_id=incident), now=T0)
        await d.dispatch_due(T0)
        await triage(engine, config).ack(str(incident), by="alice")
        assert await d.renotify_due(T0 + timedelta(seconds=61)) == 1


async def test_after_a_manual_resolve_the_detector_leaves_the_closed_incident_alone(backend: Backend) -> None:
    import dataclasses

    from monitor.detect.service import DetectionService
    from monitor.store.repository import Repository
    from tests.support.store_fixtures import T0 as RUNS_T0
    from tests.support.store_fixtures import make_batch

    engine = backend.engine()
    table = table_of(IncidentRow)
    try:
        repository = Repository(engine)
        service = DetectionService(engine, repository, Config(), outbox=None, metrics=None)
        rng = random.Random(7)

        async def run(i: int, slow: bool) -> None:
            batch = make_batch(RUNS_T0 + timedelta(minutes=5 * i), targets=("qwen3-8b",), prompts=("short",))
            level = 1200.0 if slow else 400.0
            changed = [(dataclasses.replace(r, ttft_p50_ms=level + rng.uniform(-10, 10)), s) for r, s in batch]
            await repository.save_runs(changed)
            await service.after_store("every-5m", changed)

        async def regressions() -> list[sa.Row]:
            async with engine.connect() as connection:
                query = sa.select(table).where(table.c.kind == "regression").order_by(table.c.opened_at)
                return list((await connection.execute(query)).all())

        i = 0
        for i in range(60):
            await run(i, slow=False)
        while not await regressions():
            i += 1
            assert i < 80, "no regression opened"
            await run(i, slow=True)
        (opened,) = await regressions()
        resolved_at = RUNS_T0 + timedelta(minutes=5 * i + 1)
        await triage(engine, alerts({}), resolved_at).resolve(str(opened.id), by="alice", note="known")
        for j in range(i + 1, i + 4):
            await run(j, slow=True)
        for j in range(i + 4, i + 40):  # and it recovers: the detector has nothing of it left to resolve
            await run(j, slow=False)
        rows = await regressions()
    finally:
        await engine.dispose()
    closed = next(row for row in rows if row.id == opened.id)
    assert (closed.resolved_at, closed.updated_at) == (resolved_at, resolved_at)
    # Any later incident is a new one, not the closed one resumed or resolved a second time.
    assert all(row.opened_at > resolved_at for row in rows if row.id != opened.id), rows
