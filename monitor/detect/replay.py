"""Replaying a recorded history through the detector: the CSV format, the replay, `ttft-monitor replay`.

The CSV has a header naming `timestamp` (ISO 8601, UTC), `series` (any string) and `ttft_ms` (empty
for a failed request), and optionally `error` (the error class of a failed request) and `run_id`.
Rows sharing series and run_id form one run, whose TTFT is the median of its successful rows; a row
without a run_id is a run of its own. `--export` writes the stored history in the same format.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from monitor.detect.detector import Detector, Event, RunPoint
from monitor.detect.stats import median

COLUMNS = ("timestamp", "series", "ttft_ms", "error", "run_id")
REQUIRED_COLUMNS = ("timestamp", "series", "ttft_ms")
EXIT_OK, EXIT_USAGE, EXIT_DATABASE = 0, 2, 3
ERROR_CLASS = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
INCIDENT_KINDS = ("regression", "availability", "slo")


class ReplayError(Exception):
    """The CSV cannot be replayed; `str()` names the line and what to change."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One request, as a CSV row."""

    timestamp: datetime
    series: str
    ttft_ms: float | None
    error: str | None = None
    run_id: str | None = None


# ---------------------------------------------------------------- reading


class _Run:
    """The rows of one run, as they are read."""

    __slots__ = ("at", "errors", "failed", "ttfts")

    def __init__(self, at: datetime) -> None:
        self.at = at
        self.ttfts: list[float] = []
        self.failed = 0
        self.errors: Counter[str] = Counter()

    def point(self) -> RunPoint:
        return RunPoint(
            at=self.at,
            ttft_ms=median(self.ttfts) if self.ttfts else None,
            error=self.errors.most_common(1)[0][0] if self.errors else None,
            ok=len(self.ttfts),
            errors=self.failed,
        )


def _timestamp(text: str, line: int) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReplayError(
            f"timestamp {text!r} is not an ISO 8601 time; write it like 2025-01-31T09:00:00Z", line=line
        ) from None
    # The format says UTC; a time without an offset is read as UTC rather than refused.
    return moment.replace(tzinfo=UTC) if moment.utcoffset() is None else moment.astimezone(UTC)


def _ttft(text: str, line: int) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ReplayError(
            f"ttft_ms {text!r} is not a positive number of milliseconds (leave it empty for a failed request)",
            line=line,
        )
    return value


def read_samples_csv(stream: TextIO) -> dict[str, list[RunPoint]]:
    """The runs in a samples CSV, per series, oldest first. ReplayError on the first bad line."""
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        raise ReplayError(f"the file is empty; it needs a header line: {','.join(COLUMNS)}", line=1) from None
    except csv.Error as exc:
        raise ReplayError(f"not CSV: {exc}", line=1) from None
    names = [name.strip().lstrip("\ufeff").lower() for name in header]
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if missing:
        raise ReplayError(
            f"the header lacks {', '.join(repr(m) for m in missing)}; it must name timestamp, series and "
            f"ttft_ms (error and run_id are optional), e.g. {','.join(COLUMNS)}",
            line=1,
        )
    index = {name: names.index(name) for name in COLUMNS if name in names}
    at, series_at, ttft_at = index["timestamp"], index["series"], index["ttft_ms"]
    error_at, run_at = index.get("error"), index.get("run_id")
    grouped: dict[str, dict[str, _Run]] = {}
    single: dict[str, list[RunPoint]] = {}
    line = 1
    try:
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(names):
                raise ReplayError(f"{len(row)} fields where the header has {len(names)}", line=line)
            series = row[series_at].strip()
            if not series:
                raise ReplayError("series is empty; every row needs one", line=line)
            moment = _timestamp(row[at], line)
            ttft = _ttft(row[ttft_at], line)
            error = (row[error_at].strip() or None) if error_at is not None else None
            if error is not None and not ERROR_CLASS.match(error):
                raise ReplayError(
                    f"error {error!r} is not an error class (letters, digits, '_', '.', '-', at most 32 "
                    "characters, e.g. timeout_first_token)",
                    line=line,
                )
            # A request with an error failed, even if its first token came (as in the store).
            ok = ttft is not None and error is None
            run_id = row[run_at].strip() if run_at is not None else ""
            if not run_id:
                point = RunPoint(moment, ttft if ok else None, error, ok=int(ok), errors=int(not ok))
                single.setdefault(series, []).append(point)
                continue
            runs = grouped.setdefault(series, {})
            run = runs.get(run_id)
            if run is None:
                run = runs[run_id] = _Run(moment)
            elif moment < run.at:
                run.at = moment
            if ok:
                run.ttfts.append(ttft)  # type: ignore[arg-type]
            else:
                run.failed += 1
                if error is not None:
                    run.errors[error] += 1
    except csv.Error as exc:
        raise ReplayError(f"not CSV: {exc}", line=reader.line_num) from None
    out: dict[str, list[RunPoint]] = {}
    for series in {*single, *grouped}:
        points = single.get(series, []) + [run.point() for run in grouped.get(series, {}).values()]
        points.sort(key=lambda p: p.at)
        out[series] = points
    return out


# ---------------------------------------------------------------- writing


def _number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def csv_fields(row: SampleRow) -> tuple[str, str, str, str, str]:
    """A row's fields in `COLUMNS` order, as written."""
    return (_stamp(row.timestamp), row.series, _number(row.ttft_ms), row.error or "", row.run_id or "")


def write_samples_csv(rows: Iterable[SampleRow], stream: TextIO, *, header: bool = True) -> int:
    """Write the header (unless `header=False`, to append) and `rows`; the number of rows written."""
    writer = csv.writer(stream, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    count = 0
    for row in rows:
        writer.writerow(csv_fields(row))
        count += 1
    return count


# ---------------------------------------------------------------- replaying


def _incident(series: str, event: Event) -> dict[str, Any]:
    return {
        "series": series,
        "kind": event.kind,
        "severity": event.severity,
        "opened_at": _stamp(event.opened_at),
        "resolved_at": None,
        "baseline_ms": _round(event.baseline_ms, 1),
        "observed_ms": _round(event.observed_ms, 1),
        "ratio": _round(event.ratio, 3),
        "error": event.error,
    }


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def replay(
    series_points: Mapping[str, Sequence[RunPoint]], detector_factory: Callable[[str], Detector]
) -> Iterator[dict[str, Any]]:
    """The incidents the detector would have raised, per series (in name order) by opening time.

    Each is a dict: series, kind, severity (the highest it reached), opened_at, resolved_at (None
    while open at the end), baseline_ms, observed_ms and ratio (when it opened, or became a page),
    and error (the error class, for availability).
    """
    for series in sorted(series_points):
        replayer = detector_factory(series).replayer()
        incidents: list[dict[str, Any]] = []
        open_now: dict[str, dict[str, Any]] = {}
        for point in series_points[series]:
            for event in replayer.feed(point):
                if event.kind not in INCIDENT_KINDS:
                    continue
                if event.action == "open":
                    open_now[event.kind] = _incident(series, event)
                    incidents.append(open_now[event.kind])
                elif event.action == "update":
                    open_now[event.kind].update({k: v for k, v in _incident(series, event).items() if k != "opened_at"})
                elif event.action == "resolve":
                    open_now.pop(event.kind)["resolved_at"] = _stamp(event.at)
        yield from incidents


# ---------------------------------------------------------------- the command


def replay_main(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """`ttft-monitor replay --samples FILE.csv [--config FILE]`: incidents as JSON lines on stdout."""
    from monitor.config.errors import ConfigError
    from monitor.config.loader import load_config

    config = None
    if args.config:
        try:
            config = load_config(args.config)
        except ConfigError as exc:
            stderr.write(f"{exc}\n")
            return EXIT_USAGE
    try:
        with open(args.samples, encoding="utf-8-sig", newline="") as stream:
            points = read_samples_csv(stream)
    except OSError as exc:
        stderr.write(f"ttft-monitor replay: cannot read {args.samples}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    except UnicodeDecodeError as exc:
        stderr.write(f"ttft-monitor replay: {args.samples} is not UTF-8 text ({exc.reason})\n")
        return EXIT_USAGE
    except ReplayError as exc:
        stderr.write(f"ttft-monitor replay: {args.samples}: {exc}\n")
        return EXIT_USAGE

    def detector_for(series: str) -> Detector:
        if config is None:
            return Detector()
        # Exported series are named target/prompt/location: the target's SLO applies to them.
        target = config.targets.get(series.split("/", 1)[0])
        return Detector(config.detection, slo_ms=target.slo.ttft_p50_ms if target is not None else None)

    count = 0
    for incident in replay(points, detector_for):
        stdout.write(json.dumps(incident) + "\n")
        count += 1
    for incident in _burn_incidents(args.samples, config):
        stdout.write(json.dumps(incident) + "\n")
        count += 1
    runs = sum(len(p) for p in points.values())
    stderr.write(f"replayed {runs} runs of {len(points)} series: {count} incidents\n")
    return EXIT_OK


def _burn_incidents(path: str, config: Any) -> Iterator[dict[str, Any]]:
    """The targets' `slo_burn` incidents (monitor/detect/burn_replay.py); none without a config."""
    from monitor.detect.burn import policy_for
    from monitor.detect.burn_replay import read_probes, replay_burn

    if config is None:
        return
    policies = {name: p for name, t in config.targets.items() if (p := policy_for(t, config.detection.slo_burn))}
    if policies:
        with open(path, encoding="utf-8-sig", newline="") as stream:
            probes = read_probes(stream, policies)
        yield from replay_burn(probes, policies)
