"""SLO burn rates against the store, on SQLite and PostgreSQL: the windows counted in SQL equal the pure
count over the same probes, and the detection pass opens, raises and resolves one `slo_burn`
incident per target and location, with one notification per change even when two evaluate at once."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy import func, select
from structlog.testing import capture_logs

from monitor.alert.model import Notification
from monitor.alert.outbox import Outbox
from monitor.config.models import Config
from monitor.detect.burn import BurnPolicy, BurnRule, Probe, is_good, window_counts
from monitor.detect.burn_service import BurnService, count_windows
from monitor.detect.service import DetectionService
from monitor.probe.result import ErrorClass, Sample
from monitor.store.models import IncidentRow, SeriesRow
from monitor.store.records import RunRecord, runs_from_samples
from monitor.store.repository import Repository
from tests.support.store_fixtures import PROVIDERS, T0, Backend, make_samples

pytest_plugins = ("tests.support.store_fixtures",)

POLICY = BurnPolicy(
    threshold_ms=300.0,
    objective=0.99,
    rules=(BurnRule("page", 14.4, 3600.0, 300.0), BurnRule("ticket", 1.0, 6 * 3600.0, 1800.0)),
    min_probes=10,
    keep_firing_s=0.0,
)


class RecordingOutbox:
    """Keeps what would be enqueued; the outbox itself is tested in tests/integration/test_alert_outbox.py."""

    def __init__(self) -> None:
        self.sent: list[Notification] = []

    async def notify(self, notification: Notification, *, connection: Any = None) -> list[Any]:
        self.sent.append(notification)
        return []


def run_at(
    minute: float,
    *,
    slow: float = 0.0,
    target: str = "qwen3-8b",
    location: str = "lab",
    prompts: Sequence[str] = ("short", "long"),
    rng: random.Random,
    fail: float = 1 / 40,
) -> list[tuple[RunRecord, list[Sample]]]:
    """One tick: per prompt, a run of 3 probes after 1 warm-up; each probe is 1,000 ms with chance `slow`
    (else 200 ms), and fails with chance `fail`."""
    samples = []
    for prompt in prompts:
        for sample in make_samples(target, prompt, at=T0 + timedelta(minutes=minute), rounds=3, warmup=1, rng=rng):
            failed = not sample.warmup and rng.random() < fail
            ttft = 1000.0 if rng.random() < slow else 200.0
            samples.append(
                dataclasses.replace(
                    sample,
                    ttft_ms=None if failed else (5000.0 if sample.warmup else ttft),  # a slow warm-up never counts
                    error=ErrorClass.SERVER_ERROR if failed else None,
                )
            )
    return runs_from_samples(samples, job="every-5m", location=location, provider_of=PROVIDERS)


def probes_of(batches: Sequence[Sequence[tuple[RunRecord, list[Sample]]]], target: str, location: str) -> list[Probe]:
    return [
        Probe(run.started_at, is_good(s.ttft_ms, s.error.value if s.error else None, POLICY.threshold_ms))
        for batch in batches
        for run, samples in batch
        if run.series.target == target and run.series.location == location
        for s in samples
        if not s.warmup
    ]


async def test_the_windows_counted_in_sql_equal_the_pure_count(backend: Backend) -> None:
    rng = random.Random(5)
    engine = backend.engine()
    batches = []
    try:
        repository = Repository(engine)
        for i in range(90):
            for target, location in (("qwen3-8b", "lab"), ("qwen3-8b", "far"), ("gpt-4o-mini", "lab")):
                batch = run_at(5 * i, slow=0.3 if 40 <= i < 70 else 0.01, target=target, location=location, rng=rng)
                await repository.save_runs(batch)
                batches.append(batch)
        probes = probes_of(batches, "qwen3-8b", "lab")
        async with engine.connect() as connection:
            for minute in (0, 203, 250, 347.5, 445):
                now = T0 + timedelta(minutes=minute)
                counted = await count_windows(connection, target="qwen3-8b", location="lab", now=now, policy=POLICY)
                assert counted == window_counts(probes, POLICY.windows(), now), minute
                assert counted[3600.0].total > 0 or minute == 0
    finally:
        await engine.dispose()


async def test_disturbed_probes_are_not_counted_against_the_budget(backend: Backend) -> None:
    engine = backend.engine()
    try:
        repository = Repository(engine)
        rng = random.Random(9)
        quiet = run_at(4, slow=0.0, target="qwen3-8b", location="lab", rng=rng)
        overloaded = run_at(5, slow=1.0, target="qwen3-8b", location="lab", rng=rng)
        samples = [dataclasses.replace(s, disturbed=True, self_delay_ms=300.0) for _r, m in overloaded for s in m]
        await repository.save_runs(quiet)
        await repository.save_runs(runs_from_samples(samples, job="every-5m", location="lab", provider_of=PROVIDERS))
        async with engine.connect() as connection:
            now = T0 + timedelta(minutes=6)
            counted = await count_windows(connection, target="qwen3-8b", location="lab", now=now, policy=POLICY)
    finally:
        await engine.dispose()
    # Only the quiet run's probes: the overloaded run's (every one slow, every one disturbed) are no evidence.
    assert {(c.total, c.bad) for c in counted.values()} == {(3 * len(quiet), 0)}


# 100 runs stored and detected one by one: about 10 s alone, past the suite's 60 s on a loaded machine.
@pytest.mark.timeout(240)
async def test_a_burning_target_opens_one_page_per_location_raises_and_resolves(backend: Backend) -> None:
    config = Config.model_validate(
        {
            "providers": {"vllm": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {
                "qwen3-8b": {"provider": "vllm", "model": "Qwen/Qwen3-8B", "slo": {"ttft_ms": 300}},
                "gpt-4o-mini": {"provider": "vllm", "model": "gpt-4o-mini"},  # no objective: never evaluated
            },
            "detection": {
                "slo_burn": {
                    "min_probes": 10,
                    "keep_firing_minutes": 0,
                    "windows": [
                        {"severity": "page", "burn_rate": 14.4, "long_window_minutes": 60, "short_window_minutes": 5},
                        {"severity": "ticket", "burn_rate": 1, "long_window_minutes": 360, "short_window_minutes": 30},
                    ],
                }
            },
        }
    )
    rng = random.Random(11)
    engine = backend.engine()
    outbox = RecordingOutbox()
    try:
        repository = Repository(engine)
        # The service only calls notify(), which this records (hence the cast).
        service = DetectionService(engine, repository, config, outbox=cast(Outbox, outbox), metrics=None)
        for i in range(100):
            # 2 hours fine, 1 hour 6% slow (a ticket), 1 hour 60% slow (a page), then fine again.
            slow = 0.0 if i < 24 else 0.06 if i < 36 else 0.6 if i < 48 else 0.0
            # No failures: at 1 in 40 the target would burn 2.5x its 1% budget and rightly keep a ticket open.
            batch = run_at(5 * i, slow=slow, rng=rng, fail=0) + run_at(5 * i, slow=0.0, target="gpt-4o-mini", rng=rng)
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
        async with engine.connect() as connection:
            query = select(
                IncidentRow.id,
                IncidentRow.severity,
                IncidentRow.resolved_at,
                IncidentRow.peak_ratio,
                IncidentRow.baseline_ms,
                SeriesRow.prompt,
                SeriesRow.target,
            ).join(SeriesRow, SeriesRow.id == IncidentRow.series_id)
            rows = (await connection.execute(query.where(IncidentRow.kind == "slo_burn"))).all()
    finally:
        await engine.dispose()
    assert len(rows) == 1, rows
    row = rows[0]
    assert (row.target, row.prompt, row.severity) == ("qwen3-8b", "*", "page")
    assert row.resolved_at is not None and row.peak_ratio >= 14.4
    assert row.baseline_ms == 300
    states = [(n.state, n.severity) for n in outbox.sent if n.kind == "slo_burn"]
    assert states == [("firing", "ticket"), ("firing", "page"), ("resolved", "page")], states
    assert {n.incident_id for n in outbox.sent if n.kind == "slo_burn"} == {row.id}
    opening = next(n for n in outbox.sent if n.kind == "slo_burn").summary
    assert opening.startswith("qwen3-8b: ") and "of probes over 300 ms or failed in the last 6 h (SLO 99%)" in opening


async def test_two_evaluations_at_once_open_one_incident_and_notify_once(backend: Backend) -> None:
    config = Config.model_validate(
        {
            "providers": {"vllm": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"qwen3-8b": {"provider": "vllm", "model": "Qwen/Qwen3-8B", "slo": {"ttft_ms": 300}}},
        }
    )
    rng = random.Random(3)
    engines = [backend.engine(), backend.engine()]
    outboxes = [RecordingOutbox(), RecordingOutbox()]
    try:
        repository = Repository(engines[0])
        batches = [run_at(5 * i, slow=0.0 if i < 6 else 1.0, rng=rng) for i in range(14)]
        for batch in batches:
            await repository.save_runs(batch)
        services = [BurnService(e, config, outbox=o) for e, o in zip(engines, outboxes, strict=True)]
        await asyncio.gather(*(s.after_store("every-5m", batches[-1]) for s in services))
        async with engines[0].connect() as connection:
            opened = (await connection.execute(select(IncidentRow.id).where(IncidentRow.kind == "slo_burn"))).all()
    finally:
        for engine in engines:
            await engine.dispose()
    assert len(opened) == 1
    assert sum(len(o.sent) for o in outboxes) == 1, [o.sent for o in outboxes]


async def test_an_incident_stays_open_for_keep_firing_and_keeps_what_it_measured(backend: Backend) -> None:
    config = Config.model_validate(
        {
            "providers": {"vllm": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"qwen3-8b": {"provider": "vllm", "model": "Qwen/Qwen3-8B", "slo": {"ttft_ms": 300}}},
            "detection": {
                "slo_burn": {
                    "keep_firing_minutes": 15,
                    "windows": [
                        {"severity": "page", "burn_rate": 14.4, "long_window_minutes": 60, "short_window_minutes": 5}
                    ],
                }
            },
        }
    )
    rng = random.Random(8)
    engine = backend.engine()
    outbox = RecordingOutbox()
    summaries = []
    try:
        repository = Repository(engine)
        service = BurnService(engine, config, outbox=outbox)
        for i in range(40):
            slow = 1.0 if 24 <= i < 30 else 0.0  # the last slow run starts at minute 145
            batch = run_at(5 * i, slow=slow, rng=rng, fail=0)
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
            async with engine.connect() as connection:
                summaries.append(
                    (await connection.execute(select(IncidentRow.details, IncidentRow.resolved_at))).first()
                )
    finally:
        await engine.dispose()
    states = [(n.state, n.since.minute, (n.resolved_at or n.since) - T0) for n in outbox.sent]
    assert [s[0] for s in states] == ["firing", "resolved"], states
    # The last slow run starts at minute 145; the 5-minute window is clean from minute 150 (or 155, when
    # the next run started a fraction of a second earlier in its minute): resolved 15 minutes after.
    resolved_at = outbox.sent[1].resolved_at
    assert resolved_at is not None  # a resolved notification says when
    assert timedelta(minutes=160) <= resolved_at - T0 < timedelta(minutes=171)
    kept = summaries[31]  # minute 155: quiet, still open, and still saying what it measured when it last fired
    assert kept is not None and kept.resolved_at is None
    assert kept.details["summary"].endswith("burning 50x (page at 14.4x over 1 h and 5 min; 100% in the last 5 min)")


async def test_a_burn_incident_resolved_by_hand_reopens_only_once_fresh_probes_still_burn(backend: Backend) -> None:
    """`incidents resolve` of an slo_burn incident: the probes that made it cannot reopen it at the next
    evaluation; if the target still burns once the short window holds only newer probes, a new one opens."""
    from monitor.triage.service import Triage

    config = Config.model_validate(
        {
            "providers": {"vllm": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"qwen3-8b": {"provider": "vllm", "model": "Qwen/Qwen3-8B", "slo": {"ttft_ms": 300}}},
            "detection": {
                "slo_burn": {
                    "windows": [
                        {"severity": "page", "burn_rate": 14.4, "long_window_minutes": 60, "short_window_minutes": 5}
                    ],
                }
            },
        }
    )
    rng = random.Random(9)
    engine = backend.engine()
    outbox = RecordingOutbox()
    opened_after: list[int] = []
    try:
        repository = Repository(engine)
        service = BurnService(engine, config, outbox=outbox)
        for i in range(40):
            batch = run_at(5 * i, slow=1.0 if i >= 24 else 0.0, rng=rng, fail=0)
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
            if i == 26:  # paged at run 24; a person closes it while it still burns
                async with engine.connect() as connection:
                    row = (
                        await connection.execute(select(IncidentRow.id).where(IncidentRow.resolved_at.is_(None)))
                    ).one()
                moment = T0 + timedelta(minutes=5 * i, seconds=30)

                def clock(moment: datetime = moment) -> datetime:
                    return moment

                await Triage(engine, config, clock=clock).resolve(str(row.id), by="alice", note=None)
            async with engine.connect() as connection:
                count = await connection.scalar(
                    select(func.count()).select_from(IncidentRow).where(IncidentRow.kind == "slo_burn")
                )
            opened_after.append(int(count or 0))
    finally:
        await engine.dispose()
    firing = [n for n in outbox.sent if n.state == "firing"]
    assert len(firing) == 2, [(n.state, n.since) for n in outbox.sent]
    assert opened_after[26:29] == [1, 1, 2], opened_after  # not at run 27 (its 5 min hold older probes)


async def test_a_batch_whose_windows_reach_the_cold_tier_is_not_evaluated_at_its_own_time(backend: Backend) -> None:
    """The windows are counted in SQL over rows; the cold tier leaves the longest window and a day as rows. A batch
    evaluated at its own time days late (a spool drained after a long outage) would count its windows short, and
    with them its burn rates: it is not evaluated, and says so; a batch of now is."""
    config = Config.model_validate(
        {
            "providers": {"vllm": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"qwen3-8b": {"provider": "vllm", "model": "Qwen/Qwen3-8B", "slo": {"ttft_ms": 300}}},
            "detection": {
                "slo_burn": {
                    "min_probes": 10,
                    "windows": [
                        {"severity": "page", "burn_rate": 14.4, "long_window_minutes": 60, "short_window_minutes": 5},
                        {"severity": "ticket", "burn_rate": 1, "long_window_minutes": 360, "short_window_minutes": 30},
                    ],
                }
            },
        }
    )
    rng = random.Random(5)
    engine = backend.engine()
    try:
        repository = Repository(engine)
        batches = [run_at(30 * i, slow=0.6, rng=rng, fail=0) for i in range(4 * 48)]  # 4 days, every 30 minutes
        for batch in batches:
            await repository.save_runs(batch)
        end = T0 + timedelta(days=4)
        await repository.rollup(end)
        assert (await repository.compact(end, cold_after_days=2)).series_days == 2 * 2  # days 0 and 1, two prompts
        service = BurnService(engine, config, outbox=None)
        policy = service.policy("qwen3-8b")
        assert policy is not None
        series = batches[0][0][0].series
        with capture_logs() as logs:
            late = await service.evaluate("every-5m", series, T0 + timedelta(days=1, hours=3), policy)
            live = await service.evaluate("every-5m", series, end - timedelta(minutes=30), policy)
    finally:
        await engine.dispose()
    assert late is None
    assert live is not None and live.severity == "ticket"  # (too few probes in 5 minutes to page)
    assert [line["event"] for line in logs if line["event"].startswith("slo_burn")] == ["slo_burn_skipped"]
