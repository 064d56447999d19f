"""Precision per kind and severity from people's labels. Pure: counts in, table out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from monitor.table import table_lines

TRUE_POSITIVE, FALSE_POSITIVE, EXPECTED = "true-positive", "false-positive", "expected"
LABELS = (TRUE_POSITIVE, FALSE_POSITIVE, EXPECTED)
ALL = "all"


@dataclass(slots=True)
class PrecisionRow:
    kind: str
    severity: str
    true_positive: int = 0
    false_positive: int = 0
    expected: int = 0
    unlabelled: int = 0

    @property
    def precision(self) -> float | None:
        """true-positive / (true-positive + false-positive); `expected` (a planned change the detector
        rightly saw) counts for neither side. None before any such label."""
        judged = self.true_positive + self.false_positive
        return self.true_positive / judged if judged else None

    def add(self, label: str | None, count: int) -> None:
        if label == TRUE_POSITIVE:
            self.true_positive += count
        elif label == FALSE_POSITIVE:
            self.false_positive += count
        elif label == EXPECTED:
            self.expected += count
        else:
            self.unlabelled += count

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "true_positive": self.true_positive,
            "false_positive": self.false_positive,
            "expected": self.expected,
            "unlabelled": self.unlabelled,
            "precision": None if self.precision is None else round(self.precision, 4),
        }


SEVERITY_RANK = {"info": 0, "ticket": 1, "page": 2}


@dataclass(frozen=True, slots=True)
class Judged:
    """One incident as the precision table counts it."""

    id: Any
    kind: str
    severity: str
    label: str | None
    group_id: Any = None
    lead_id: Any = None  # the group's lead incident (the page's id), when in a group


def per_notification(incidents: Iterable[Judged]) -> list[tuple[str, str, str | None, int]]:
    """(kind, severity, label, count) counting what was notified: a group of member incidents was one
    page, so it counts once, at its highest severity, with its lead's label (the id the page showed),
    else its members' most common label. Counting members would turn one labelled page of six series
    into one true positive and five unlabelled incidents."""
    counts: dict[tuple[str, str, str | None], int] = {}
    groups: dict[Any, list[Judged]] = {}
    for item in incidents:
        if item.group_id is None:
            key = (item.kind, item.severity, item.label)
            counts[key] = counts.get(key, 0) + 1
        else:
            groups.setdefault(item.group_id, []).append(item)
    for members in groups.values():
        lead = next((m for m in members if m.id == m.lead_id), members[0])
        severity = max((m.severity for m in members), key=lambda s: SEVERITY_RANK.get(s, 0))
        labels = [m.label for m in members if m.label is not None]
        label = lead.label or (max(LABELS, key=labels.count) if labels else None)
        key = (lead.kind, severity, label)
        counts[key] = counts.get(key, 0) + 1
    return [(kind, severity, label, count) for (kind, severity, label), count in counts.items()]


def precision_table(counts: Iterable[tuple[str, str, str | None, int]]) -> list[PrecisionRow]:
    """One row per (kind, severity) from (kind, severity, label, count), sorted, then the total."""
    rows: dict[tuple[str, str], PrecisionRow] = {}
    total = PrecisionRow(ALL, ALL)
    for kind, severity, label, count in counts:
        rows.setdefault((kind, severity), PrecisionRow(kind, severity)).add(label, count)
        total.add(label, count)
    return [rows[key] for key in sorted(rows)] + ([total] if rows else [])


def format_precision(rows: list[PrecisionRow]) -> str:
    if not rows:
        return "no incidents to count\n"
    header = ("KIND", "SEVERITY", "PRECISION", "TRUE-POS", "FALSE-POS", "EXPECTED", "UNLABELLED")
    cells = [
        (
            row.kind,
            row.severity,
            "-" if row.precision is None else f"{row.precision:.0%}",
            str(row.true_positive),
            str(row.false_positive),
            str(row.expected),
            str(row.unlabelled),
        )
        for row in rows
    ]
    lines = table_lines(header, cells, left_columns=2)
    lines.append("precision = true-positive / (true-positive + false-positive); expected and unlabelled are left out")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class AlertRate:
    """Regression alerts per series-week, against the rate the detector is set to (issue 20): what the
    labels say the false ones come to."""

    series_weeks: float
    alerts: int  # regression incidents opened (each series' own, grouped or not)
    true_positive: int
    false_positive: int
    target: float  # detection.false_alerts_per_week

    @property
    def per_week(self) -> float | None:
        return self.alerts / self.series_weeks if self.series_weeks > 0 else None

    @property
    def false_per_week(self) -> float | None:
        """The alert rate times the labelled share of false ones; None before any true or false label."""
        judged = self.true_positive + self.false_positive
        if self.series_weeks <= 0 or not judged:
            return None
        return self.alerts * (self.false_positive / judged) / self.series_weeks


def alert_rate(incidents: Iterable[Judged], watched: Iterable[tuple[Any, Any]], *, target: float) -> AlertRate:
    """From every incident (kind, label) and each series' (first, last) run: seconds are summed per series."""
    seconds = sum(max(0.0, (last - first).total_seconds()) for first, last in watched)
    regressions = [item for item in incidents if item.kind == "regression"]
    return AlertRate(
        series_weeks=seconds / (7 * 86400.0),
        alerts=len(regressions),
        true_positive=sum(item.label == TRUE_POSITIVE for item in regressions),
        false_positive=sum(item.label == FALSE_POSITIVE for item in regressions),
        target=target,
    )


def format_alert_rate(rate: AlertRate) -> str:
    """The lines under the precision table: the regression alert rate and what its labels make of it."""
    if rate.series_weeks < 1.0 or rate.per_week is None:
        return (
            f"regression alerts: {rate.alerts} over {rate.series_weeks:.1f} series-weeks of runs, too little for a "
            "weekly rate (a week of one series is one series-week)\n"
        )
    line = (
        f"regression alerts: {rate.alerts} over {rate.series_weeks:.1f} series-weeks = {rate.per_week:.2f} a "
        "series-week"
    )
    false = rate.false_per_week
    if false is None:
        line += "; label them to see how many were false"
    else:
        judged = rate.true_positive + rate.false_positive
        line += (
            f"; {rate.false_positive} of {judged} labelled false, so about {false:.2f} false a series-week "
            f"against detection.false_alerts_per_week {rate.target:g}" + (" (over it)" if false > rate.target else "")
        )
    return line + "\n"
