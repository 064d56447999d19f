"""`ttft-monitor replay`: run the detector over a recorded history, or export the stored one.

Exit codes: 0 done, 2 usage, config or input error, 3 the database could not be read (`--export`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from monitor.commands.args import DEFAULT_CONFIG_ENV
from monitor.commands.common import load_config_or_explain, run_against_database
from monitor.exitcodes import EXIT_OK, EXIT_USAGE

NAME = "replay"
EXPORT_COMMAND = "ttft-monitor replay --export"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", metavar="FILE.csv", help="the history to replay")
    parser.add_argument(
        "--config",
        "-c",
        default=None,
        help="config whose `detection` rules (and targets' SLOs) to use; default rules without it. "
        f"With --export: its database (default: ${DEFAULT_CONFIG_ENV}, else ./config.yaml)",
    )
    parser.add_argument(
        "--export",
        nargs="?",
        const="-",
        metavar="FILE.csv",
        help="write every stored sample as a samples CSV to FILE.csv (default: standard output)",
    )
    parser.add_argument(
        "--groups",
        action="store_true",
        help="print the regression groups instead of the incidents (with --config: series grouped by their "
        "target's provider, as `alerts.grouping` says), each with its members and the notifications it would send",
    )


def main(args: argparse.Namespace) -> int:
    return run(args)


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    if args.export is not None and args.samples:
        err.write("ttft-monitor replay: give either --samples (replay a file) or --export (write one), not both\n")
        return EXIT_USAGE
    if args.export is not None:
        return export_main(args, out, err)
    if not args.samples:
        err.write(
            "ttft-monitor replay: give --samples FILE.csv to replay a history, or --export [FILE.csv] to write "
            "the stored one\n"
        )
        return EXIT_USAGE
    # Here, not at the top: every command's start (`once` in a CronJob included) registers `replay`,
    # and only `replay` needs the replay engine.
    from monitor.detect.replay import replay_main

    config = None
    if args.config:
        config = load_config_or_explain(args.config, err)
        if config is None:
            return EXIT_USAGE
    return replay_main(args.samples, config, show_groups=bool(args.groups), stdout=out, stderr=err)


def export_main(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """`ttft-monitor replay --export [FILE]`: the stored history of the config's database as a CSV."""
    config = load_config_or_explain(args.config, stderr)
    if config is None:
        return EXIT_USAGE
    url = config.database.url
    if args.export == "-":
        return _run_export(url, stdout, "standard output", stderr)
    try:
        with open(args.export, "w", encoding="utf-8", newline="") as stream:
            return _run_export(url, stream, args.export, stderr)
    except OSError as exc:
        stderr.write(f"ttft-monitor replay: cannot write {args.export}: {exc.strerror or exc}\n")
        return EXIT_USAGE


def _run_export(url: str, stream: TextIO, where: str, stderr: TextIO) -> int:
    return run_against_database(_export(url, stream, where, stderr), command=EXPORT_COMMAND, url=url, err=stderr)


async def _export(url: str, stream: TextIO, where: str, stderr: TextIO) -> int:
    from monitor.detect.export import export_samples
    from monitor.store.engine import create_engine
    from monitor.store.repository import Repository
    from monitor.store.schema import ensure_current

    engine = create_engine(url)
    try:
        await ensure_current(engine)  # a schema behind or missing names `db upgrade`, not a missing table
        count = await export_samples(Repository(engine), stream)
    finally:
        await engine.dispose()
    stderr.write(f"exported {count} samples to {where}\n")
    return EXIT_OK
