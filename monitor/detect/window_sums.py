"""Running sums of a series' residuals, so the window rules' long-run factor can be decided without
`stats.clipped_profile`'s five passes over a day of them (issue 26: a third of a year's replay). Pure.

`clipped_profile` clips a day of residuals to centre +- bound sigmas and compares the variance of their
block sums with that of the values. Only a few values in a day lie beyond the bounds, so its sums are
the day's plain sums (differences of prefix sums kept here as values come in) plus a correction for
each clipped value, found by its position. The result rounds differently from clipped_profile's, so it
only decides when it is far from the threshold (`TOLERANCE`, a million times the rounding error) and
the caller computes the plain reading otherwise: every verdict is the one the plain reading gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, islice, repeat
from operator import mul, sub

# Relative distance from the threshold (in factor squared) under which the caller takes the plain reading.
TOLERANCE = 1e-6
# Sums that cancel to less than this share of their terms are left to the plain reading.
CANCELLATION = 1e-3
# More clipped values than this: the corrections (pairs of them) would cost more than the plain reading.
MOST_CLIPPED = 24


class WindowSums:
    """Prefix sums of values `start`, `start` + 1, ... (the core's residual indices; nan counted, not
    summed), of their squares, and of the sums of every `block` consecutive values and their squares;
    where each value stands, for finding the clipped ones (a value seen twice is never looked up)."""

    __slots__ = ("_nans", "_repeated", "_rr", "_rs", "_squares", "_sum", "_where", "block", "start")

    def __init__(self, block: int, start: int) -> None:
        self.block = block
        self.start = start
        self._sum = [0.0]
        self._squares = [0.0]
        self._nans = [0]
        self._rs = [0.0]  # _rs[i]: the sum of the block sums starting before value i
        self._rr = [0.0]
        self._where: dict[float, int] = {}
        self._repeated: set[float] = set()

    @property
    def end(self) -> int:
        """The index after the last value added."""
        return self.start + len(self._sum) - 1

    def extend(self, values: list[float]) -> None:
        """Add the next values. They come a few at a time (between the verdicts that need them): in C
        where it can, one by one when a nan or a value seen before is among them."""
        sums, squares, nans, where = self._sum, self._squares, self._nans, self._where
        index = len(sums) - 1
        total = sum(values)
        if total == total and where.keys().isdisjoint(values) and len(set(values)) == len(values):
            sums.extend(islice(accumulate(values, initial=sums[-1]), 1, None))
            squares.extend(islice(accumulate(map(mul, values, values), initial=squares[-1]), 1, None))
            nans.extend(repeat(nans[-1], len(values)))
            where.update(zip(values, range(index, index + len(values)), strict=True))
        else:
            for at, value in enumerate(values, index):
                if value == value:
                    sums.append(sums[-1] + value)
                    squares.append(squares[-1] + value * value)
                    nans.append(nans[-1])
                    if value in where:
                        self._repeated.add(value)
                    where[value] = at
                else:
                    sums.append(sums[-1])
                    squares.append(squares[-1])
                    nans.append(nans[-1] + 1)
        first = max(0, index + 1 - self.block)  # the first block ending at a new value starts here
        blocks = list(map(sub, sums[first + self.block :], sums[first:]))
        self._rs.extend(islice(accumulate(blocks, initial=self._rs[-1]), 1, None))
        self._rr.extend(islice(accumulate(map(mul, blocks, blocks), initial=self._rr[-1]), 1, None))

    def factor_squared(
        self, low: int, end: int, *, low_clip: float, high_clip: float, below: Sequence[float], above: Sequence[float]
    ) -> float | None:
        """clipped_profile's long-run factor squared (before its floor of 1) for values low..end-1, clipped
        to [low_clip, high_clip]; `below` and `above`: the values at or beyond each bound. None when these
        sums cannot tell (a nan in the range, too few values, a repeated clipped value, cancellation)."""
        a, b = low - self.start, end - self.start
        block = self.block
        count = b - a
        if a < 0 or b > len(self._sum) - 1 or count < 2 * block or self._nans[b] != self._nans[a]:
            return None
        if len(below) + len(above) > MOST_CLIPPED:
            return None
        where, repeated = self._where, self._repeated
        clipped: list[tuple[int, float]] = []  # (position, clipped value - value)
        total, squares = self._sum[b] - self._sum[a], self._squares[b] - self._squares[a]
        for values, bound in ((below, low_clip), (above, high_clip)):
            for value in values:
                if value in repeated:
                    return None
                at = where.get(value)
                if at is None or not a <= at < b:
                    return None
                clipped.append((at, bound - value))
                total += bound - value
                squares += bound * bound - value * value
        mean = total / count
        spread = squares - count * mean * mean
        if not spread > CANCELLATION * squares:
            return None
        variance = spread / (count - 1)
        last = b - block  # the last block's first value
        blocks = last - a + 1
        rs = self._rs
        block_total, block_squares = rs[last + 1] - rs[a], self._rr[last + 1] - self._rr[a]
        clipped.sort()
        for number, (at, change) in enumerate(clipped):
            first = at - block + 1 if at - block + 1 > a else a  # the blocks holding it: first..final
            final = at if at < last else last
            block_total += change * (final - first + 1)
            block_squares += (2.0 * (rs[final + 1] - rs[first]) + change * (final - first + 1)) * change
            # Blocks it shares with the clipped values after it (within a block of it), counted twice.
            for other, other_change in clipped[number + 1 :]:
                if other - block + 1 > final:
                    break
                shared_from = other - block + 1 if other - block + 1 > first else first
                block_squares += 2.0 * change * other_change * (final - shared_from + 1)
        block_mean = block_total / blocks
        block_spread = block_squares - blocks * block_mean * block_mean
        if not block_spread > CANCELLATION * block_squares:
            return None
        return block_spread / (blocks - 1) / block / variance


def decide(factor_squared: float | None, limit: float) -> bool | None:
    """Whether the factor is at most `limit` (z / z_threshold, at least 1): True or False when
    `factor_squared` is clearly on one side, None when the plain reading must decide."""
    if factor_squared is None:
        return None
    square = limit * limit
    if factor_squared < square * (1.0 - TOLERANCE):
        return True
    if factor_squared > square * (1.0 + TOLERANCE):
        return False
    return None
