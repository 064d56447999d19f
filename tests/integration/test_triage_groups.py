"""Triage meets grouping, on both databases: a group's one page is resolved (under its lead's id)
when a person resolves its last open member, not early when they resolve the lead; an acknowledged
member quiets the whole page; the page is reminded while any member is open; retention takes groups
and change markers with the incidents they belong to."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.dispatcher import Dispatcher
from monitor.alert.model import Notification
from monitor.alert.outbox import Outbox
from monitor.alert.text import headline
from monitor.alert.transport import Transport
from monitor.config.models import Config
from monitor.store.models import (
    AlertOutboxRow,
    AnnotationRow,
    IncidentGroupRow,
    IncidentRow,
    IncidentTriageRow,
    table_of,
)
from monitor.store.repository import Repository
from monitor.store.triage import TriageStore
from monitor.triage.service import Triage, TriageRefused
from monitor.triage.stats import Judged, per_notification
from tests.support.detection import HEALTHY, config, notifications, rows, run_ticks, service_on, tick
from tests.support.store_fixtures import T0, Backend

pytest_plugins = ("tests.support.store_fixtures",)
# Each builds an outage of 27 runs over 8 series: seconds alone, a minute on a loaded machine.
pytestmark = pytest.mark.timeout(240)

SLOW = {"a1": 2.5, "a2": 2.5, "a3": 2.5}
TICKS = HEALTHY + 5  # mid-outage: the group's page is out, every member still open
NOW = T0 + timedelta(minutes=5 * TICKS)


def settings(**alerts: object) -> Config:
    base = config()
    return base.model_copy(update={"alerts": base.alerts.model_copy(update=alerts)})


async def mid_outage(engine: AsyncEngine, setup: Config) -> tuple[list[IncidentRow], Notification]:
    """Every model of gateway-a slow for a few runs: one group of six open members, paged once."""
    await run_ticks(engine, service_on(engine, setup), [{}] * HEALTHY + [SLOW] * (TICKS - HEALTHY))
    incidents = await rows(engine, IncidentRow)
    sent = await notifications(engine)
    assert [n.state for n in sent] == ["firing"], [headline(n) for n in sent]
    assert len(incidents) == 6 and all(i.resolved_at is None for i in incidents)
    return incidents, sent[0]


async def test_resolving_the_lead_by_hand_keeps_the_page_and_the_last_member_resolves_it(backend: Backend) -> None:
    engine = backend.engine()
    try:
        setup = settings()
        incidents, page = await mid_outage(engine, setup)
        triage = Triage(engine, setup, clock=lambda: NOW)
        lead = page.incident_id
        others = [i.id for i in incidents if i.id != lead]
        done = await triage.resolve(str(lead), by="alice", note="gateway restarted")
        # The lead closed, the outage did not: no resolve under the page's dedup key yet.
        assert done.group_open == 5 and done.enqueued == []
        assert [n.state for n in await notifications(engine)] == ["firing"]
        for incident_id in others[:-1]:
            assert (await triage.resolve(str(incident_id), by="alice", note=None)).enqueued == []
        assert [n.state for n in await notifications(engine)] == ["firing"]
        last = await triage.resolve(str(others[-1]), by="bob", note="all green")
        sent = await notifications(engine)
        groups = await rows(engine, IncidentGroupRow)
    finally:
        await engine.dispose()
    # The last member closes the group: one resolve, under the lead's id, naming who closed it.
    assert last.group_open == 0 and [item.status for item in last.enqueued] == ["pending"]
    assert [n.state for n in sent] == ["firing", "resolved"], [headline(n) for n in sent]
    assert sent[1].incident_id == lead and sent[1].group_id == page.group_id and len(sent[1].members) == 6
    assert sent[1].summary == "Resolved by hand by bob: all green"
    assert sent[1].job == "every-5m"
    assert groups[0].resolved_at is not None


async def test_acknowledging_any_member_quiets_the_groups_page(backend: Backend) -> None:
    engine = backend.engine()
    try:
        setup = settings()
        incidents, page = await mid_outage(engine, setup)
        member = next(i.id for i in incidents if i.id != page.incident_id)
        await Triage(engine, setup, clock=lambda: NOW).ack(str(member), by="alice")
        # The group grows (a new member): recorded, not sent, as for an acknowledged lead.
        grown = page.with_changes(members=(*page.members, "a9 / short @ lab"))
        enqueued = await Outbox(engine, setup.alerts).notify(grown, now=NOW)
    finally:
        await engine.dispose()
    assert [item.status for item in enqueued] == ["suppressed"]
    assert enqueued[0].reason is not None and enqueued[0].reason.startswith("acknowledged by alice")


async def test_the_groups_page_is_reminded_while_a_member_is_open_after_its_lead_recovered(backend: Backend) -> None:
    engine = backend.engine()
    try:
        setup = settings(renotify_interval_s=3600)
        _incidents, page = await mid_outage(engine, setup)
        await Triage(engine, setup, clock=lambda: NOW).resolve(str(page.incident_id), by="alice", note=None)
        async with Transport() as transport:
            dispatcher = Dispatcher(engine, setup.alerts, transport, rng=random.Random(7), poll_interval_s=0.05)
            await dispatcher.dispatch_due()
            # The page was enqueued at the wall clock's now.
            added = await dispatcher.renotify_due(datetime.now(UTC) + timedelta(hours=2, minutes=1))
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    assert added == 1
    reminder = sent[-1]
    assert reminder.repeat == 2 and reminder.incident_id == page.incident_id
    # What the page said, not the recovered lead's numbers.
    assert reminder.ratio == page.ratio and len(reminder.members) == 6


async def test_retention_takes_resolved_groups_triage_and_old_change_markers(backend: Backend) -> None:
    engine = backend.engine()
    try:
        setup = settings()
        incidents, page = await mid_outage(engine, setup)
        triage = Triage(engine, setup, clock=lambda: NOW)
        await triage.ack(str(page.incident_id), by="alice")
        await triage.annotate("vLLM upgraded", target=None, by="alice")
        for incident in incidents:
            await triage.resolve(str(incident.id), by="alice", note=None)
        outbox = table_of(AlertOutboxRow)
        async with engine.begin() as connection:  # the dispatcher's own retention has run
            await connection.execute(sa.delete(outbox))
        repository = Repository(engine)
        kept = await repository.prune(NOW + timedelta(days=1), raw_days=400, rollup_days=2)
        assert (kept.incidents, kept.incident_groups, kept.annotations) == (0, 0, 0)
        assert len(await rows(engine, IncidentGroupRow)) == 1 and len(await rows(engine, AnnotationRow)) == 1
        pruned = await repository.prune(NOW + timedelta(days=3), raw_days=400, rollup_days=2)
        left = [len(await rows(engine, model)) for model in (IncidentRow, IncidentGroupRow, IncidentTriageRow)]
        marks = await rows(engine, AnnotationRow)
    finally:
        await engine.dispose()
    assert (pruned.incidents, pruned.incident_groups, pruned.annotations) == (6, 1, 1)
    assert left == [0, 0, 0] and marks == []


async def test_a_groups_page_names_the_change_markers_of_any_member(backend: Backend) -> None:
    engine = backend.engine()
    try:
        store = TriageStore(engine)
        outage_began = T0 + timedelta(minutes=5 * HEALTHY)
        await store.annotate("a3 rolled out", target="a3", by="ops", now=outage_began - timedelta(minutes=20))
        await store.annotate("b1 rolled out", target="b1", by="ops", now=outage_began - timedelta(minutes=10))
        _incidents, page = await mid_outage(engine, settings())
    finally:
        await engine.dispose()
    assert page.target != "a3" and len(page.members) == 6
    assert "a3 rolled out" in page.annotation and "b1 rolled out" not in page.annotation


def test_a_group_counts_once_in_the_precision_table_with_its_leads_label_else_its_members() -> None:
    lead, other, third = "L", "M", "N"
    judged = [
        Judged(lead, "regression", "ticket", "true-positive", "g1", lead),
        Judged(other, "regression", "page", None, "g1", lead),
        Judged(third, "regression", "page", "false-positive", "g1", lead),
        # A group whose lead nobody labelled: its members' most common label.
        Judged("a", "regression", "page", None, "g2", "a"),
        Judged("b", "regression", "page", "false-positive", "g2", "a"),
        Judged("c", "regression", "page", "false-positive", "g2", "a"),
        Judged("d", "regression", "page", "true-positive", "g2", "a"),
        # Not grouped: each its own page.
        Judged("s", "slo_burn", "page", None),
        Judged("t", "slo_burn", "page", "true-positive"),
    ]
    assert sorted(per_notification(judged), key=str) == sorted(
        [
            ("regression", "page", "true-positive", 1),
            ("regression", "page", "false-positive", 1),
            ("slo_burn", "page", None, 1),
            ("slo_burn", "page", "true-positive", 1),
        ],
        key=str,
    )


async def test_labelling_a_groups_page_makes_one_true_positive_not_five_unlabelled(backend: Backend) -> None:
    engine = backend.engine()
    try:
        setup = settings()
        _incidents, page = await mid_outage(engine, setup)
        triage = Triage(engine, setup, clock=lambda: NOW)
        await triage.label(str(page.incident_id), "true-positive", by="alice")
        table = {(row.kind, row.severity): row for row in await triage.stats(days=None)}
    finally:
        await engine.dispose()
    page_row = table[("regression", "page")]
    assert (page_row.true_positive, page_row.unlabelled, page_row.precision) == (1, 0, 1.0)


async def test_a_group_whose_members_were_all_closed_elsewhere_is_resolved_at_the_next_batch(
    backend: Backend,
) -> None:
    """Members closed without the group being told (by hand in SQL, or by `incidents resolve` before
    it resolved groups): the daemon's next batch resolves the group and sends its one resolve."""
    engine = backend.engine()
    try:
        setup = settings()
        _incidents, page = await mid_outage(engine, setup)
        incidents = table_of(IncidentRow)
        async with engine.begin() as connection:
            await connection.execute(sa.update(incidents).values(resolved_at=NOW))
        service = service_on(engine, setup)
        repository = Repository(engine)
        batch = tick(TICKS, {}, targets=("b1",))  # any batch at all, of another provider
        await repository.save_runs(batch)
        await service.after_store("every-5m", batch)
        sent = await notifications(engine)
        groups = await rows(engine, IncidentGroupRow)
    finally:
        await engine.dispose()
    assert [n.state for n in sent] == ["firing", "resolved"], [headline(n) for n in sent]
    assert sent[1].incident_id == page.incident_id and groups[0].resolved_at is not None


async def test_the_page_can_be_acknowledged_by_its_id_after_the_lead_recovered(backend: Backend) -> None:
    """The page carries the lead's id; once the lead recovered (the group has not), acknowledging that
    id still works and quiets the reminders."""
    engine = backend.engine()
    try:
        setup = settings(renotify_interval_s=3600)
        _incidents, page = await mid_outage(engine, setup)
        async with engine.begin() as connection:
            await connection.execute(
                sa.update(table_of(IncidentRow)).where(IncidentRow.id == page.incident_id).values(resolved_at=NOW)
            )
        acked = await Triage(engine, setup, clock=lambda: NOW).ack(str(page.incident_id), by="alice")
        async with Transport() as transport:
            dispatcher = Dispatcher(engine, setup.alerts, transport, rng=random.Random(7), poll_interval_s=0.05)
            await dispatcher.dispatch_due()
            added = await dispatcher.renotify_due(datetime.now(UTC) + timedelta(hours=2, minutes=1))
    finally:
        await engine.dispose()
    assert not acked.already and added == 0


async def test_resolving_a_recovered_lead_names_the_members_that_keep_the_page_open(backend: Backend) -> None:
    engine = backend.engine()
    try:
        setup = settings()
        incidents, page = await mid_outage(engine, setup)
        triage = Triage(engine, setup, clock=lambda: NOW)
        await triage.resolve(str(page.incident_id), by="alice", note=None)
        with pytest.raises(TriageRefused) as refused:
            await triage.resolve(str(page.incident_id), by="alice", note=None)
    finally:
        await engine.dispose()
    assert "its group's page stays open while 5 member(s) are: resolve " in str(refused.value)
    others = sorted(str(i.id)[:8] for i in incidents if i.id != page.incident_id)
    assert sorted(str(refused.value).split("resolve ")[-1].split(", ")) == others
