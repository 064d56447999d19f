"""`ttft-monitor incidents [--format table|json]` lists incidents; `incidents ack|resolve|label|stats` triage
them (monitor.triage.service).

Exit codes. The list: 0 listed, 2 config error, 3 the database failed. The actions: 0 done (acknowledging an
acknowledged incident too: the first acknowledgement is kept); 1 refused by the incident's state (acknowledging or
resolving a resolved incident); 2 usage or config error (an unknown or ambiguous id, an unknown target, empty
text); 3 the database failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from monitor.commands.args import config_arg, non_negative
from monitor.commands.common import load_config_or_explain, run_against_database
from monitor.exitcodes import EXIT_OK, EXIT_USAGE
from monitor.table import table_lines
from monitor.triage.stats import LABELS

if TYPE_CHECKING:
    from monitor.config.models import Config
    from monitor.detect.figures import IncidentFigures
    from monitor.store.triage import Annotation
    from monitor.triage.service import Triage
    from monitor.web.incidents import IncidentView

NAME = "incidents"
DEFAULT_RECENT_DAYS = 7.0

_recent_days = non_negative("days")
# A century: more reaches before year 1, which datetime cannot hold (it failed as a "database" error).
_days = non_negative("days", maximum=36500)


def register(parser: argparse.ArgumentParser) -> None:
    """`incidents`' options and actions; without an action, `incidents` lists them."""
    parser.add_argument("--format", "-f", choices=["table", "json"], default="table", help="output (table)")
    parser.add_argument(
        "--days",
        type=_recent_days,
        default=DEFAULT_RECENT_DAYS,
        help=f"also list incidents resolved in the last DAYS days (default {DEFAULT_RECENT_DAYS:g})",
    )
    config_arg(parser)
    register_incident_actions(parser)


def by_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--by", help="who is acting, recorded with the change (default: $USER)")


def _action_config(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: without --config here, `incidents --config X ack ID` keeps the X given before the action.
    parser.add_argument(
        "--config", "-c", default=argparse.SUPPRESS, help="config file (default: $TTFT_CONFIG, else ./config.yaml)"
    )


def register_incident_actions(incidents: argparse.ArgumentParser) -> None:
    """The actions under `incidents`; without one, `incidents` lists them as before."""
    actions = incidents.add_subparsers(dest="incidents_command", metavar="ACTION")
    ack = actions.add_parser(
        "ack",
        help="acknowledge an open incident: reminders and escalations stop, its resolve is still sent",
        description="Record who acknowledged the incident and when. Reminders (renotify) stop and a severity "
        "change is recorded but not sent; the resolve notification still goes out. Exit 1 if it is resolved.",
    )
    ack.add_argument("id", help="incident id, or its first characters as `incidents` shows them")
    by_arg(ack)
    _action_config(ack)
    resolve = actions.add_parser(
        "resolve",
        help="resolve an open incident by hand and send its resolve notification",
        description="Close the incident now, store the note, make the detector forget it (a regression that "
        "persists opens a new incident) and enqueue the resolve notification for the running daemon to send.",
    )
    resolve.add_argument("id", help="incident id, or its first characters")
    resolve.add_argument("--note", help="why it is resolved; stored and sent with the notification")
    by_arg(resolve)
    _action_config(resolve)
    label = actions.add_parser(
        "label",
        help="label an incident true-positive, false-positive or expected (for `incidents stats`)",
        description="Say whether the incident was real: true-positive, false-positive, or expected (a planned "
        "change the detector rightly saw). A new label replaces the old one.",
    )
    label.add_argument("id", help="incident id, or its first characters")
    label.add_argument("label", choices=LABELS, help="|".join(LABELS))
    by_arg(label)
    _action_config(label)
    stats = actions.add_parser(
        "stats",
        help="precision per kind and severity from the labels",
        description="true-positive / (true-positive + false-positive) per kind and severity, with the counts "
        "of expected and unlabelled incidents.",
    )
    stats.add_argument("--days", type=_days, help="only incidents opened in the last DAYS days (default: all)")
    stats.add_argument("--format", "-f", choices=["table", "json"], default="table", help="output (table)")
    _action_config(stats)


def main(args: argparse.Namespace) -> int:
    from monitor.logging import configure_logging

    if args.incidents_command is None:
        # stdout is the list (a table, or JSON a script parses): log lines go to stderr.
        configure_logging(stream=sys.stderr)
    else:
        # stdout says what was done; the outbox's log lines (warnings only) go to stderr.
        configure_logging(stream=sys.stderr, level=logging.WARNING)
    return run(args)


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    action = getattr(args, "incidents_command", None)
    if action is not None:
        return run_action(args, out, err, command=f"ttft-monitor incidents {action}", action_for=_action)
    config = load_config_or_explain(args.config, err)
    if config is None:
        return EXIT_USAGE
    # SQLAlchemy is imported only here (inside run_against_database): the parser starts faster without it.
    return run_against_database(
        _incidents(config, args.format, args.days, out),
        command="ttft-monitor incidents",
        url=config.database.url,
        err=err,
    )


def format_table(
    incidents: list[IncidentView], now: datetime, recent_days: float, annotations: Sequence[Annotation] = ()
) -> str:
    from monitor.alert.text import fmt_duration

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
    from monitor.alert.text import annotation_text

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
    from monitor.alert.text import fmt_ms

    return fmt_ms(value) if value is not None else "-"


def _peak(figures: IncidentFigures) -> str:
    from monitor.alert.text import fmt_ratio

    if figures.peak_ratio is None:
        return "-"
    when = f" at {figures.peak_at.astimezone(UTC).strftime('%H:%M')}" if figures.peak_at is not None else ""
    return f"{fmt_ratio(figures.peak_ratio)}{when}"


async def _incidents(config: Config, output: str, recent_days: float, out: TextIO) -> int:
    from monitor.store.engine import create_engine
    from monitor.store.migrate import ensure_current
    from monitor.web.incidents import list_annotations, list_incidents

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


# ---------------------------------------------------------------- ack, resolve, label, stats


def run_action(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    *,
    command: str,
    action_for: Callable[[argparse.Namespace, Config, TextIO], Callable[[Triage], Awaitable[int]]],
) -> int:
    """A triage command (an action of `incidents`, or `annotate`): `action_for` makes the checks that need no
    database (UsageProblem: one line and EXIT_USAGE) and returns what to run against it."""
    from monitor.store.triage import IncidentLookupError
    from monitor.triage.inputs import UsageProblem
    from monitor.triage.service import TriageRefused

    config = load_config_or_explain(getattr(args, "config", None), err)
    if config is None:
        return EXIT_USAGE
    try:
        action = action_for(args, config, out)
    except UsageProblem as exc:
        err.write(f"{command}: {exc}\n")
        return EXIT_USAGE
    return run_against_database(
        _with_engine(config, action),
        command=command,
        url=config.database.url,
        err=err,
        usage_errors=(IncidentLookupError,),
        refusals=(TriageRefused,),
    )


async def _with_engine(config: Config, action: Callable[[Triage], Awaitable[int]]) -> int:
    from monitor.store.engine import create_engine
    from monitor.store.migrate import ensure_current
    from monitor.triage.service import Triage

    engine = create_engine(config.database.url)
    try:
        await ensure_current(engine)
        return await action(Triage(engine, config))
    finally:
        await engine.dispose()


def _action(args: argparse.Namespace, config: Config, out: TextIO) -> Callable[[Triage], Awaitable[int]]:
    """The coroutine to run against the database, after the checks that need none."""
    from monitor.triage.inputs import plain, who

    action = args.incidents_command
    if action == "stats":
        return lambda triage: _stats(triage, args.days, args.format, out)
    by = who(args.by)
    if action == "ack":
        return lambda triage: _ack(triage, args.id, by, out)
    if action == "label":
        return lambda triage: _label(triage, args.id, args.label, by, out)
    note = plain(args.note, "--note") if args.note else None
    return lambda triage: _resolve(triage, args.id, note, by, out)


async def _ack(triage: Triage, given: str, by: str, out: TextIO) -> int:
    from monitor.triage.service import describe

    done = await triage.ack(given, by=by)
    if done.already:
        at = done.facts.acked_at.isoformat(timespec="seconds") if done.facts.acked_at else "?"
        out.write(f"incident {describe(done.facts)} was already acknowledged by {done.facts.acked_by} at {at}\n")
    else:
        out.write(
            f"acknowledged incident {describe(done.facts)} as {by}: no reminders or escalations will be sent; "
            "its resolve will\n"
        )
    return EXIT_OK


async def _label(triage: Triage, given: str, label: str, by: str, out: TextIO) -> int:
    from monitor.triage.service import describe

    facts = await triage.label(given, label, by=by)
    before = f" (was {facts.label})" if facts.label and facts.label != label else ""
    out.write(f"labelled incident {describe(facts)} {label}{before}\n")
    return EXIT_OK


async def _resolve(triage: Triage, given: str, note: str | None, by: str, out: TextIO) -> int:
    from monitor.triage.service import describe

    done = await triage.resolve(given, by=by, note=note)
    queued = sorted(item.receiver for item in done.enqueued if item.status == "pending")
    held = sorted(f"{item.receiver} ({item.reason})" for item in done.enqueued if item.status != "pending")
    if done.facts.group_id is not None and done.group_open:
        group = str(done.facts.group_id)[:8]
        told = (
            f"its group {group} (one page) stays open while {done.group_open} other member(s) are: "
            "resolve them too to close the page"
        )
    elif queued:
        told = f"resolve notification queued for {', '.join(queued)} (the running daemon sends it)"
    else:
        told = "no receiver takes its resolve notification"
    if held:
        told += f"; held back: {', '.join(held)}"
    out.write(f"resolved incident {describe(done.facts)} as {by}; {told}\n")
    return EXIT_OK


async def _stats(triage: Triage, days: float | None, output: str, out: TextIO) -> int:
    from monitor.triage.stats import format_alert_rate, format_precision

    rows = await triage.stats(days=days)
    if output == "json":
        out.write(json.dumps([row.to_json() for row in rows], indent=2) + "\n")
    else:
        out.write(format_precision(rows))
        if rows:
            out.write(format_alert_rate(await triage.alert_rate(days=days)))
    return EXIT_OK
