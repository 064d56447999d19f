"""Synthetic TTFT series for the detector: a daily cycle with noise, spikes and steps (`series`), and the
seeded AR(1) series the golden file of tests/unit/test_detect_default_unchanged.py was recorded on (`make_series`)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from monitor.detect.detector import RunPoint

T0 = datetime(2025, 1, 6, tzinfo=UTC)  # a Monday, midnight
GOLDEN_T0 = datetime(2025, 3, 3, tzinfo=UTC)  # where make_series starts: the golden file holds its times
EVERY = timedelta(minutes=5)


RUNS_PER_DAY = 288


@dataclasses.dataclass(frozen=True)
class Step:
    start_day: float
    hours: float
    factor: float

    def covers(self, day: float) -> bool:
        return self.start_day <= day < self.start_day + self.hours / 24


def series(
    days: float,
    *,
    sigma: float,
    seed: int,
    base_ms: float = 400.0,
    probes: int = 5,
    spikes: float = 0.0,
    steps: Sequence[Step] = (),
) -> list[RunPoint]:
    """Runs every 5 minutes: the median of `probes` lognormal probes on a +-20% daily cycle, with
    `spikes` of the probes 3-10x slower, multiplied by any step covering the run."""
    rng = random.Random(seed)
    points = []
    for i in range(round(days * RUNS_PER_DAY)):
        day = i / RUNS_PER_DAY
        level = base_ms * (1 + 0.2 * math.sin(2 * math.pi * day))
        for step in steps:
            if step.covers(day):
                level *= step.factor
        values = [
            level * math.exp(rng.gauss(0, sigma)) * (rng.uniform(3, 10) if rng.random() < spikes else 1.0)
            for _ in range(probes)
        ]
        points.append(RunPoint(T0 + i * EVERY, statistics.median(values), ok=probes, errors=0))
    return points


def at_day(day: float) -> datetime:
    return T0 + timedelta(days=day)


def make_series(seed: int, *, days: float, probes: int, phi: float) -> list[RunPoint]:
    """A daily cycle, lognormal probes with half their variance an AR(1) load (so the long-run factor
    matters), 2% spikes, failed runs, a 3-hour +70% step (a page), a 2-day +20% step (a ticket, the
    CUSUM's), an hour of failures (availability) and a served-model change."""
    rng = random.Random(seed)
    sigma = 0.3
    load = 0.0
    innovation = math.sqrt(0.5 * (1 - phi * phi)) * sigma
    points = []
    for i in range(round(days * RUNS_PER_DAY)):
        day = i / RUNS_PER_DAY
        load = phi * load + rng.gauss(0, innovation)
        level = 400.0 * (1 + 0.2 * math.sin(2 * math.pi * day)) * math.exp(load)
        if 9.0 <= day < 9.125:
            level *= 1.7
        if 12.0 <= day < 14.0:
            level *= 1.2
        at = GOLDEN_T0 + i * EVERY
        model = "m-1" if day < 15.5 else "m-2"
        if 16.0 <= day < 16.04 or rng.random() < 0.005:
            points.append(RunPoint(at, None, error="timeout", served_model=model, ok=0, errors=probes))
            continue
        values = sorted(
            level * math.exp(rng.gauss(0, sigma * math.sqrt(0.5))) * (rng.uniform(3, 10) if rng.random() < 0.02 else 1)
            for _ in range(probes)
        )
        points.append(RunPoint(at, values[len(values) // 2], served_model=model, ok=probes, errors=0))
    return points
