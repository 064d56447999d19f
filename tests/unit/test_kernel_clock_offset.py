"""The offset between the wall clock and the monotonic one, watched for steps (monitor/kernel_clock.py): the
kernel stamps packets on the wall clock, and a step of it between a stamp and its read would move the sample by
the step. Pure: the clocks are a test's own."""

from __future__ import annotations

import pytest

from monitor import kernel_clock


class SteppableClocks:
    """A wall clock and a monotonic clock a test moves by hand; each reading advances both by `tick`."""

    def __init__(self, wall: int = 1_700_000_000_000_000_000, mono: int = 5_000_000_000, tick: int = 1_000) -> None:
        self.wall_ns, self.mono_ns, self.tick = wall, mono, tick
        self.stall_next_wall_read = 0  # a preemption between the readings of the two clocks

    def wall(self) -> int:
        self.run(self.tick + self.stall_next_wall_read)
        self.stall_next_wall_read = 0
        return self.wall_ns

    def mono(self) -> int:
        self.run(self.tick)
        return self.mono_ns

    def run(self, ns: int) -> None:
        self.wall_ns += ns
        self.mono_ns += ns


def read_later(
    clocks: SteppableClocks, offset: kernel_clock.WallClockOffset, *, after_ns: int
) -> tuple[int, int | None]:
    """A packet arrives now and is read `after_ns` later: its arrival on the monotonic clock, and what the
    offset makes of its wall-clock stamp."""
    arrived_mono, arrived_wall = clocks.mono_ns, clocks.wall_ns
    clocks.run(after_ns)
    return arrived_mono, offset.to_monotonic(arrived_wall, offset.observe())


def test_a_stamp_moves_to_the_monotonic_clock_by_the_offset_between_the_clocks() -> None:
    clocks = SteppableClocks()
    offset = kernel_clock.WallClockOffset(wall=clocks.wall, mono=clocks.mono)
    offset.observe()
    clocks.run(50_000_000)
    arrived, converted = read_later(clocks, offset, after_ns=30_000_000)  # the loop reads 30 ms later
    assert converted == arrived
    assert offset.steps == 0


@pytest.mark.parametrize("step_ns", [-3_000_000_000, -1_000_000, 1_000_000, 3_000_000_000])
def test_a_stamp_from_before_a_wall_clock_step_is_not_converted(step_ns: int) -> None:
    # The stamp is taken, then the wall clock is stepped (NTP, a resumed VM), then the loop reads:
    # converted by the new offset the stamp would move by the step (1 ms, 3 s), unseen.
    clocks = SteppableClocks()
    offset = kernel_clock.WallClockOffset(wall=clocks.wall, mono=clocks.mono)
    offset.observe()
    clocks.run(50_000_000)
    arrived_wall = clocks.wall_ns
    clocks.wall_ns += step_ns
    clocks.run(1_000_000)
    now = offset.observe()
    assert offset.steps == 1
    assert offset.to_monotonic(arrived_wall, now) is None
    # A stamp taken after the step (and after the reading that saw it) is converted again.
    clocks.run(20_000_000)
    arrived, converted = read_later(clocks, offset, after_ns=5_000_000)
    assert converted == arrived


def test_a_reading_stretched_by_a_preemption_is_not_a_step_and_does_not_replace_a_better_one() -> None:
    clocks = SteppableClocks()
    offset = kernel_clock.WallClockOffset(wall=clocks.wall, mono=clocks.mono)
    offset.observe()
    kept = offset.offset_ns
    clocks.stall_next_wall_read = 5_000_000  # 5 ms between the monotonic and the wall reading
    offset.observe()
    assert offset.steps == 0 and offset.offset_ns == kept
    clocks.run(10_000_000)
    arrived, converted = read_later(clocks, offset, after_ns=10_000_000)
    assert converted == arrived


def test_no_stamp_is_converted_before_the_first_reading_or_from_the_future() -> None:
    clocks = SteppableClocks()
    offset = kernel_clock.WallClockOffset(wall=clocks.wall, mono=clocks.mono)
    assert offset.to_monotonic(clocks.wall_ns, clocks.mono_ns) is None  # nothing read yet
    before_wall = clocks.wall_ns - 1_000_000
    now = offset.observe()
    assert offset.to_monotonic(before_wall, now) is None  # older than the first reading
    assert offset.to_monotonic(clocks.wall_ns + 1_000_000_000, now) is None  # a second in the future
