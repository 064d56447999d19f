"""Summaries of a set of samples and their table / JSON / CSV renderings. Pure."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from monitor.csvsafe import csv_cell
from monitor.probe.result import SAMPLE_FIELDS, Sample
from monitor.quantile import quantile
from monitor.table import table_lines


@dataclass(slots=True)
class SeriesSummary:
    target: str
    prompt: str
    samples: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_min_ms: float | None = None
    ttft_max_ms: float | None = None
    ttfa_p50_ms: float | None = None
    decode_tps_p50: float | None = None
    prompt_tokens_p50: float | None = None
    prompt_tokens_target: int | None = None
    cached_tokens_p50: float | None = None
    setup_ms_p50: float | None = None
    # Samples the monitor itself was late around (Sample.disturbed): in `samples` and `errors`, not in the figures.
    disturbed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


def summarize(samples: Iterable[Sample]) -> list[SeriesSummary]:
    """One row per (target, prompt) in first-seen order; warm-up samples are left out. Disturbed ones
    are counted (and their errors shown) but left out of the latency figures."""
    groups: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        if not sample.warmup:
            groups.setdefault((sample.target, sample.prompt), []).append(sample)
    rows = []
    for (target, prompt), members in groups.items():
        disturbed = sum(1 for s in members if s.disturbed)
        group = [s for s in members if not s.disturbed] if disturbed else members
        ok = [s for s in group if s.ok and s.ttft_ms is not None]
        ttft = sorted(s.ttft_ms for s in ok if s.ttft_ms is not None)
        rows.append(
            SeriesSummary(
                target=target,
                prompt=prompt,
                samples=len(members),
                errors=dict(Counter(s.error.value for s in members if s.error is not None)),
                ttft_p50_ms=quantile(ttft, 0.5, presorted=True),
                ttft_p90_ms=quantile(ttft, 0.9, presorted=True),
                ttft_min_ms=ttft[0] if ttft else None,
                ttft_max_ms=ttft[-1] if ttft else None,
                ttfa_p50_ms=quantile([s.ttfa_ms for s in ok if s.ttfa_ms is not None], 0.5),
                decode_tps_p50=quantile([s.decode_tps for s in ok if s.decode_tps is not None], 0.5),
                prompt_tokens_p50=quantile([s.prompt_tokens for s in ok if s.prompt_tokens is not None], 0.5),
                prompt_tokens_target=members[0].prompt_tokens_target,
                cached_tokens_p50=quantile([s.cached_tokens for s in ok if s.cached_tokens is not None], 0.5),
                setup_ms_p50=quantile([s.setup_ms for s in ok if s.setup_ms is not None], 0.5),
                disturbed=disturbed,
            )
        )
    return rows


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_table(rows: Sequence[SeriesSummary], *, show_setup: bool = False) -> str:
    headers = ["target", "prompt", "tokens", "n", "err", "TTFT p50", "p90", "min", "max", "TTFA p50", "tok/s"]
    if show_setup:
        headers.append("setup p50")
    body = []
    for r in rows:
        errors = sum(r.errors.values())
        line = [
            r.target,
            r.prompt,
            _num(r.prompt_tokens_p50, 0),
            str(r.samples),
            str(errors) if errors else "0",
            _num(r.ttft_p50_ms),
            _num(r.ttft_p90_ms),
            _num(r.ttft_min_ms),
            _num(r.ttft_max_ms),
            _num(r.ttfa_p50_ms),
            _num(r.decode_tps_p50),
        ]
        if show_setup:
            line.append(_num(r.setup_ms_p50))
        body.append(line)
    lines = table_lines(headers, body, left_columns=2, rule=True)
    lines.append("times in ms; tokens = median prompt tokens the server reported; warm-up rounds excluded")
    error_lines = [
        f"  {r.target} / {r.prompt}: " + ", ".join(f"{k} x{v}" for k, v in sorted(r.errors.items()))
        for r in rows
        if r.errors
    ]
    if error_lines:
        lines.append("errors:")
        lines.extend(error_lines)
    disturbed_lines = [f"  {r.disturbed} of {r.samples}: {r.target} / {r.prompt}" for r in rows if r.disturbed]
    if disturbed_lines:
        lines.append(
            "disturbed (this monitor was itself late around the stamps; left out of the figures, "
            "self_delay_ms in --format json or csv says by how much):"
        )
        lines.extend(disturbed_lines)
    return "\n".join(lines)


def render_json(samples: Sequence[Sample], rows: Sequence[SeriesSummary]) -> str:
    return json.dumps(
        {"summary": [r.as_dict() for r in rows], "samples": [s.as_dict() for s in samples]},
        ensure_ascii=False,
        indent=1,
    )


def render_csv(samples: Sequence[Sample]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(SAMPLE_FIELDS), lineterminator="\n")
    writer.writeheader()
    for sample in samples:
        writer.writerow({k: csv_cell("" if v is None else v) for k, v in sample.as_dict().items()})
    return out.getvalue()
