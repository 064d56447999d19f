"""Handing a finished run to the background store: its series made into runs a step at a time, so that a
job of hundreds of series does not hold the probes' loop (issue 26, event-loop lag)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import uuid
from types import SimpleNamespace
from typing import Any, cast

from monitor.schedule import pipeline
from monitor.schedule.pipeline import HAND_OVER_STEP, JobOutcome
from monitor.store.records import StorableBatch, runs_from_samples, storable_batch
from tests.support.store_fixtures import PROVIDERS, T0, make_samples

TARGETS = tuple(PROVIDERS)


def outcome_of(series: int) -> JobOutcome:
    names = itertools.islice(((t, f"p{i}") for i in range(series) for t in TARGETS), series)
    samples = [s for target, prompt in names for s in make_samples(target, prompt, rounds=2, warmup=0)]
    return JobOutcome(job="every-5m", intended_at=T0, started_at=T0, samples=samples)


def without_ids(batch: Any) -> list[Any]:
    return [(dataclasses.replace(run, run_id=uuid.UUID(int=0)), samples) for run, samples in batch]


async def test_a_large_run_is_made_into_runs_with_the_loop_let_through_between_steps() -> None:
    outcome = outcome_of(3 * HAND_OVER_STEP + 7)
    ctx = cast(Any, SimpleNamespace(config=SimpleNamespace(location="test-lab")))
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns
    runs = await pipeline._runs_in_steps(ctx, outcome, dict(PROVIDERS))
    during = turns - before
    other.cancel()
    assert during >= 4, "the loop ran nothing else while the runs were made (its end, then each step)"
    wanted = runs_from_samples(outcome.samples, job="every-5m", location="test-lab", provider_of=dict(PROVIDERS))
    assert len(runs) == 3 * HAND_OVER_STEP + 7
    assert without_ids(runs) == without_ids(wanted)


async def test_the_batch_handed_over_is_marked_storable_so_the_writer_does_not_check_it_again() -> None:
    outcome = outcome_of(HAND_OVER_STEP + 3)
    ctx = cast(Any, SimpleNamespace(config=SimpleNamespace(location="test-lab")))
    runs = await pipeline._runs_in_steps(ctx, outcome, dict(PROVIDERS))
    handed = pipeline._batch(ctx, outcome, dict(PROVIDERS), runs)
    assert isinstance(handed, StorableBatch) and without_ids(handed) == without_ids(runs)
    outcome.canary = {TARGETS[0]: "c0ffee"}  # added after the runs were made: not what storable_batch checks
    with_canary = pipeline._batch(ctx, outcome, dict(PROVIDERS))
    assert isinstance(with_canary, StorableBatch)
    assert {run.canary for run, _ in with_canary} == {"c0ffee", None}
    assert storable_batch(with_canary) == with_canary
