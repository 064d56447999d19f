"""`replay` for SLO burn rates: the probes of a samples CSV, per target and location, through the same
`evaluate` and `advance` the daemon uses (monitor/detect/burn.py).

Series in the CSV are named `target/prompt/location` (as `replay --export` writes them); a target's
probes are pooled over its prompts, as the daemon pools them, and each run is dated by its first row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from monitor.detect.burn import KIND, BurnEvent, BurnPolicy, Probe, is_good, replay_probes
from monitor.detect.sample_cells import parse_timestamp, parse_ttft
from monitor.timefmt import iso


def target_and_location(series: str) -> tuple[str, str]:
    """`qwen3-8b/short/lab` -> (`qwen3-8b`, `lab`); a name without slashes is a target of its own."""
    parts = series.split("/")
    return parts[0], parts[-1] if len(parts) >= 3 else ""


def read_probes(stream: TextIO, policies: Mapping[str, BurnPolicy]) -> dict[tuple[str, str], list[Probe]]:
    """The probes of the targets in `policies`, per (target, location). The file must already have
    passed `replay.read_samples_csv`, which names any bad line."""
    reader = csv.reader(stream)
    names = [name.strip().lstrip("\ufeff").lower() for name in next(reader, [])]
    at, series_at, ttft_at = names.index("timestamp"), names.index("series"), names.index("ttft_ms")
    error_at = names.index("error") if "error" in names else None
    run_at = names.index("run_id") if "run_id" in names else None
    runs: dict[tuple[str, str], dict[str, list[Any]]] = {}
    out: dict[tuple[str, str], list[Probe]] = {}
    for row in reader:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        series = row[series_at].strip()
        key = target_and_location(series)
        policy = policies.get(key[0])
        if policy is None:
            continue
        moment = parse_timestamp(row[at], reader.line_num)
        error = (row[error_at].strip() or None) if error_at is not None else None
        good = is_good(parse_ttft(row[ttft_at], reader.line_num), error, policy.threshold_ms)
        run_id = row[run_at].strip() if run_at is not None else ""
        if not run_id:
            out.setdefault(key, []).append(Probe(moment, good))
            continue
        run = runs.setdefault(key, {}).setdefault(f"{series}\0{run_id}", [moment, []])
        run[0] = min(run[0], moment)
        run[1].append(good)
    for key, by_run in runs.items():
        out.setdefault(key, []).extend(Probe(start, good) for start, goods in by_run.values() for good in goods)
    return out


def replay_burn(
    probes: Mapping[tuple[str, str], list[Probe]], policies: Mapping[str, BurnPolicy]
) -> Iterator[dict[str, Any]]:
    """The `slo_burn` incidents, per target and location in name order, in `replay`'s output format."""
    for target, location in sorted(probes):
        policy = policies[target]
        incident: dict[str, Any] | None = None
        found: list[dict[str, Any]] = []
        for event in replay_probes(probes[(target, location)], policy):
            if event.action == "open":
                incident = _incident(f"{target}/*/{location}", event, policy)
                found.append(incident)
            elif incident is not None and event.action == "update":
                incident.update(severity=event.incident.severity, ratio=_ratio(event))
            elif incident is not None and event.action == "resolve":
                incident["resolved_at"] = iso(event.at)
                incident["peak_ratio"] = _round(event.incident.peak_burn)
                incident = None
        yield from found


def _incident(series: str, event: BurnEvent, policy: BurnPolicy) -> dict[str, Any]:
    return {
        "series": series,
        "kind": KIND,
        "severity": event.incident.severity,
        "opened_at": iso(event.incident.opened_at),
        "resolved_at": None,
        "baseline_ms": policy.threshold_ms,
        "observed_ms": None,
        "ratio": _ratio(event),
        "error": None,
        "peak_ratio": _round(event.incident.peak_burn),
    }


def _ratio(event: BurnEvent) -> float | None:
    return _round(event.result.long_burn)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
