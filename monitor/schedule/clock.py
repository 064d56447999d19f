"""Steps of the wall clock, seen against the monotonic clock.

The scheduler reads the wall clock (cron names wall times); the event loop's timers run on the
monotonic clock. When the wall clock is stepped (NTP correcting a bad start, an operator's `date`,
a VM resumed after suspend), the two disagree: back by two minutes, the next tick lies two minutes
ahead and nothing probes until then; forward, a stale last-run time looks fresh. A step is the
difference between how far each clock moved since the last reading; slewing (at most 0.5 ms per
second) never comes near the threshold.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CLOCK_STEP_THRESHOLD_S = 2.0
Reading = tuple[float, float]  # (time.time(), time.monotonic())


def read_clocks() -> Reading:
    return time.time(), time.monotonic()


def wall_clock_step(before: Reading, after: Reading, threshold_s: float = CLOCK_STEP_THRESHOLD_S) -> float | None:
    """How far the wall clock jumped between two readings (negative: back), or None within the threshold."""
    step = (after[0] - before[0]) - (after[1] - before[1])
    return step if abs(step) >= threshold_s else None


class ClockWatch:
    """`check()` compares each reading with the last one; the clocks are passed in (`read`) for tests."""

    def __init__(self, read: Callable[[], Reading] = read_clocks, threshold_s: float = CLOCK_STEP_THRESHOLD_S) -> None:
        self._read = read
        self._threshold_s = threshold_s
        self._last = read()

    @property
    def wall(self) -> float:
        """The wall time of the last check."""
        return self._last[0]

    def check(self) -> tuple[float, float, float] | None:
        """(the step in seconds, the wall time now, the new wall time of the last check) when the wall
        clock stepped since the last check. The step happened somewhere between the two checks, so the
        new clock's ticks since the last check's moment fell due unseen."""
        reading = self._read()
        step = wall_clock_step(self._last, reading, self._threshold_s)
        since = reading[0] - (reading[1] - self._last[1])
        self._last = reading
        return None if step is None else (step, reading[0], since)
