"""`ttft-monitor check-config`: validate the config and show the jobs' next run times (monitor.config.check).

Exit codes: 0 valid, 2 config error."""

from __future__ import annotations

import argparse
import sys

from monitor.commands.args import config_arg, config_path

NAME = "check-config"


def register(parser: argparse.ArgumentParser) -> None:
    config_arg(parser)


def main(args: argparse.Namespace) -> int:
    from monitor.config.check import check_config

    code, text = check_config(config_path(args.config))
    (sys.stdout if code == 0 else sys.stderr).write(text.rstrip("\n") + "\n")
    return code
