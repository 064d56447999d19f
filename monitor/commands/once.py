"""`ttft-monitor once`: the daemon in burst mode for a Kubernetes CronJob (monitor.daemon); the exit
status is in the command's description."""

from __future__ import annotations

import argparse
import asyncio

from monitor.commands.args import config_arg, config_path

NAME = "once"


def register(parser: argparse.ArgumentParser) -> None:
    config_arg(parser)
    parser.add_argument("--job", action="append", default=[], help="only this job (repeatable); default: all")


def main(args: argparse.Namespace) -> int:
    from monitor.daemon import run_once
    from monitor.logging import configure_logging

    redactor = configure_logging()
    return asyncio.run(run_once(config_path(args.config), job_names=args.job, redactor=redactor))
