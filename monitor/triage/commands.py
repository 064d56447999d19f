"""`incidents ack|resolve|label|stats` and `annotate`: argparse only, so building the CLI stays fast."""

from __future__ import annotations

import argparse
from typing import Any

from monitor.cliargs import config_arg, non_negative
from monitor.triage.stats import LABELS

# A century: more reaches before year 1, which datetime cannot hold (it failed as a "database" error).
_days = non_negative("days", maximum=36500)


def _by(parser: argparse.ArgumentParser) -> None:
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
    _by(ack)
    _action_config(ack)
    resolve = actions.add_parser(
        "resolve",
        help="resolve an open incident by hand and send its resolve notification",
        description="Close the incident now, store the note, make the detector forget it (a regression that "
        "persists opens a new incident) and enqueue the resolve notification for the running daemon to send.",
    )
    resolve.add_argument("id", help="incident id, or its first characters")
    resolve.add_argument("--note", help="why it is resolved; stored and sent with the notification")
    _by(resolve)
    _action_config(resolve)
    label = actions.add_parser(
        "label",
        help="label an incident true-positive, false-positive or expected (for `incidents stats`)",
        description="Say whether the incident was real: true-positive, false-positive, or expected (a planned "
        "change the detector rightly saw). A new label replaces the old one.",
    )
    label.add_argument("id", help="incident id, or its first characters")
    label.add_argument("label", choices=LABELS, help="|".join(LABELS))
    _by(label)
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


def register(subparsers: Any) -> None:
    """`annotate` (the `incidents` actions are added by monitor.alert.commands)."""
    annotate = subparsers.add_parser(
        "annotate",
        help='record a change marker, e.g. annotate "vLLM upgraded" --target qwen3-8b',
        description="Store a change marker with the time and an optional target. `incidents` lists markers, "
        "and a notification of an incident that began within an hour after a matching marker names it.",
    )
    annotate.add_argument("text", help="what changed (at most 500 characters)")
    annotate.add_argument("--target", "-t", help="the target it concerns (default: every target)")
    _by(annotate)
    config_arg(annotate)
