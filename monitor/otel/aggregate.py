"""ttft-monitor's own aggregation of the exported metrics: counters, explicit-bucket histograms, gauges.

Why not the SDK's instruments: each SDK measurement validates and hashes its attributes anew, about
40 us apiece for a dozen attributes, and a probe makes thirteen: half a millisecond on the probes'
loop per sample (measured in bench/daemon.py --otel), where any work delays the next stamp. Here a
probe's attributes are keyed once and each observation is a dict lookup and a bisect, as in
prometheus_client; the exporter's thread turns a snapshot into the SDK's `MetricsData` and the
official OTLP exporter sends it.

Pure apart from a lock: values in, snapshots out; no SDK import.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Value = str | int | float | bool
Key = tuple[tuple[str, Value], ...]
Kind = Literal["counter", "histogram", "gauge"]


def key_of(attributes: Mapping[str, Value]) -> Key:
    return tuple(sorted(attributes.items()))


@dataclass(frozen=True)
class Instrument:
    name: str
    kind: Kind
    unit: str
    description: str
    bounds: tuple[float, ...] = ()


@dataclass
class HistogramState:
    counts: list[int]
    sum: float = 0.0
    count: int = 0
    min: float = float("inf")
    max: float = float("-inf")


@dataclass
class Snapshot:
    """What was recorded, per instrument name and attribute key, with the interval it covers."""

    start_ns: int
    end_ns: int
    counters: dict[str, dict[Key, float]] = field(default_factory=dict)
    histograms: dict[str, dict[Key, HistogramState]] = field(default_factory=dict)
    gauges: dict[str, dict[Key, tuple[float, int]]] = field(default_factory=dict)

    def points(self) -> int:
        return sum(len(v) for part in (self.counters, self.histograms, self.gauges) for v in part.values())


class Aggregates:
    """Thread-safe: the probes' loop records, the exporter's thread takes snapshots."""

    def __init__(self, instruments: Sequence[Instrument], *, start_ns: int) -> None:
        self.instruments = {i.name: i for i in instruments}
        self._lock = threading.Lock()
        self._start_ns = start_ns
        self._counters: dict[str, dict[Key, float]] = {}
        self._histograms: dict[str, dict[Key, HistogramState]] = {}
        self._gauges: dict[str, dict[Key, tuple[float, int]]] = {}

    def add(self, name: str, key: Key, value: float) -> None:
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[key] = series.get(key, 0) + value

    def record(self, name: str, key: Key, value: float) -> None:
        bounds = self.instruments[name].bounds
        with self._lock:
            series = self._histograms.setdefault(name, {})
            state = series.get(key)
            if state is None:
                state = series[key] = HistogramState(counts=[0] * (len(bounds) + 1))
            # OTLP explicit buckets are upper-inclusive: (bounds[i-1], bounds[i]].
            state.counts[bisect_left(bounds, value)] += 1
            state.sum += value
            state.count += 1
            state.min = min(state.min, value)
            state.max = max(state.max, value)

    def set(self, name: str, key: Key, value: float, at_ns: int) -> None:
        with self._lock:
            self._gauges.setdefault(name, {})[key] = (value, at_ns)

    def snapshot(self, *, now_ns: int, delta: bool) -> Snapshot:
        """Copies of everything; with `delta`, counters and histograms start again from zero."""
        with self._lock:
            snap = Snapshot(
                start_ns=self._start_ns,
                end_ns=now_ns,
                counters={n: dict(s) for n, s in self._counters.items()},
                histograms={
                    n: {k: HistogramState(list(v.counts), v.sum, v.count, v.min, v.max) for k, v in s.items()}
                    for n, s in self._histograms.items()
                },
                gauges={n: dict(s) for n, s in self._gauges.items()},
            )
            if delta:
                self._counters.clear()
                self._histograms.clear()
                self._start_ns = now_ns
        return snap
