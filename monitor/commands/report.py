"""`ttft-monitor report`: the comparison from the stored history as HTML, Markdown or JSON (monitor.web.report).

Exit codes: 0 written, 2 usage or config error (an unknown target, prompt or location among them), 3 the
database could not be read.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from monitor.commands.args import config_arg
from monitor.commands.common import load_config_or_explain, run_against_database
from monitor.exitcodes import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from monitor.web.queries import CompareDocument
    from monitor.web.report import ReportFilters

NAME = "report"


def register(parser: argparse.ArgumentParser) -> None:
    config_arg(parser)
    parser.add_argument("--since", default="7d", help="how far back, e.g. 24h, 7d, 30d (7d)")
    parser.add_argument("--until", help="end of the window, ISO 8601 with a zone (default: now)")
    parser.add_argument("--target", "-t", action="append", default=[], help="only this target (repeatable)")
    parser.add_argument("--prompt", action="append", default=[], help="only this prompt profile (repeatable)")
    parser.add_argument("--location", action="append", default=[], help="only this location (repeatable)")
    parser.add_argument("--format", "-f", choices=["html", "md", "json"], default="html", help="output (html)")
    parser.add_argument("--output", "-o", help="write to this file (default: standard output)")


def main(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from monitor.web.api import BadRequest, parse_duration, parse_time
    from monitor.web.report import ReportFilters, report_from_database

    try:
        since = parse_duration(args.since)
        until = parse_time(args.until, "until") if args.until else datetime.now(UTC)
    except BadRequest as exc:
        print(f"ttft-monitor report: --{exc}", file=sys.stderr)
        return EXIT_USAGE
    config = load_config_or_explain(args.config, sys.stderr)
    if config is None:
        return EXIT_USAGE
    filters = ReportFilters(targets=args.target, prompts=args.prompt, locations=args.location)

    async def read_and_write() -> int:
        data = await report_from_database(config.database.url, since=since, now=until, filters=filters, config=config)
        return _write(data, args, filters)

    return run_against_database(
        read_and_write(), command="ttft-monitor report", url=config.database.url, err=sys.stderr
    )


def _write(data: CompareDocument, args: argparse.Namespace, filters: ReportFilters) -> int:
    from monitor.web.report import render, unknown_filter

    miss = unknown_filter(data, filters)
    if miss is not None:
        stored = ", ".join(miss.stored) or "none yet"
        print(
            f"ttft-monitor report: --{miss.kind} {', '.join(miss.unknown)}: no stored series has this {miss.kind} "
            f"(stored: {stored})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    text = render(data, args.format, title=f"TTFT comparison, last {args.since}")
    if not args.output:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        print(f"ttft-monitor report: cannot write {args.output}: {exc.strerror}; choose another -o", file=sys.stderr)
        return EXIT_USAGE
    print(f"ttft-monitor report: wrote {args.output} ({len(data['cells'])} cells)", file=sys.stderr)
    return EXIT_OK
