"""`ttft-monitor once`: the daemon in burst mode for a Kubernetes CronJob (monitor.daemon); the exit
status is in the command's description."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from monitor.commands.args import config_arg, config_path

NAME = "once"


def register(commands: Any) -> None:
    once = commands.add_parser(
        "once",
        help="run the job(s) once, store, push metrics, exit (Kubernetes CronJob)",
        description=(
            "Exit status: 0 done, 1 every probe failed, 2 config error, 3 database or spool trouble, "
            "4 stopped by SIGTERM/SIGINT (what was measured is stored or spooled), "
            "5 the Pushgateway refused the metrics or could not be reached."
        ),
    )
    config_arg(once)
    once.add_argument("--job", action="append", default=[], help="only this job (repeatable); default: all")


def main(args: argparse.Namespace) -> int:
    from monitor.daemon import run_once
    from monitor.logging import configure_logging

    redactor = configure_logging()
    return asyncio.run(run_once(config_path(args.config), job_names=args.job, redactor=redactor))
