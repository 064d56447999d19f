"""`ttft-monitor alert test --receiver NAME` and `alert new-secret`.

Exit codes. `alert new-secret`: 0. `alert test`: 0 the receiver accepted (2xx), 1 it did not (its answer is printed),
2 usage or config error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from monitor.commands.args import config_arg
from monitor.commands.common import load_config_or_explain
from monitor.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from monitor.config.models import Config

NAME = "alert"


def register(parser: argparse.ArgumentParser) -> None:
    """`alert`'s actions, `test` and `new-secret`; `run(args)` executes them."""
    actions = parser.add_subparsers(dest="alert_command", metavar="ACTION")
    actions.required = True
    test = actions.add_parser(
        "test",
        help="send a test notification to a receiver and print its answer (exit 0 if it accepted it)",
        description="Send a test notification through the real delivery path (same payload builder, "
        "signing and transport as the daemon) and print the receiver's answer. PagerDuty and "
        "Alertmanager get a resolve right after, so nothing is left open.",
    )
    test.add_argument("--receiver", "-r", required=True, help="receiver name under alerts.receivers")
    config_arg(test)
    actions.add_parser(
        "new-secret",
        help="print a new webhook signing secret (whsec_ + base64 of 32 random bytes)",
        description="Print a fresh Standard Webhooks signing secret for a webhook receiver's secret_env or "
        "secret_file; give the same value to the receiving side's Standard Webhooks library.",
    )


def main(args: argparse.Namespace) -> int:
    from monitor.logging import configure_logging

    configure_logging()
    return run(args)


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    if args.alert_command == "new-secret":
        from monitor.config.secrets import new_webhook_secret

        out.write(new_webhook_secret() + "\n")
        return EXIT_OK
    from monitor.alert.selftest import receiver_problems

    config = load_config_or_explain(args.config, err)
    if config is None:
        return EXIT_USAGE
    problems = receiver_problems(config, args.receiver)
    if problems:
        err.writelines(f"{line}\n" for line in problems)
        return EXIT_USAGE
    from monitor.logging import configure_logging

    # The answer goes to stdout; log lines (a `log` receiver's notification among them) to stderr.
    configure_logging(stream=err, level=logging.INFO)
    return asyncio.run(alert_test(config, args.receiver, out=out, err=err))


async def alert_test(config: Config, receiver_name: str, *, out: TextIO, err: TextIO) -> int:
    from monitor.alert.deliver import deliver
    from monitor.alert.receivers import KINDS
    from monitor.alert.selftest import receiver_problems, sample_notification
    from monitor.alert.transport import Transport
    from monitor.probe.proxy import ProxyEnvironment

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
