"""The runs the detector reads for each series, kept between its evaluations.

Evaluating a run reads the series' runs of the last `Detector.history_since` (a week and a day with the
default seasonal baseline: about 2,400 runs at 5-minute runs). Read afresh for every run, that took 67 ms
of CPU per evaluation on SQLite and 54 ms on PostgreSQL (bench/detect_steady.py): a job of 1,000 series
every 5 minutes spent a fifth of a core on it, and a batch's detection budget (25 ms a run) covered about
a third of its runs. Kept here, an evaluation reads only the runs stored since the last one, after checking
that the runs already kept are still all the database holds over their span (`Span`: count, first and last
start of those read as rows); any difference (a spooled run replayed late, another replica's run, retention,
a day moved into the cold tier) reads the whole history again. Runs read from cold chunks are not counted: a
chunk changes only when rows move into it, which the rows' count tells. So what the detector is given is what
reading afresh would give, run for run.

It keeps the seasonal residuals evaluations computed as well (`state.HistoryColumns`): a residual depends
only on the runs of the days before its run, so one computed from a history holding all of those is the
same number at every later evaluation, and each takes those its own reading would compute whole, instead of
a day of them computed again (about 300 seasonal slots a run).

Kept in columns of machine numbers (41 bytes a run: the start in microseconds, the median TTFT, the
residual, the request counts, an index into the series' few distinct labels, and whether it came from a cold
chunk), within a memory budget
(`detection.history_memory_mb`): a series that does not fit is read afresh each time, as before.
"""

from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import add
from typing import Generic, TypeVar

from monitor.detect.state import HistoryColumns, RunPoint, counts_as_evidence

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A run as the store reads it for the detector: (started_at, ttft_p50_ms, error class, ok, errors, rounds,
# canary, server_build).
HistoryRow = tuple[datetime, float | None, str | None, int, int, int, str | None, str | None]
# A series' entry costs this much besides its columns (the object, its arrays' headers), and each of its
# distinct labels about this much (three strings, a tuple, an index entry).
ENTRY_OVERHEAD_BYTES = 600
LABEL_BYTES = 300
# How long a series not evaluated stays kept once the budget is full (a removed target, a finished job).
IDLE_S = 3600.0

K = TypeVar("K")


def micros(at: datetime) -> int:
    """Microseconds since the epoch: exact, unlike a float timestamp."""
    delta = at - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True, slots=True)
class Span:
    """What the database holds of a series over a range of starts: how many runs, the first and last start."""

    count: int
    first: datetime | None
    last: datetime | None


class SeriesHistory:
    """One series' runs in start order, complete from `complete_from` (microseconds) to the last one."""

    __slots__ = (
        "_at",
        "_cold",
        "_errors",
        "_label_index",
        "_label_of",
        "_labels",
        "_ok",
        "_residual",
        "_residual_epoch",
        "_rounds",
        "_ttft",
        "complete_from",
        "generation",
    )

    def __init__(self, complete_from: datetime) -> None:
        self.complete_from = micros(complete_from)
        self._at = array("q")
        self._ttft = array("d")  # nan: every request failed
        self._ok = array("i")
        self._errors = array("i")
        self._rounds = array("i")
        # (error, canary, server_build) of each run as one index into the series' distinct triples: a
        # series has a handful (a model change, an error class), so a run costs four bytes for all three;
        # a canary whose answer differs every run has one a run (counted in `nbytes`, dropped with them).
        self._labels = array("I")
        # Each run's seasonal residual once an evaluation computed it from every run it depends on (inf: not
        # yet), under the model epoch `_residual_epoch` (`state.HistoryColumns`).
        self._residual = array("d")
        self._residual_epoch: datetime | None = None
        self._cold = array("b")  # 1: the run was read from a cold chunk, not a row (`span` leaves it out)
        self.generation = 0  # moves whenever runs are added or dropped (the columns' indexes with it)
        self._label_index: dict[tuple[str | None, str | None, str | None], int] = {(None, None, None): 0}
        self._label_of: list[tuple[str | None, str | None, str | None]] = [(None, None, None)]

    def __len__(self) -> int:
        return len(self._at)

    @property
    def last(self) -> datetime | None:
        return EPOCH + timedelta(microseconds=self._at[-1]) if self._at else None

    def nbytes(self) -> int:
        columns = (self._at, self._ttft, self._ok, self._errors, self._rounds, self._labels, self._residual, self._cold)
        labels = LABEL_BYTES * len(self._label_of)
        return ENTRY_OVERHEAD_BYTES + labels + sum(column.itemsize * column.buffer_info()[1] for column in columns)

    def extend(self, rows: Iterable[HistoryRow], from_chunks: Sequence[bool] | None = None) -> None:
        """Append rows started after the last one kept (oldest first); `from_chunks`: which of them were read
        from a cold chunk (None: none)."""
        cold = iter(from_chunks) if from_chunks is not None else None
        for started, ttft, error, ok, errors, rounds, canary, build in rows:
            moment = micros(started)
            if self._at and moment < self._at[-1]:
                raise ValueError("history rows must come in start order, after the runs kept")
            labels = (error, canary, build)
            index = self._label_index.get(labels)
            if index is None:
                index = self._label_index[labels] = len(self._label_of)
                self._label_of.append(labels)
            self._at.append(moment)
            self._ttft.append(math.nan if ttft is None else ttft)
            self._ok.append(ok)
            self._errors.append(errors)
            self._rounds.append(rounds)
            self._labels.append(index)
            self._residual.append(math.inf)
            self._cold.append(1 if cold is not None and next(cold) else 0)
            self.generation += 1

    def _drop_unused_labels(self) -> None:
        """Forget the labels no kept run has any more, when they are most of them (a canary whose answer
        changes every run would otherwise keep one for every run ever seen)."""
        used = sorted(set(self._labels))
        if 0 not in used:
            used.insert(0, 0)  # (None, None, None) stays at 0
        if 2 * len(used) > len(self._label_of):
            return
        renumber = {old: new for new, old in enumerate(used)}
        self._label_of = [self._label_of[old] for old in used]
        self._label_index = {labels: index for index, labels in enumerate(self._label_of)}
        self._labels = array("I", [renumber[index] for index in self._labels])

    def span(self, start: datetime, end: datetime) -> Span:
        """The runs kept with starts in [start, end] that were read as rows, as `Span`: what the rows still
        hold of them when nothing changed."""
        low = bisect_left(self._at, micros(start))
        high = bisect_right(self._at, micros(end))
        cold = self._cold
        count = high - low - cold[low:high].count(1) if high > low else 0
        if count <= 0:
            return Span(0, None, None)
        # Runs from chunks are the oldest (days compact oldest first), bar a late row among them: short walks.
        while cold[low]:
            low += 1
        while cold[high - 1]:
            high -= 1
        first, last = self._at[low], self._at[high - 1]
        return Span(count, EPOCH + timedelta(microseconds=first), EPOCH + timedelta(microseconds=last))

    def chunks_still_hold(self, start: datetime, *, oldest_run: datetime | None, newest_run: datetime | None) -> bool:
        """Whether the cold chunks still hold what this history read of them from `start` on, and nothing after
        its last run: `oldest_run`, the first run of the series' oldest chunk, is not after the first run kept
        from a chunk (retention drops the oldest chunks first); `newest_run`, the last run of its newest chunks,
        is not after the last run kept (a run compacted before it was read, or a run stored late into a
        compacted day, would never be read as a row after it)."""
        if newest_run is not None and (not self._at or micros(newest_run) > self._at[-1]):
            return False
        low = bisect_left(self._at, micros(start))
        try:
            first_cold = self._cold.index(1, low)
        except ValueError:
            return True  # none from a chunk
        return oldest_run is not None and micros(oldest_run) <= self._at[first_cold]

    def forget_before(self, start: datetime) -> None:
        """Drop runs started before `start`: no evaluation reads them again."""
        moment = micros(start)
        drop = bisect_left(self._at, moment)
        if drop:
            columns = (self._at, self._ttft, self._ok, self._errors, self._rounds, self._labels, self._residual)
            for column in (*columns, self._cold):
                del column[:drop]
            self.generation += 1
            if len(self._label_of) > 16:
                self._drop_unused_labels()
        self.complete_from = max(self.complete_from, moment)

    def columns(self, start: datetime, end: datetime) -> HistoryColumns:
        """`points(start, end)` as the detector loads them (`state.HistoryColumns`), without a point each."""
        low = bisect_left(self._at, micros(start))
        high = bisect_left(self._at, micros(end))
        oks, errors, rounds = self._ok[low:high], self._errors[low:high], self._rounds[low:high]
        # Every run that measured a request is evidence (`counts_as_evidence`): decided in C for the usual case.
        evidence: Sequence[int]
        if all(map(add, oks, errors)):
            evidence = range(high - low)
        else:
            evidence = [i for i in range(high - low) if counts_as_evidence(rounds[i], oks[i], errors[i])]
        at, ttfts, labels, label_of = self._at, self._ttft, self._labels, self._label_of
        if len(evidence) == high - low:  # nearly always: a plain copy of each column
            known = self._residual[low:high].tolist()
            return HistoryColumns(
                [moment / 1e6 for moment in at[low:high]],
                ttfts[low:high].tolist(),
                oks.tolist(),
                errors.tolist(),
                [label_of[label][0] for label in labels[low:high]],
                residuals=[None if value == math.inf else value for value in known],
                residual_epoch=self._residual_epoch,
                complete_from=micros(start) / 1e6,
                origin=(self.generation, low),
            )
        return HistoryColumns(
            [at[low + i] / 1e6 for i in evidence],
            [ttfts[low + i] for i in evidence],
            [oks[i] for i in evidence],
            [errors[i] for i in evidence],
            [label_of[labels[low + i]][0] for i in evidence],
        )

    def keep_residuals(self, columns: HistoryColumns) -> None:
        """Keep the residuals an evaluation of `columns` (cut from this history by `columns`) computed; none
        when runs were added or dropped since the columns were cut, or they skipped runs."""
        if columns.origin is None or columns.origin[0] != self.generation or not columns.computed:
            return
        if columns.computed_epoch != self._residual_epoch:  # a new model epoch: the old residuals do not hold
            self._residual = array("d", [math.inf]) * len(self._residual)
            self._residual_epoch = columns.computed_epoch
        low = columns.origin[1]
        residual = self._residual
        for index, value in columns.computed:
            residual[low + index] = value

    def points(self, start: datetime, end: datetime) -> list[RunPoint]:
        """The detector's view of the runs started in [start, end) that are evidence (`state.is_evidence`:
        not every measured sample disturbed), oldest first, as `point_from_run` makes them."""
        low = bisect_left(self._at, micros(start))
        high = bisect_left(self._at, micros(end))
        at, ttfts, oks, errors, rounds, labels, label_of = (
            self._at,
            self._ttft,
            self._ok,
            self._errors,
            self._rounds,
            self._labels,
            self._label_of,
        )
        out = []
        for index in range(low, high):
            ok, failed = oks[index], errors[index]
            if not counts_as_evidence(rounds[index], ok, failed):
                continue
            ttft = ttfts[index]
            error, canary, build = label_of[labels[index]]
            out.append(
                RunPoint(
                    at=EPOCH + timedelta(microseconds=at[index]),
                    ttft_ms=None if ttft != ttft else ttft,
                    error=error,
                    ok=ok,
                    errors=failed,
                    canary=canary,
                    server_build=build,
                )
            )
        return out


class HistoryCache(Generic[K]):
    """Series' histories by key, within `budget_bytes`. A series that would not fit is not kept (it is read
    afresh), rather than pushing out another: series are evaluated in turn, so evicting the least recent
    would empty the cache a tick at a time. Series not evaluated for `IDLE_S` make room."""

    def __init__(self, budget_bytes: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_bytes = budget_bytes
        self._entries: dict[K, SeriesHistory] = {}
        self._sizes: dict[K, int] = {}
        self._used: dict[K, float] = {}
        self._total = 0
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> SeriesHistory | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._used[key] = self._clock()
        return entry

    def forget(self, key: K) -> None:
        self._entries.pop(key, None)
        self._used.pop(key, None)
        self._total -= self._sizes.pop(key, 0)

    def clear(self) -> None:
        self._entries.clear()
        self._sizes.clear()
        self._used.clear()
        self._total = 0

    def nbytes(self) -> int:
        """The kept histories' size, as of their last `keep` or `resized`."""
        return self._total

    def resized(self, key: K) -> None:
        """Count `key`'s history at its size now (after it was extended or trimmed); one that grew past the
        budget is no longer kept."""
        entry = self._entries.get(key)
        if entry is not None:
            size = entry.nbytes()
            self._total += size - self._sizes[key]
            self._sizes[key] = size
            if self._total > self.budget_bytes:
                self.forget(key)

    def keep(self, key: K, entry: SeriesHistory) -> bool:
        """Keep `entry` for `key` if the budget allows (after dropping idle series); whether it is kept."""
        self.forget(key)
        size = entry.nbytes()
        if self._total + size > self.budget_bytes:
            now = self._clock()
            for idle in [k for k, at in self._used.items() if now - at > IDLE_S]:
                self.forget(idle)
            if self._total + size > self.budget_bytes:
                return False
        self._entries[key] = entry
        self._sizes[key] = size
        self._used[key] = self._clock()
        self._total += size
        return True
