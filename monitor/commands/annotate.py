"""`ttft-monitor annotate TEXT [--target NAME]`: record a change marker (monitor.triage.service).

Exit codes: 0 recorded, 2 usage or config error (empty text, an unknown target), 3 the database failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TextIO

from monitor.commands.args import config_arg
from monitor.commands.incidents import by_arg, run_action
from monitor.exitcodes import EXIT_OK

if TYPE_CHECKING:
    from monitor.config.models import Config
    from monitor.triage.service import Triage

NAME = "annotate"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="what changed (at most 500 characters)")
    parser.add_argument("--target", "-t", help="the target it concerns (default: every target)")
    by_arg(parser)
    config_arg(parser)


def main(args: argparse.Namespace) -> int:
    from monitor.logging import configure_logging

    # stdout says what was done; log lines (warnings only) go to stderr.
    configure_logging(stream=sys.stderr, level=logging.WARNING)
    return run(args)


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    return run_action(
        args, stdout or sys.stdout, stderr or sys.stderr, command="ttft-monitor annotate", action_for=_action
    )


def _action(args: argparse.Namespace, config: Config, out: TextIO) -> Callable[[Triage], Awaitable[int]]:
    from monitor.triage.inputs import UsageProblem, plain, who

    text = plain(args.text, "the annotation text")
    if not text:
        raise UsageProblem('the annotation text is empty; say what changed, e.g. "vLLM upgraded"')
    if args.target is not None and args.target not in config.targets:
        known = ", ".join(sorted(config.targets)) or "none are defined"
        raise UsageProblem(f"--target: no target named '{args.target}' in the config (known: {known})")
    return lambda triage: _annotate(triage, text, args.target, who(args.by), out)


async def _annotate(triage: Triage, text: str, target: str | None, by: str, out: TextIO) -> int:
    item = await triage.annotate(text, target=target, by=by)
    scope = f"target {target}" if target else "every target"
    out.write(f"annotation '{item.text}' recorded at {item.at.isoformat(timespec='seconds')} for {scope}\n")
    return EXIT_OK
