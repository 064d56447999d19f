"""Counter, Gauge, Histogram and Summary whose values hold no lock, for the families labelled by series.

prometheus_client keeps every value (each bucket of each histogram child is one) as a `MutexValue`: an
object with its own dict and a `threading.Lock`, about 190 bytes. At 500 probe series that is about
53,000 values and 10 MB of the daemon's memory; a slotted float is 48 bytes.

The lock buys nothing here: these families are written only from the daemon's main event loop (the
probes' samples, the detector's verdicts), one thread, and read by the exposition from a worker thread,
where reading a float attribute is atomic under the GIL. A scrape may see a histogram's buckets one
observation ahead of its sum, as it may with prometheus_client's per-value locks. A family written from
several threads must keep prometheus_client's own classes.

The children are prometheus_client's, so `labels()`, `remove()`, `collect()` and `generate_latest` work
as for the plain classes; monitor.metrics.exposition reads them as it reads those.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any, Self

from prometheus_client import Counter, Gauge, Histogram, Summary


class LeanValue:
    """A float with prometheus_client's value interface (no exemplars: the monitor sets none)."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = 0.0

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def get(self) -> float:
        return self._value

    def set_exemplar(self, exemplar: object) -> None:
        raise ValueError("lean metric values keep no exemplars")

    def get_exemplar(self) -> None:
        return None


class LeanBuckets:
    """A histogram child's bucket counts as one array of floats (8 bytes a bucket) instead of a value object
    each (48 bytes and a list slot): at 500 series, 22,656 buckets and about 1 MB less resident.

    Indexing gives a view with the value interface, which is what `Histogram.observe` uses (one small object
    an observation); the exposition reads `counts()` directly."""

    __slots__ = ("_counts",)

    def __init__(self, size: int) -> None:
        self._counts = array("d", bytes(8 * size))

    def __len__(self) -> int:
        return len(self._counts)

    def __getitem__(self, index: int) -> BucketValue:
        if not -len(self._counts) <= index < len(self._counts):
            raise IndexError(index)
        return BucketValue(self._counts, index % len(self._counts))

    def __iter__(self) -> Iterator[BucketValue]:
        return (BucketValue(self._counts, index) for index in range(len(self._counts)))

    def counts(self) -> array[float]:
        return self._counts


class BucketValue:
    """One bucket of a `LeanBuckets`, with prometheus_client's value interface."""

    __slots__ = ("_counts", "_index")

    def __init__(self, counts: array[float], index: int) -> None:
        self._counts, self._index = counts, index

    def inc(self, amount: float) -> None:
        self._counts[self._index] += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._counts[self._index] = value

    def get(self) -> float:
        return self._counts[self._index]

    def set_exemplar(self, exemplar: object) -> None:
        raise ValueError("lean metric values keep no exemplars")

    def get_exemplar(self) -> None:
        return None


_ONLY_STR = frozenset({str})


class _ChildLookup:
    """`labels()` finding an existing child with one dict look-up: prometheus_client's checks the call, makes
    each value a str and takes the family's lock every time (3-5 us; a probe's sample asks for 13 children, 17
    with an SLO and prices).
    Anything but plain str values of a family with labels, and a child not made yet, take its own way."""

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Self:
        if not labelkwargs and _ONLY_STR.issuperset(map(type, labelvalues)):
            children = vars(self).get("_metrics")  # a family with labels: its children by their values
            if children is not None:
                child = children.get(labelvalues)
                if child is not None:
                    return child  # type: ignore[no-any-return]
        child = super().labels(*labelvalues, **labelkwargs)  # type: ignore[misc]
        _share_with(child, self)
        return child  # type: ignore[no-any-return]


# What a child copies from its family and never changes: equal values are taken as the family's own objects.
_SHARED_TYPES = (str, tuple, list, dict)


def _share_with(child: object, family: object) -> None:
    """Make `child` hold its family's own objects where it holds equal copies: prometheus_client gives each
    child a new name, options dict (`_kwargs`) and, for a histogram, bucket bounds; none of them changes after
    the child is made. 184-430 bytes a child, about 1 MB at 500 probe series (5,300 children)."""
    attrs, own = vars(child), vars(family)
    for name, value in attrs.items():  # values replaced in place: the keys do not change
        shared = own.get(name)
        if type(shared) is type(value) and isinstance(value, _SHARED_TYPES) and shared is not value and shared == value:
            attrs[name] = shared


class LeanCounter(_ChildLookup, Counter):
    def _metric_init(self) -> None:
        self._value = LeanValue()
        self._created = time.time()


class LeanGauge(_ChildLookup, Gauge):
    def _metric_init(self) -> None:
        self._value = LeanValue()


class LeanHistogram(_ChildLookup, Histogram):
    def _metric_init(self) -> None:
        self._buckets = LeanBuckets(len(self._upper_bounds))  # type: ignore[assignment]
        self._sum = LeanValue()
        self._created = time.time()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Histogram.observe without a value object per bucket looked at: the first bucket whose bound is
        at least `amount` counts it (none for NaN, as there)."""
        if exemplar:
            super().observe(amount, exemplar)
            return
        self._raise_if_not_observable()  # type: ignore[no-untyped-call]
        self._sum.inc(amount)
        bounds = self._upper_bounds
        index = bisect_left(bounds, amount)
        if index < len(bounds) and amount <= bounds[index]:
            self._buckets.counts()[index] += 1  # type: ignore[attr-defined]


class LeanSummary(_ChildLookup, Summary):
    def _metric_init(self) -> None:
        self._count = LeanValue()
        self._sum = LeanValue()
        self._created = time.time()
