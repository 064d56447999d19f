"""An incident's figures, the one place every surface reads them from: `ttft-monitor incidents`, the
API and pages, the report and the notifications.

An incident row keeps the baseline and observed TTFT at opening (`opened_*`), the highest ratio while
it was open (`peak_ratio`, `peak_at`) and, in `baseline_ms`/`observed_ms`/`ratio`, the latest values:
those of its last update or, once resolved, of the run that cleared it (a ratio near 1.0). What an
incident was is its opening and its peak; the current values say only where it stands now."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from monitor.timefmt import iso

MS_DIGITS = 1
RATIO_DIGITS = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentFigures:
    opened_baseline_ms: float | None  # the baseline the opening run was compared with
    opened_observed_ms: float | None  # and what it measured
    peak_ratio: float | None  # the highest ratio while open (never below the opening's)
    peak_at: datetime | None
    baseline_ms: float | None  # now: the last update's or, resolved, the clearing run's
    observed_ms: float | None
    ratio: float | None

    def to_json(self) -> dict[str, Any]:
        """Rounded as people read them, the same in every JSON surface."""
        return {
            "opened_baseline_ms": _round(self.opened_baseline_ms, MS_DIGITS),
            "opened_observed_ms": _round(self.opened_observed_ms, MS_DIGITS),
            "peak_ratio": _round(self.peak_ratio, RATIO_DIGITS),
            "peak_at": None if self.peak_at is None else iso(self.peak_at, whole_seconds=True),
            "baseline_ms": _round(self.baseline_ms, MS_DIGITS),
            "observed_ms": _round(self.observed_ms, MS_DIGITS),
            "ratio": _round(self.ratio, RATIO_DIGITS),
        }


def incident_figures(
    *,
    baseline_ms: float | None,
    observed_ms: float | None,
    ratio: float | None,
    opened_baseline_ms: float | None = None,
    opened_observed_ms: float | None = None,
    peak_ratio: float | None = None,
    peak_at: datetime | None = None,
) -> IncidentFigures:
    """The figures of an incident from its stored values. Rows written before the opening and the peak
    were kept (migration 0003) have neither: the latest values then stand for the opening, and the peak
    is the larger of the opening's ratio and the latest one."""
    if opened_baseline_ms is None and opened_observed_ms is None:
        opened_baseline_ms, opened_observed_ms = baseline_ms, observed_ms
    if peak_ratio is None:
        candidates = [r for r in (_ratio(opened_observed_ms, opened_baseline_ms), ratio) if r is not None]
        peak_ratio = max(candidates) if candidates else None
    return IncidentFigures(
        opened_baseline_ms=opened_baseline_ms,
        opened_observed_ms=opened_observed_ms,
        peak_ratio=peak_ratio,
        peak_at=peak_at,
        baseline_ms=baseline_ms,
        observed_ms=observed_ms,
        ratio=ratio,
    )


def figures_of(values: Mapping[str, Any] | Any) -> IncidentFigures:
    """`incident_figures` of a row (an incident row, a `MemberRecord`) or of a mapping of its columns."""
    get = values.get if isinstance(values, Mapping) else lambda name: getattr(values, name, None)
    return incident_figures(
        baseline_ms=get("baseline_ms"),
        observed_ms=get("observed_ms"),
        ratio=get("ratio"),
        opened_baseline_ms=get("opened_baseline_ms"),
        opened_observed_ms=get("opened_observed_ms"),
        peak_ratio=get("peak_ratio"),
        peak_at=get("peak_at"),
    )


def _ratio(observed: float | None, baseline: float | None) -> float | None:
    if observed is None or baseline is None or baseline <= 0:
        return None
    return observed / baseline


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)
