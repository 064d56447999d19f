"""The `alert` and `incidents` command lines: argparse only, so building the CLI stays fast."""

from __future__ import annotations

from typing import Any

from monitor.cliargs import config_arg, non_negative

DEFAULT_RECENT_DAYS = 7.0


_config_arg = config_arg
_days = non_negative("days")


def register(subparsers: Any) -> None:
    """Add `alert` (with `test`) and `incidents` to the CLI's subparsers; `run(args)` executes them."""
    alert = subparsers.add_parser(
        "alert",
        help="alert receivers: send a test notification, make a webhook secret",
        description="Work with the receivers under alerts.receivers in the config.",
    )
    actions = alert.add_subparsers(dest="alert_command", metavar="ACTION")
    actions.required = True
    test = actions.add_parser(
        "test",
        help="send a test notification to a receiver and print its answer (exit 0 if it accepted it)",
        description="Send a test notification through the real delivery path (same payload builder, "
        "signing and transport as the daemon) and print the receiver's answer. PagerDuty and "
        "Alertmanager get a resolve right after, so nothing is left open.",
    )
    test.add_argument("--receiver", "-r", required=True, help="receiver name under alerts.receivers")
    _config_arg(test)
    actions.add_parser(
        "new-secret",
        help="print a new webhook signing secret (whsec_ + base64 of 32 random bytes)",
        description="Print a fresh Standard Webhooks signing secret for a webhook receiver's secret_env or "
        "secret_file; give the same value to the receiving side's Standard Webhooks library.",
    )

    incidents = subparsers.add_parser(
        "incidents",
        help="list open and recently resolved incidents; ack, resolve, label them; stats",
        description="List the incidents in the database: open ones first, then those resolved within --days.",
    )
    incidents.add_argument("--format", "-f", choices=["table", "json"], default="table", help="output (table)")
    incidents.add_argument(
        "--days",
        type=_days,
        default=DEFAULT_RECENT_DAYS,
        help=f"also list incidents resolved in the last DAYS days (default {DEFAULT_RECENT_DAYS:g})",
    )
    _config_arg(incidents)
    from monitor.triage.commands import register_incident_actions

    register_incident_actions(incidents)
