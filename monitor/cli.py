"""Command line: the registry of `ttft-monitor`'s commands (monitor/commands/, one module each).

Exit codes: 0 ok, 1 probes failed, 2 usage or config error, 3 infrastructure (monitor/exitcodes.py).
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol, cast

from monitor import __version__
from monitor.commands import (
    alert,
    annotate,
    check_config,
    db,
    demo,
    incidents,
    once,
    probe,
    replay,
    report,
    run,
    serve,
    sim,
)
from monitor.commands.args import OneLineErrorParser


class Command(Protocol):
    """What a module under monitor/commands/ provides."""

    NAME: str

    def register(self, subparsers: Any) -> object: ...

    def main(self, args: argparse.Namespace) -> int: ...


# In the order `ttft-monitor --help` lists them.
COMMANDS: tuple[ModuleType, ...] = (
    probe,
    sim,
    check_config,
    run,
    once,
    db,
    alert,
    incidents,
    annotate,
    replay,
    demo,
    serve,
    report,
)


def _commands() -> dict[str, Command]:
    return {module.NAME: cast(Command, module) for module in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="ttft-monitor",
        description="Measure and watch LLM endpoints' time to first token (TTFT).",
    )
    parser.add_argument("--version", action="version", version=f"ttft-monitor {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for command in _commands().values():
        command.register(subparsers)
    return parser


# The commands that measure import SQLAlchemy, pydantic and aiohttp before their first probe:
# hundreds of thousands of objects, none of them garbage, which the cyclic collector would walk again
# and again while they load (about 100 ms of a 1.4 s `once` start here). For these it stays off until
# `app.freeze_heap` collects once, freezes what start-up built and turns it back on.
MEASURING_COMMANDS = frozenset({"run", "once", "probe"})


def main(argv: Sequence[str] | None = None) -> int:
    gc.disable()
    try:
        args = build_parser().parse_args(argv)
        if args.command not in MEASURING_COMMANDS:
            gc.enable()
        return _commands()[args.command].main(args)
    except KeyboardInterrupt:
        return 130
    finally:
        gc.enable()  # also when a measuring command ended before freeze_heap (a config error, say)
