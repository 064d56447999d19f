"""The detection service on a real database (SQLite and PostgreSQL): runs stored, evaluated, incidents
and detector state written, notifications enqueued in the outbox; and one notification per outage.

The runs are built as the probe builds them (tests.support.store_fixtures.make_samples), slowed by a factor
where a test needs a regression.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from monitor.alert.text import headline
from monitor.commands.incidents import format_table
from monitor.store.models import DetectorStateRow, IncidentGroupRow, IncidentRow
from monitor.store.repository import Repository
from monitor.web.incidents import list_incidents
from tests.support.detection import (
    HEALTHY,
    PROVIDER_OF,
    RECOVERED,
    SLOW,
    config,
    disturbed,
    notifications,
    outage,
    rows,
    run_ticks,
    service_on,
    tick,
)
from tests.support.store_fixtures import T0, Backend

pytest_plugins = ("tests.support.store_fixtures",)


async def test_a_slow_series_opens_records_notifies_and_resolves_its_incident(backend: Backend) -> None:
    engine = backend.engine()
    try:
        await run_ticks(engine, service_on(engine, config()), outage({"a1": 3.0}), targets=("a1",))
        incidents = await rows(engine, IncidentRow)
        states = await rows(engine, DetectorStateRow)
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    # One page per slowed series, opened and resolved; the state moved on once per evaluated run.
    assert sorted((i.kind, i.severity, i.resolved_at is not None) for i in incidents) == [
        ("regression", "page", True),
        ("regression", "page", True),
    ]
    assert sorted(s.version for s in states) == [HEALTHY + SLOW + RECOVERED] * 2
    # The two prompts confirm a run apart: the first waits for the second (its streak has begun), so
    # one page names the model's two series; one resolve, with the same incident id (dedup key).
    assert [(n.state, len(n.members)) for n in sent] == [("firing", 2), ("resolved", 2)]
    assert len({n.incident_id for n in sent}) == 1
    assert headline(sent[0]).startswith("[PAGE] TTFT regression on a1: 2 series, median ")
    assert headline(sent[1]).startswith("[RESOLVED] TTFT regression on a1: 2 series")


async def test_a_series_never_stored_is_skipped_without_error(backend: Backend) -> None:
    engine = backend.engine()
    try:
        service = service_on(engine, config())
        await service.after_store("every-5m", tick(0, {}, targets=("a1",)))  # evaluated, not saved first
        assert await rows(engine, DetectorStateRow) == []
    finally:
        await engine.dispose()


async def test_one_slow_model_is_its_own_page_named_by_its_series(backend: Backend) -> None:
    engine = backend.engine()
    try:
        service = service_on(engine, config())
        plan = outage({"a1": 3.0})
        await run_ticks(engine, service, plan, targets=("a1", "a2", "b1"))
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    # Two prompts of one model: one group of its two series, nothing from the healthy models.
    firing = [n for n in sent if n.state == "firing"]
    assert len(firing) == 1, [headline(n) for n in sent]
    assert firing[0].members == ("a1 / long @ lab", "a1 / short @ lab")
    assert {n.target for n in sent} == {"a1"}


async def test_every_model_of_one_provider_slow_is_one_grouped_notification(backend: Backend) -> None:
    engine = backend.engine()
    try:
        service = service_on(engine, config())
        slow = {"a1": 2.5, "a2": 2.5, "a3": 2.5}
        await run_ticks(engine, service, outage(slow))
        incidents = await rows(engine, IncidentRow)
        groups = await rows(engine, IncidentGroupRow)
        sent = await notifications(engine)
        listed = await list_incidents(engine, now=T0 + timedelta(days=1), recent_days=7)
    finally:
        await engine.dispose()
    # Every member recorded, all in one group; one firing and one resolved notification for all six.
    assert len(incidents) == 6
    assert len({i.group_id for i in incidents}) == 1 and len(groups) == 1
    assert groups[0].resolved_at is not None and groups[0].provider == "gateway-a"
    assert [n.state for n in sent] == ["firing", "resolved"], [headline(n) for n in sent]
    page = sent[0]
    assert headline(page).startswith("[PAGE] TTFT regression on gateway-a: 3 targets, 6 series, median 2.")
    assert len(page.members) == 6 and page.group_id == groups[0].id
    assert sent[1].incident_id == page.incident_id  # one PagerDuty dedup key, one Alertmanager alert
    # `ttft-monitor incidents` lists every member, each saying which group it was notified in.
    assert len(listed) == 6 and {(item.group_id, item.group_size) for item in listed} == {(groups[0].id, 6)}
    assert format_table(listed, T0 + timedelta(days=1), 7).count(f"group: {str(groups[0].id)[:8]}") == 6


async def test_without_grouping_every_series_pages_on_its_own(backend: Backend) -> None:
    engine = backend.engine()
    try:
        service = service_on(engine, config(grouping=False))
        await run_ticks(engine, service, outage({"a1": 2.5, "a2": 2.5}), targets=("a1", "a2"))
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    firing = [n for n in sent if n.state == "firing"]
    assert len(firing) == 4 and not any(n.grouped for n in firing)
    assert len({n.incident_id for n in firing}) == 4


async def test_a_regression_seen_from_one_location_is_labelled_as_that_path(backend: Backend) -> None:
    engine = backend.engine()
    try:
        service = service_on(engine, config())
        repository = Repository(engine)
        for index, slow in enumerate(outage({"a1": 2.5, "a2": 2.5})):
            for location, factor in (("fra", slow), ("iad", {})):
                batch = tick(index, factor, location=location, targets=("a1", "a2"))
                await repository.save_runs(batch)
                await service.after_store("every-5m", batch)
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    firing = [n for n in sent if n.state == "firing"]
    assert len(firing) == 1
    assert headline(firing[0]).startswith("[PAGE] TTFT regression on fra -> gateway-a: 2 targets, 4 series")


async def test_two_daemons_on_one_database_send_one_grouped_notification(backend: Backend) -> None:
    engines = [backend.engine(), backend.engine()]
    try:
        settings = config()
        services = [service_on(engine, settings) for engine in engines]
        repository = Repository(engines[0])
        for index, slow in enumerate(outage({"a1": 2.5, "a2": 2.5, "a3": 2.5})[: HEALTHY + SLOW]):
            batch = tick(index, slow)
            await repository.save_runs(batch)
            # Each daemon evaluates half the series of the same run, at the same time.
            await asyncio.gather(
                services[0].after_store("every-5m", batch[0::2]), services[1].after_store("every-5m", batch[1::2])
            )
        incidents = await rows(engines[0], IncidentRow)
        sent = await notifications(engines[0])
    finally:
        for engine in engines:
            await engine.dispose()
    assert len(incidents) == 6 and len({i.group_id for i in incidents}) == 1
    firing = [n for n in sent if n.state == "firing"]
    # The two halves may be notified as they arrive (3, then 6 members), never as two outages.
    assert len({n.incident_id for n in firing}) == 1, [headline(n) for n in firing]
    assert len(firing[-1].members) == 6


async def test_replaying_the_stored_history_groups_as_the_daemon_did(backend: Backend) -> None:
    import io

    from monitor.detect.detector import Detector
    from monitor.detect.export import export_samples
    from monitor.detect.replay import GroupSettings, read_samples_csv, replay

    engine = backend.engine()
    try:
        settings = config()
        await run_ticks(engine, service_on(engine, settings), outage({"a1": 2.5, "a2": 2.5, "a3": 2.5}))
        sent = await notifications(engine)
        stream = io.StringIO()
        await export_samples(Repository(engine), stream)
    finally:
        await engine.dispose()
    stream.seek(0)
    groups: list[dict[str, Any]] = []
    incidents = list(
        replay(
            read_samples_csv(stream),
            lambda _series: Detector(settings.detection.rules()),
            provider_of=lambda series: PROVIDER_OF[series.split("/")[0]],
            grouping=GroupSettings(),
            groups=groups,
        )
    )
    assert len(incidents) == 6 and {i["group"] for i in incidents} == {"gateway-a#1"}
    assert [(n["state"], n["members"]) for n in groups[0]["notifications"]] == [(n.state, len(n.members)) for n in sent]


@pytest.mark.parametrize(("by", "pages"), [("location", 1), ("provider", 2)])
async def test_grouped_by_location_one_page_covers_every_provider_slow_from_there(
    backend: Backend, by: str, pages: int
) -> None:
    engine = backend.engine()
    try:
        service = service_on(engine, config(by=by))
        repository = Repository(engine)
        for index, slow in enumerate(outage({"a1": 2.5, "b1": 2.5})):
            for location, factor in (("fra", slow), ("iad", {})):
                batch = tick(index, factor, location=location, targets=("a1", "b1"))
                await repository.save_runs(batch)
                await service.after_store("every-5m", batch)
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    firing = [n for n in sent if n.state == "firing"]
    assert len(firing) == pages, [headline(n) for n in firing]
    if by == "location":
        assert headline(firing[0]).startswith("[PAGE] TTFT regression on from fra: 2 targets, 4 series")


@pytest.mark.parametrize("measured", [True, False], ids=["disturbed", "undisturbed"])
async def test_runs_of_disturbed_samples_with_a_huge_ttft_never_open_an_incident(
    backend: Backend, measured: bool
) -> None:
    engine = backend.engine()
    try:
        service = service_on(engine, config())
        repository = Repository(engine)
        with capture_logs() as logs:
            for index, slow in enumerate(outage({"a1": 20.0})):
                batch = tick(index, slow, targets=("a1",))
                if slow and measured:
                    batch = disturbed(batch)
                await repository.save_runs(batch)
                await service.after_store("every-5m", batch)
        incidents = await rows(engine, IncidentRow)
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    skipped = [e for e in logs if e["event"] == "detection_skipped_disturbed"]
    if not measured:  # the control: the same TTFTs as evidence page
        assert {(i.kind, i.severity) for i in incidents} == {("regression", "page")}
        assert [n.state for n in sent] == ["firing", "resolved"]
        assert skipped == []
        return
    assert incidents == [] and sent == []
    # Said per run: both prompts of each of the SLOW runs, nothing of them evaluated.
    assert len(skipped) == 2 * SLOW
    assert {(e["target"], e["samples"], e["disturbed"], e["run_evaluated"]) for e in skipped} == {("a1", 5, 5, False)}
    assert {e["self_delay_max_ms"] for e in skipped} == {250.0}
