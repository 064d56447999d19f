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
