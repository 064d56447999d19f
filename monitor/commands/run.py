"""`ttft-monitor run`: the daemon (monitor.daemon). Exit codes: see docs/operations.md."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from monitor.commands.args import config_arg, config_path

NAME = "run"


def register(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="the daemon: run the config's jobs on their schedules",
        description="Run every job on its cron schedule, store the samples, serve /metrics, /healthz and "
        "/readyz. SIGTERM/SIGINT stop it gracefully; SIGHUP reloads the config (a bad file is rejected).",
    )
    config_arg(run)


def main(args: argparse.Namespace) -> int:
    from monitor.daemon import run_daemon
    from monitor.logging import configure_logging

    redactor = configure_logging()
    return asyncio.run(run_daemon(config_path(args.config), redactor=redactor))
