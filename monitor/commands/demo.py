"""`ttft-monitor demo`: the simulator and the real daemon, with a regression that opens and resolves
(monitor.demo)."""

from __future__ import annotations

import argparse

from monitor.commands.args import non_negative

NAME = "demo"

_seconds = non_negative("seconds")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default="state/demo", help="where the demo keeps its database (state/demo)")
    parser.add_argument(
        "--slow-after",
        type=_seconds,
        default=60,
        help="seconds from the first probe to the slowdown (60; it waits for 12 runs of history)",
    )
    parser.add_argument(
        "--recover-after",
        type=_seconds,
        default=150,
        help="seconds from the first probe to the recovery (150; at least as long slowed as these two ask)",
    )
    parser.add_argument(
        "--duration", type=_seconds, default=None, help="stop after this many seconds (default: Ctrl-C)"
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from monitor.demo import run_demo

    return run_demo(
        state_dir=Path(args.state_dir),
        slow_after_s=args.slow_after,
        recover_after_s=args.recover_after,
        duration_s=args.duration,
    )
