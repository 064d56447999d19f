"""`ttft-monitor alert test --receiver NAME`, `alert new-secret` and `incidents [--format table|json]`.

Exit codes. `alert new-secret`: 0. `alert test`: 0 the receiver accepted (2xx), 1 it did not (its answer is printed),
2 usage or config error. `incidents`: 0 listed, 2 config error, 3 the database failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

from monitor.alert.deliver import config_problems, deliver
from monitor.alert.model import Notification, series_link
from monitor.alert.receivers import KINDS
from monitor.alert.text import annotation_text, fmt_duration, fmt_ms, fmt_ratio
from monitor.alert.transport import Transport
from monitor.commandline import load_config_or_explain, run_against_database
from monitor.config.models import Config
from monitor.config.secrets import new_webhook_secret
from monitor.detect.figures import IncidentFigures, figures_of
from monitor.timefmt import iso

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from monitor.store.triage import Annotation, TriageRecord

from monitor.alert.commands import register
from monitor.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from monitor.probe.proxy import ProxyEnvironment
from monitor.table import table_lines


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    if getattr(args, "incidents_command", None) is not None:
        from monitor.triage.cli import run as run_triage

        return run_triage(args, stdout=out, stderr=err)
    if args.command == "alert" and args.alert_command == "new-secret":
        out.write(new_webhook_secret() + "\n")
        return EXIT_OK
    name = "alert test" if args.command == "alert" else "incidents"
    config = load_config_or_explain(args.config, err)
    if config is None:
        return EXIT_USAGE
    if args.command == "alert":
        problems = receiver_problems(config, args.receiver)
        if problems:
            err.writelines(f"{line}\n" for line in problems)
            return EXIT_USAGE
        from monitor.logging import configure_logging

        # The answer goes to stdout; log lines (a `log` receiver's notification among them) to stderr.
        configure_logging(stream=err, level=logging.INFO)
        return asyncio.run(alert_test(config, args.receiver, out=out, err=err))
    # SQLAlchemy is imported only here (inside run_against_database): `alert test` starts faster without it.
    return run_against_database(
        _incidents(config, args.format, args.days, out),
        command=f"ttft-monitor {name}",
        url=config.database.url,
        err=err,
    )


# ---------------------------------------------------------------- alert test


def sample_notification(config: Config, now: datetime, *, state: str = "firing") -> Notification:
    """A notification that looks like a real regression of the config's first target, marked as a test."""
    target = next(iter(config.targets), "example-target")
    target_config = config.targets.get(target)
    prompt = next(iter(config.prompts), "short")
    job = next((j.name for j in config.jobs if target in j.targets), "alert-test")
    since = now - timedelta(minutes=5)
    return Notification(
        incident_id=uuid.uuid4(),
        state="resolved" if state == "resolved" else "firing",
        kind="test",
        severity="info",
        job=job,
        target=target,
        model=target_config.model if target_config else "example-model",
        provider=target_config.provider if target_config else "example-provider",
        prompt=prompt,
        location=config.location,
        since=since,
        resolved_at=now if state == "resolved" else None,
        baseline_ms=400.0,
        observed_ms=620.0,
        ratio=1.55,
        summary="Test notification from `ttft-monitor alert test`: nothing has regressed.",
        link=series_link(config.alerts.base_url, target=target, prompt=prompt, location=config.location, job=job),
    )


def receiver_problems(config: Config, receiver_name: str) -> list[str]:
    """Why `alert test --receiver NAME` cannot send, one line each; empty when it can."""
    receiver = config.alerts.receivers.get(receiver_name)
    if receiver is None:
        known = ", ".join(sorted(config.alerts.receivers)) or "none are defined"
        return [f"ttft-monitor alert test: no receiver named '{receiver_name}' (known: {known})"]
    return [f"alerts.receivers.{receiver_name}: {problem}" for problem in config_problems(receiver)]


async def alert_test(config: Config, receiver_name: str, *, out: TextIO, err: TextIO) -> int:
    problems = receiver_problems(config, receiver_name)
    if problems:
        err.writelines(f"{line}\n" for line in problems)
        return EXIT_USAGE
    receiver = config.alerts.receivers[receiver_name]
    now = datetime.now(UTC)
    firing = sample_notification(config, now)
    steps = [("test notification", firing)]
    if KINDS[receiver.type].stateful:
        steps.append(("resolve", firing.with_changes(state="resolved", resolved_at=now)))
    code = EXIT_OK
    async with Transport(proxies=ProxyEnvironment.from_environ(os.environ)) as transport:
        for label, notification in steps:
            result = await deliver(notification, receiver_name, receiver, transport=transport, now=now)
            answer = result.describe() if result.status is not None or not result.ok else result.detail
            out.write(f"{receiver_name} ({receiver.type}) {label}: {answer}\n")
            if not result.ok:
                code = EXIT_FAILED
                break
    return code


# ---------------------------------------------------------------- incidents


@dataclass(frozen=True, slots=True)
class IncidentView:
    id: uuid.UUID
    kind: str
    severity: str
    target: str
    model: str
    provider: str
    prompt: str
    location: str
    job: str | None
    opened_at: datetime
    resolved_at: datetime | None
    baseline_ms: float | None
    observed_ms: float | None
    ratio: float | None
    error: str | None
    opened_baseline_ms: float | None = None
    opened_observed_ms: float | None = None
    peak_ratio: float | None = None
    peak_at: datetime | None = None
    # Where the time went (monitor.detect.attribution), for regressions of runs with server metrics.
    cause: str | None = None
    attribution: str | None = None
    # Triage (monitor.triage): who acknowledged, the label, a manual resolve's author and note, and the
    # change markers from an hour before it began until it ended.
    triage: TriageRecord | None = None
    annotations: tuple[Annotation, ...] = ()
    # One page per outage: the group it was notified in, and how many incidents that group holds.
    group_id: uuid.UUID | None = None
    group_size: int = 0
    # What an slo_burn incident measured: bad share, windows, burn rate (monitor.detect.burn.describe).
    summary: str | None = None
    # Why a regression opened, in words and with the series' noise (monitor.detect.noise.describe).
    evidence: str | None = None

    @property
    def state(self) -> str:
        return "open" if self.resolved_at is None else "resolved"

    @property
    def figures(self) -> IncidentFigures:
        return figures_of(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "state": self.state,
            "kind": self.kind,
            "severity": self.severity,
            "target": self.target,
            "model": self.model,
            "provider": self.provider,
            "prompt": self.prompt,
            "location": self.location,
            "job": self.job,
            "opened_at": iso(self.opened_at, whole_seconds=True),
            "resolved_at": None if self.resolved_at is None else iso(self.resolved_at, whole_seconds=True),
            **self.figures.to_json(),
            "error_class": self.error,
            "group_id": None if self.group_id is None else str(self.group_id),
            "group_size": self.group_size,
            "cause": self.cause,
            "attribution": self.attribution,
            "summary": self.summary,
        } | _triage_json(self.triage, self.annotations)


async def list_incidents(engine: AsyncEngine, *, now: datetime, recent_days: float) -> list[IncidentView]:
    """Open incidents (newest first), then those resolved since `now - recent_days` (newest first)."""
    import sqlalchemy as sa

    from monitor.store.models import IncidentRow, SeriesRow
    from monitor.store.triage import ANNOTATION_WINDOW, TriageStore

    i = IncidentRow.__table__.c
    s = SeriesRow.__table__.c
    since = now - timedelta(days=recent_days)
    query = (
        sa.select(
            i.id,
            i.kind,
            i.severity,
            i.opened_at,
            i.resolved_at,
            i.baseline_ms,
            i.observed_ms,
            i.ratio,
            i.error,
            i.details,
            i.opened_baseline_ms,
            i.opened_observed_ms,
            i.peak_ratio,
            i.peak_at,
            i.group_id,
            s.target,
            s.model,
            s.provider,
            s.prompt,
            s.location,
        )
        .join(SeriesRow.__table__, s.id == i.series_id)
        .where(sa.or_(i.resolved_at.is_(None), i.resolved_at >= since))
        .order_by(i.resolved_at.is_not(None), i.opened_at.desc())
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
        triage = await TriageStore.records(connection, [row.id for row in rows])
        starts = {row.id: _began(row.details, row.opened_at) for row in rows}
        earliest = min(starts.values(), default=now) - ANNOTATION_WINDOW
        marks = await TriageStore.annotations_between(connection, earliest, now)
        groups = {row.group_id for row in rows if row.group_id is not None}
        sizes: dict[uuid.UUID, int] = {}
        if groups:
            count = sa.select(i.group_id, sa.func.count()).where(i.group_id.in_(groups)).group_by(i.group_id)
            sizes = {group: size for group, size in (await connection.execute(count)).all()}
    views = [
        IncidentView(
            id=row.id,
            kind=row.kind,
            severity=row.severity,
            target=row.target,
            model=row.model,
            provider=row.provider,
            prompt=row.prompt,
            location=row.location,
            job=_detail(row.details, "job"),
            cause=_detail(row.details, "cause"),
            attribution=_detail(row.details, "attribution"),
            summary=_detail(row.details, "summary"),
            evidence=_detail(row.details, "evidence"),
            opened_at=row.opened_at,
            resolved_at=row.resolved_at,
            baseline_ms=row.baseline_ms,
            observed_ms=row.observed_ms,
            ratio=row.ratio,
            error=row.error,
            opened_baseline_ms=row.opened_baseline_ms,
            opened_observed_ms=row.opened_observed_ms,
            peak_ratio=row.peak_ratio,
            peak_at=row.peak_at,
            group_id=row.group_id,
            group_size=sizes.get(row.group_id, 0) if row.group_id is not None else 0,
        )
        for row in rows
    ]
    return [_with_triage(view, triage.get(view.id), marks, starts[view.id], now) for view in views]


def _began(details: Any, opened_at: datetime) -> datetime:
    since = _detail(details, "since")
    try:
        return datetime.fromisoformat(since) if isinstance(since, str) else opened_at
    except ValueError:
        return opened_at


def _with_triage(
    view: IncidentView, record: TriageRecord | None, marks: list[Annotation], start: datetime, now: datetime
) -> IncidentView:
    from monitor.store.triage import related_annotations

    end = view.resolved_at or now
    related = tuple(related_annotations(marks, target=view.target, began=start, until=end))
    return replace(view, triage=record, annotations=related)


def _triage_json(record: TriageRecord | None, annotations: Sequence[Annotation]) -> dict[str, Any]:
    from monitor.web.payloads import triage_json

    return triage_json(record, annotations)


async def list_annotations(engine: AsyncEngine, *, now: datetime, recent_days: float) -> list[Annotation]:
    """Change markers of the last `recent_days` days, oldest first."""
    from monitor.store.triage import TriageStore

    async with engine.connect() as connection:
        return await TriageStore.annotations_between(connection, now - timedelta(days=recent_days), now)


def _detail(details: Any, name: str) -> Any:
    return details.get(name) if isinstance(details, dict) else None


def format_table(
    incidents: list[IncidentView], now: datetime, recent_days: float, annotations: Sequence[Annotation] = ()
) -> str:
    marks = _annotation_lines(annotations, recent_days)
    if not incidents:
        return f"no open incidents, and none resolved in the last {recent_days:g} days\n" + marks
    # Baseline and observed as at opening, and the peak: for a resolved incident the ratio at the
    # moment it cleared (1.05x, say) says nothing about how bad it was.
    header = ("STATE", "SEVERITY", "KIND", "SERIES", "OPENED", "FOR", "BASELINE", "OBSERVED", "PEAK", "ERROR", "ID")
    rows = []
    for item in incidents:
        end = item.resolved_at or now
        rows.append(
            (
                item.state,
                item.severity,
                item.kind,
                f"{item.target} / {item.prompt} @ {item.location}",
                item.opened_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
                fmt_duration((end - item.opened_at).total_seconds()),
                _ms(item.figures.opened_baseline_ms),
                _ms(item.figures.opened_observed_ms),
                _peak(item.figures),
                item.error or "-",
                str(item.id)[:8],
            )
        )
    laid_out = table_lines(header, rows)
    lines = laid_out[:1]
    for line, item in zip(laid_out[1:], incidents, strict=True):
        lines.append(line)
        if item.attribution:
            lines.append(f"  where: {item.attribution}")
        if item.summary:
            lines.append(f"  slo: {item.summary}")
        if item.evidence:
            lines.append(f"  evidence: {item.evidence}")
        if item.group_id is not None and item.group_size > 1:
            lines.append(f"  group: {str(item.group_id)[:8]}, notified as one with {item.group_size - 1} more")
        lines += _triage_lines(item)
    open_count = sum(1 for item in incidents if item.resolved_at is None)
    lines.append(f"{open_count} open, {len(incidents) - open_count} resolved in the last {recent_days:g} days")
    return "\n".join(lines) + "\n" + marks


def _triage_lines(item: IncidentView) -> list[str]:
    out = []
    record = item.triage
    if record is not None and record.acked_at is not None:
        out.append(f"  acked: by {record.acked_by or '?'} at {_hhmm(record.acked_at)}")
    if record is not None and record.resolved_by is not None:
        note = f": {record.note}" if record.note else ""
        out.append(f"  resolved by hand: by {record.resolved_by}{note}")
    if record is not None and record.label is not None:
        out.append(f"  label: {record.label}")
    if item.annotations:
        out.append(f"  change: {annotation_text([(m.text, m.at) for m in item.annotations])}")
    return out


def _hhmm(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def _annotation_lines(annotations: Sequence[Annotation], recent_days: float) -> str:
    if not annotations:
        return ""
    lines = [f"annotations in the last {recent_days:g} days:"]
    for item in annotations:
        scope = item.target or "all targets"
        by = f" (by {item.created_by})" if item.created_by else ""
        lines.append(f"  {_hhmm(item.at)}  {scope}: {item.text}{by}")
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return fmt_ms(value) if value is not None else "-"


def _peak(figures: IncidentFigures) -> str:
    if figures.peak_ratio is None:
        return "-"
    when = f" at {figures.peak_at.astimezone(UTC).strftime('%H:%M')}" if figures.peak_at is not None else ""
    return f"{fmt_ratio(figures.peak_ratio)}{when}"


async def _incidents(config: Config, output: str, recent_days: float, out: TextIO) -> int:
    from monitor.store.engine import create_engine
    from monitor.store.migrate import ensure_current

    engine = create_engine(config.database.url)
    try:
        await ensure_current(engine)
        now = datetime.now(UTC)
        incidents = await list_incidents(engine, now=now, recent_days=recent_days)
        annotations = await list_annotations(engine, now=now, recent_days=recent_days)
    finally:
        await engine.dispose()
    if output == "json":
        out.write(json.dumps([item.to_json() for item in incidents], indent=2) + "\n")
    else:
        out.write(format_table(incidents, now, recent_days, annotations))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run these commands on their own (`python -m monitor.alert.cli ...`), as `ttft-monitor` does."""
    parser = argparse.ArgumentParser(prog="ttft-monitor")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
