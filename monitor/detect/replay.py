"""Replaying a recorded history through the detector: the CSV format, the replay, `ttft-monitor replay`.

The CSV has a header naming `timestamp` (ISO 8601, UTC), `series` (any string) and `ttft_ms` (empty
for a failed request), and optionally `error` (the error class of a failed request) and `run_id`.
Rows sharing series and run_id form one run, whose TTFT is the median of its successful rows; a row
without a run_id is a run of its own. `--export` writes the stored history in the same format.
"""

from __future__ import annotations

import csv
import heapq
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

from monitor.csvsafe import csv_row, read_csv_cell
from monitor.detect.detector import Detector, Event, RunPoint
from monitor.detect.grouping import GROUPED_KINDS, Member, decide, joins, scope, summarise
from monitor.detect.sample_cells import ReplayError, parse_timestamp, parse_ttft
from monitor.detect.stats import median
from monitor.exitcodes import EXIT_OK, EXIT_USAGE
from monitor.timefmt import iso

if TYPE_CHECKING:
    from monitor.config.models import Config

COLUMNS = ("timestamp", "series", "ttft_ms", "error", "run_id")
REQUIRED_COLUMNS = ("timestamp", "series", "ttft_ms")
ERROR_CLASS = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
INCIDENT_KINDS = ("regression", "availability", "slo")


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
        self.errors: Counter[str] | None = None  # made for the first failed row with an error class

    def point(self) -> RunPoint:
        return RunPoint(
            at=self.at,
            ttft_ms=median(self.ttfts) if self.ttfts else None,
            error=self.errors.most_common(1)[0][0] if self.errors else None,
            ok=len(self.ttfts),
            errors=self.failed,
        )


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
    # Cells that repeat (a run's rows share its time; a file has few series and error classes) are read
    # once: a year of 5-minute runs is hundreds of thousands of rows.
    names_seen: dict[str, str] = {}
    errors_seen: dict[str, str | None] = {"": None}
    last_time, last_moment = "", None
    # A run's rows mostly follow one another: the run the last row joined, by its series and run_id cell.
    last_run_key: tuple[str, str] | None = None
    last_run: _Run | None = None
    fields = len(names)
    line = 1
    try:
        for row in reader:
            line = reader.line_num
            if len(row) != fields:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                raise ReplayError(f"{len(row)} fields where the header has {len(names)}", line=line)
            series = names_seen.get(row[series_at])
            if series is None:
                series = read_csv_cell(row[series_at].strip())
                if not series:
                    raise ReplayError("series is empty; every row needs one", line=line)
                names_seen[row[series_at]] = series
            if row[at] != last_time or last_moment is None:
                last_moment, last_time = parse_timestamp(row[at], line), row[at]
            moment = last_moment
            ttft: float | None
            try:  # parse_ttft's reading, which also strips the cell, in one call for a plain number
                ttft = float(row[ttft_at])
            except ValueError:
                ttft = parse_ttft(row[ttft_at], line)  # empty (a failed request), or the error
            else:
                if not (ttft > 0 and ttft != math.inf):  # nan, inf, 0 or negative
                    ttft = parse_ttft(row[ttft_at], line)  # the error
            if error_at is None:
                error = None
            elif row[error_at] in errors_seen:
                error = errors_seen[row[error_at]]
            else:
                error = read_csv_cell(row[error_at].strip()) or None
                if error is not None and not ERROR_CLASS.match(error):
                    raise ReplayError(
                        f"error {error!r} is not an error class (letters, digits, '_', '.', '-', at most 32 "
                        "characters, e.g. timeout_first_token)",
                        line=line,
                    )
                errors_seen[row[error_at]] = error
            # A request with an error failed, even if its first token came (as in the store).
            ok = ttft is not None and error is None
            run_cell = row[run_at] if run_at is not None else ""
            if last_run is not None and last_run_key == (series, run_cell):
                run = last_run
                if moment < run.at:
                    run.at = moment
            else:
                run_id = run_cell.strip()
                if not run_id:
                    point = RunPoint(moment, ttft if ok else None, error, ok=int(ok), errors=int(not ok))
                    single.setdefault(series, []).append(point)
                    continue
                runs = grouped.setdefault(series, {})
                found = runs.get(run_id)
                if found is None:
                    run = runs[run_id] = _Run(moment)
                else:
                    run = found
                    if moment < run.at:
                        run.at = moment
                last_run_key, last_run = (series, run_cell), run
            if ok:
                run.ttfts.append(ttft)  # type: ignore[arg-type]
            else:
                run.failed += 1
                if error is not None:
                    if run.errors is None:
                        run.errors = Counter()
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
    return (iso(row.timestamp), row.series, _number(row.ttft_ms), row.error or "", row.run_id or "")


def write_samples_csv(rows: Iterable[SampleRow], stream: TextIO, *, header: bool = True) -> int:
    """Write the header (unless `header=False`, to append) and `rows`; the number of rows written."""
    writer = csv.writer(stream, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    count = 0
    for row in rows:
        writer.writerow(csv_row(csv_fields(row)))
        count += 1
    return count


# ---------------------------------------------------------------- replaying


def _incident(series: str, event: Event) -> dict[str, Any]:
    return {
        "series": series,
        "kind": event.kind,
        "severity": event.severity,
        "opened_at": iso(event.opened_at),
        "resolved_at": None,
        "baseline_ms": _round(event.baseline_ms, 1),
        "observed_ms": _round(event.observed_ms, 1),
        "ratio": _round(event.ratio, 3),
        "error": event.error,
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """Grouping as `alerts.grouping` configures it (monitor.detect.grouping)."""

    enabled: bool = True
    by: str = "provider"  # or "location": then `provider_of` names each series' location
    window: timedelta = timedelta(minutes=15)
    hold: timedelta = timedelta(minutes=10)


@dataclass(slots=True)
class _Group:
    """A group as replay keeps it in memory, with the notifications it would have sent."""

    id: str
    provider: str
    opened_at: datetime
    members: list[dict[str, Any]] = field(default_factory=list)
    notified_members: int = 0
    notified_severity: str | None = None
    resolved: bool = False
    notifications: list[dict[str, Any]] = field(default_factory=list)


def _names(series: str) -> tuple[str, str, str]:
    """(target, prompt, location) of an exported series name `target/prompt/location`."""
    parts = series.split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else (series, "", "")


def _member(incident: dict[str, Any]) -> Member:
    target, prompt, location = _names(incident["series"])
    return Member(
        target=target,
        prompt=prompt,
        location=location,
        severity=incident["severity"],
        since=incident["_since"],
        ratio=incident["ratio"],
        open=incident["resolved_at"] is None,
    )


class _Grouper:
    """The service's grouping (monitor.detect.service), in memory: join on opening, decide after each
    batch of runs, with the same pure rules."""

    def __init__(self, settings: GroupSettings, provider_of: Callable[[str], str], series: Iterable[str]) -> None:
        self.settings = settings
        self.provider_of = provider_of
        self.scopes: dict[str, tuple[_Group, datetime]] = {}
        self.groups: list[_Group] = []
        self.locations: dict[str, set[str]] = {}
        for name in series:
            self.locations.setdefault(provider_of(name), set()).add(_names(name)[2])

    def _locations(self, group: _Group) -> set[str]:
        return self.locations.get(group.provider, set()) if self.settings.by == "provider" else set()

    def join(self, series: str, incident: dict[str, Any], at: datetime) -> _Group:
        provider = self.provider_of(series)
        key = scope("regression", provider, by=self.settings.by, series=None if self.settings.enabled else series)
        current = self.scopes.get(key)
        if current is not None and not current[0].resolved and joins(current[1], at, self.settings.window):
            group = current[0]
        else:
            group = _Group(
                id=f"{provider}#{sum(1 for g in self.groups if g.provider == provider) + 1}",
                provider=provider,
                opened_at=at,
            )
            self.groups.append(group)
        self.scopes[key] = (group, at)
        group.members.append(incident)
        incident["group"] = group.id
        return group

    def sync(self, group: _Group, at: datetime, pending: int) -> None:
        if group.resolved:
            return
        members = [_member(m) for m in group.members]
        decision = decide(
            members,
            notified_members=group.notified_members,
            notified_severity=group.notified_severity,
            resolved=False,
            pending=pending if self.settings.enabled and group.notified_members == 0 else 0,
            age=at - group.opened_at,
            hold=self.settings.hold,
        )
        if decision is None:
            return
        state, count, severity = decision
        if state == "resolved":
            group.resolved = True
            if not group.notified_members:
                return
        else:
            group.notified_members, group.notified_severity = count, severity
        summary = summarise(group.provider, members, provider_locations=self._locations(group), by=self.settings.by)
        group.notifications.append(
            {
                "at": iso(at),
                "state": state,
                "severity": severity,
                "summary": summary.text(resolved=state == "resolved"),
                "members": count,
            }
        )

    def summaries(self) -> list[dict[str, Any]]:
        out = []
        for group in self.groups:
            members = [_member(m) for m in group.members]
            summary = summarise(group.provider, members, provider_locations=self._locations(group), by=self.settings.by)
            out.append(
                {
                    "group": group.id,
                    "summary": summary.text(),
                    "members": list(summary.names),
                    "notifications": group.notifications,
                }
            )
        return out


# Runs of one job run start within seconds of each other: runs this close form one batch, decided
# together as the service decides each stored batch.
BATCH = timedelta(seconds=60)


def replay(
    series_points: Mapping[str, Sequence[RunPoint]],
    detector_factory: Callable[[str], Detector],
    *,
    provider_of: Callable[[str], str] | None = None,
    grouping: GroupSettings | None = None,
    groups: list[dict[str, Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """The incidents the detector would have raised, per series (in name order) by opening time.

    Each is a dict: series, kind, severity (the highest it reached), opened_at, resolved_at (None
    while open at the end), baseline_ms, observed_ms and ratio (when it opened, or became a page),
    and error (the error class, for availability). With `provider_of` (series name to provider),
    regressions are grouped as the service groups them: each gets `group`, and `groups` (a list, if
    given) receives every group with the notifications it would have sent.
    """
    replayers = {series: detector_factory(series).replayer() for series in series_points}
    per_series: dict[str, list[dict[str, Any]]] = {series: [] for series in series_points}
    open_now: dict[tuple[str, str], dict[str, Any]] = {}
    grouper = _Grouper(grouping or GroupSettings(), provider_of, series_points) if provider_of else None
    touched: set[str] = set()  # ids of the groups this batch changed
    batch_start: datetime | None = None
    last: datetime | None = None

    def flush(at: datetime) -> None:
        assert grouper is not None
        due = [g for g in grouper.groups if g.id in touched or (not g.resolved and g.notified_members == 0)]
        touched.clear()
        for group in due:
            pending = sum(
                1
                for series, replayer in replayers.items()
                if grouper.provider_of(series) == group.provider
                and ("regression" not in replayer.state.incidents)
                and (replayer.state.page_streak or replayer.state.ticket_streak)
            )
            grouper.sync(group, at, pending)

    def runs_of(series: str) -> Iterator[tuple[datetime, str, RunPoint]]:
        return ((point.at, series, point) for point in series_points[series])

    # Every series' runs in time order (the service sees them as they are stored).
    ordered = heapq.merge(*(runs_of(series) for series in sorted(series_points)), key=lambda item: (item[0], item[1]))
    for at, series, point in ordered:
        if grouper is not None and batch_start is not None and last is not None and at - batch_start > BATCH:
            flush(last)
            batch_start = None
        if batch_start is None:
            batch_start = at
        last = at
        for event in replayers[series].feed(point):
            if event.kind not in INCIDENT_KINDS:
                continue
            key = (series, event.kind)
            if event.action == "open":
                incident = open_now[key] = _incident(series, event)
                per_series[series].append(incident)
                if grouper is not None:
                    incident["group"] = None
                    if event.kind in GROUPED_KINDS:
                        since = event.detail.get("since")
                        incident["_since"] = datetime.fromisoformat(since) if isinstance(since, str) else event.at
                        touched.add(grouper.join(series, incident, event.opened_at).id)
            elif event.action == "update":
                open_now[key].update({k: v for k, v in _incident(series, event).items() if k != "opened_at"})
                if open_now[key].get("group") is not None:
                    touched.add(open_now[key]["group"])
            elif event.action == "resolve":
                incident = open_now.pop(key)
                incident["resolved_at"] = iso(event.at)
                if incident.get("group") is not None:
                    touched.add(incident["group"])
    if grouper is not None and last is not None:
        flush(last)
        if groups is not None:
            groups.extend(grouper.summaries())
    for series in sorted(per_series):
        for incident in per_series[series]:
            incident.pop("_since", None)
            yield incident


# ---------------------------------------------------------------- the command

# A weekly rate needs a week of history; tickets open only from the seasonal baseline's 3.5 days on.
RATE_MIN_DAYS = 7.0


def alert_rate_line(series: str, points: Sequence[RunPoint], regressions: int) -> str:
    """What a series' history implies at these settings: the regression alerts its replay opened, per
    week. On a history without a real regression in it, that is the false-alert rate to expect."""
    days = (points[-1].at - points[0].at).total_seconds() / 86400.0 if points else 0.0
    if days < RATE_MIN_DAYS:
        return (
            f"{series}: {days:.1f} days of runs, too few for a weekly alert rate "
            f"({RATE_MIN_DAYS:.0f} needed; tickets open only after 3.5)"
        )
    rate = regressions / (days / 7.0)
    return (
        f"{series}: {days:.1f} days of runs, {regressions} regression alerts: {rate:.2f} a week at these "
        "settings (on a healthy history, its false-alert rate)"
    )


def replay_main(samples: str, config: Config | None, *, show_groups: bool, stdout: TextIO, stderr: TextIO) -> int:
    """`ttft-monitor replay --samples FILE.csv [--config FILE]`: incidents (or with `show_groups`, the groups)
    as JSON lines on `stdout`, the tally on `stderr`; `config` gives the rules, SLOs and grouping."""
    try:
        with open(samples, encoding="utf-8-sig", newline="") as stream:
            points = read_samples_csv(stream)
    except OSError as exc:
        stderr.write(f"ttft-monitor replay: cannot read {samples}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    except UnicodeDecodeError as exc:
        stderr.write(f"ttft-monitor replay: {samples} is not UTF-8 text ({exc.reason})\n")
        return EXIT_USAGE
    except ReplayError as exc:
        stderr.write(f"ttft-monitor replay: {samples}: {exc}\n")
        return EXIT_USAGE

    def detector_for(series: str) -> Detector:
        if config is None:
            return Detector()
        # Exported series are named target/prompt/location: the target's SLO applies to them.
        target = config.targets.get(series.split("/", 1)[0])
        return Detector(config.detection.rules(), slo_ms=target.slo.ttft_p50_ms if target is not None else None)

    provider_of = None
    settings = None
    if config is not None:
        known = config.targets

        grouping = config.alerts.grouping

        def provider_of(series: str) -> str:
            if grouping.by == "location":
                return _names(series)[2] or series
            # Series of targets the config does not know stand alone: their name is their provider.
            target = known.get(series.split("/", 1)[0])
            return target.provider if target is not None else series

        settings = GroupSettings(
            enabled=grouping.enabled,
            by=grouping.by,
            window=timedelta(minutes=grouping.window_minutes),
            hold=timedelta(minutes=grouping.hold_minutes),
        )
    groups: list[dict[str, Any]] = []
    # Incidents of kinds that are not grouped (SLO burn, availability, ...) page on their own, as in
    # the daemon: `--groups` lists them after the groups, so it shows every page that would go out.
    alone: list[dict[str, Any]] = []
    count = 0
    found = replay(points, detector_for, provider_of=provider_of, grouping=settings, groups=groups)
    regressions: Counter[str] = Counter()
    for incident in itertools.chain(found, _burn_incidents(samples, config)):
        if incident["kind"] == "regression":
            regressions[incident["series"]] += 1
        if provider_of is not None:
            incident.setdefault("group", None)
            if incident["group"] is None:
                alone.append(incident)
        if not show_groups:
            stdout.write(json.dumps(incident) + "\n")
        count += 1
    if show_groups:
        for item in [*groups, *alone]:
            stdout.write(json.dumps(item) + "\n")
    for series in sorted(points):
        stderr.write(alert_rate_line(series, points[series], regressions.get(series, 0)) + "\n")
    runs = sum(len(p) for p in points.values())
    notified = sum(len(group["notifications"]) for group in groups)
    grouped = f", in {len(groups)} groups ({notified} notifications)" if provider_of is not None else ""
    if alone:
        grouped += f", {len(alone)} notified on their own"
    stderr.write(f"replayed {runs} runs of {len(points)} series: {count} incidents{grouped}\n")
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
