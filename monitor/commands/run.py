"""`ttft-monitor run`: the daemon (monitor.daemon). Exit codes: see docs/operations.md."""

from __future__ import annotations

import argparse
import asyncio

from monitor.commands.args import config_arg, config_path

NAME = "run"


def register(parser: argparse.ArgumentParser) -> None:
    config_arg(parser)


def main(args: argparse.Namespace) -> int:
    from monitor.daemon import run_daemon
    from monitor.logging import configure_logging

    redactor = configure_logging()
    return asyncio.run(run_daemon(config_path(args.config), redactor=redactor))
