"""A batch larger than its detection budget, on both databases (issue 26): one job of 4,000 series,
all slower, opened 657 incidents and notified nobody, because the budget's timeout cut the batch
before its groups were notified, and the log said all 4,000 runs were skipped when 40% were evaluated.

Now the detector stops at its budget itself: the runs it evaluated open their incidents and their
group is paged, the rest are counted as skipped (log and metric), truthfully; and the next batch starts
with the series evaluated least recently, so every series gets its turn (before, the same first runs of
every batch were evaluated and the last never were)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from monitor.alert.outbox import Outbox
from monitor.detect.service import DetectionService
from monitor.metrics.definitions import Metrics
from monitor.schedule.background import AFTERCARE_TIMEOUT_S, aftercare_deadline_s, detection_budget_s
from monitor.store.models import DetectorStateRow, IncidentRow
from monitor.store.records import RunRecord, runs_from_samples
from monitor.store.repository import Repository
from tests.support.detection import config, notifications, rows
from tests.support.store_fixtures import T0, Backend, make_samples

pytest_plugins = ("tests.support.store_fixtures",)
pytestmark = pytest.mark.timeout(240)

TARGETS = tuple(f"m{i:02d}" for i in range(24))
PROVIDER_OF = dict.fromkeys(TARGETS, "gateway-a")
HEALTHY = 20  # as tests/integration/test_detect_service.py: past min_history_runs (6) and the trailing window (12)
SLOW_TICKS = 9  # each series is evaluated 3-4 times in these (10 of 24 a batch): enough to confirm a page


def tick(index: int, factor: float = 1.0) -> list[tuple[RunRecord, list[Any]]]:
    at = T0 + timedelta(minutes=5 * index)
    samples = [
        dataclasses.replace(s, ttft_ms=s.ttft_ms * factor) if s.ttft_ms is not None else s
        for target in TARGETS
        for s in make_samples(target, "short", at=at)
    ]
    return runs_from_samples(samples, job="every-5m", location="lab", provider_of=PROVIDER_OF)


def ticking(step: float) -> Iterator[float]:
    """A clock that moves `step` s at every reading: the budget is spent after a known number of runs."""
    now = 0.0
    while True:
        yield now
        now += step


async def test_a_batch_past_its_budget_pages_what_it_evaluated_and_counts_the_rest(backend: Backend) -> None:
    engine = backend.engine()
    setup = config()
    metrics = Metrics(CollectorRegistry())
    clock = ticking(1.0)
    service = DetectionService(
        engine,
        Repository(engine),
        setup,
        outbox=Outbox(engine, setup.alerts),
        metrics=metrics,
        clock=lambda: next(clock),
    )
    repository = Repository(engine)
    evaluated_per_batch = 10
    try:
        for index in range(HEALTHY):
            batch = tick(index)
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)  # no budget: all evaluated
        with capture_logs() as logs:
            for index in range(HEALTHY, HEALTHY + SLOW_TICKS):
                batch = tick(index, factor=3.0)
                await repository.save_runs(batch)
                # One clock reading sets the deadline, one more before each run after the first.
                await service.after_store("every-5m", batch, budget_s=evaluated_per_batch - 0.5)
        incidents = await rows(engine, IncidentRow)
        states = await rows(engine, DetectorStateRow)
        sent = await notifications(engine)
    finally:
        await engine.dispose()
    skipped = [e for e in logs if e["event"] == "detection_skipped"]
    left = len(TARGETS) - evaluated_per_batch
    assert [(e["runs"], e["evaluated"]) for e in skipped] == [(left, evaluated_per_batch)] * SLOW_TICKS, skipped
    assert metrics.detection_skipped_runs.labels("every-5m")._value.get() == left * SLOW_TICKS
    # Each batch began with the series the one before left, longest waiting first: the 90 evaluations of
    # the slow stretch went round all 24 series, 3 or 4 each (before, the batch's first ten every time
    # and the other fourteen never).
    slow_evaluations = sorted(state.version - HEALTHY for state in states)
    assert len(slow_evaluations) == len(TARGETS) and sum(slow_evaluations) == evaluated_per_batch * SLOW_TICKS
    assert set(slow_evaluations) == {3, 4}, slow_evaluations
    # Every series opened, each evaluated in turn ...
    opened = {i.series_id for i in incidents}
    assert len(opened) == len(TARGETS), incidents
    # ... and their outage was paged, as one group: the notification went out although the batch's
    # budget was spent (before, a batch cut by its budget notified no one).
    firing = [n for n in sent if n.state == "firing"]
    assert firing, "no notification for a batch past its budget"
    assert len({n.group_id for n in firing}) == 1 and firing[0].group_id is not None
    assert len(firing[-1].members) == len(opened)


def test_the_budget_grows_with_the_batch_and_keeps_a_margin_to_notify() -> None:
    # A small batch keeps the daemon's bound; 4,000 runs (6 ms each on a loaded machine) get 100 s.
    assert detection_budget_s(12, AFTERCARE_TIMEOUT_S) == AFTERCARE_TIMEOUT_S
    assert detection_budget_s(4000, AFTERCARE_TIMEOUT_S) == pytest.approx(100.0)
    assert detection_budget_s(4000, AFTERCARE_TIMEOUT_S) > 4000 * 0.006
    # The hard stop leaves time to notify after the budget, never more than the budget again.
    assert aftercare_deadline_s(100.0) == pytest.approx(105.0)
    assert aftercare_deadline_s(0.5) == pytest.approx(1.0)
