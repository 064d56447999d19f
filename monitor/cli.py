"""Command line: the registry of `ttft-monitor`'s commands (monitor/commands/, one module each).

Exit codes: 0 ok, 1 probes failed, 2 usage or config error, 3 infrastructure (monitor/exitcodes.py).
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, cast

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

    def register(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True, slots=True)
class Listing:
    """A command as `ttft-monitor --help` lists it (`help`) and as its own `--help` opens (`description`);
    its module adds the options (`register`) and runs it (`main`)."""

    module: ModuleType
    help: str
    description: str | None = None


# In the order `ttft-monitor --help` lists them.
COMMANDS: tuple[Listing, ...] = (
    Listing(
        probe,
        help="measure TTFT now, ad hoc (no database needed)",
        description="Stream requests to targets from the config, or to one endpoint given by --url, and "
        "print TTFT and the phases around it.",
    ),
    Listing(
        sim,
        help="serve the built-in LLM API simulator",
        description="Serve /v1/chat/completions, /v1/completions, /v1/messages and /v1/models with "
        "realistic latency, a prefix cache and faults on demand (control API under /sim/).",
    ),
    Listing(check_config, help="validate the config and show the jobs' next run times"),
    Listing(
        run,
        help="the daemon: run the config's jobs on their schedules",
        description="Run every job on its cron schedule, store the samples, serve /metrics, /healthz and "
        "/readyz. SIGTERM/SIGINT stop it gracefully; SIGHUP reloads the config (a bad file is rejected).",
    ),
    Listing(
        once,
        help="run the job(s) once, store, push metrics, exit (Kubernetes CronJob)",
        description="Exit status: 0 done, 1 every probe failed, 2 config error, 3 database or spool trouble, "
        "4 stopped by SIGTERM/SIGINT (what was measured is stored or spooled), "
        "5 the Pushgateway refused the metrics or could not be reached.",
    ),
    Listing(
        db,
        help="manage the database schema (migrations)",
        description="Create, migrate and inspect the database schema named by database.url in the config.",
    ),
    Listing(
        alert,
        help="alert receivers: send a test notification, make a webhook secret",
        description="Work with the receivers under alerts.receivers in the config.",
    ),
    Listing(
        incidents,
        help="list open and recently resolved incidents; ack, resolve, label them; stats",
        description="List the incidents in the database: open ones first, then those resolved within --days.",
    ),
    Listing(
        annotate,
        help='record a change marker, e.g. annotate "vLLM upgraded" --target qwen3-8b',
        description="Store a change marker with the time and an optional target. `incidents` lists markers, "
        "and a notification of an incident that began within an hour after a matching marker names it.",
    ),
    Listing(
        replay,
        help="replay a recorded history through the detector, or export the stored one",
        description="Print the incidents the detector would have raised over a samples CSV (columns "
        "timestamp, series, ttft_ms, optional error and run_id), one JSON object per line. With --export, "
        "write the stored history in that format instead, to tune the detection rules on your own data.",
    ),
    Listing(
        demo,
        help="the simulator and the real daemon, with a regression that opens and resolves (start here)",
        description="Starts the simulator and `ttft-monitor run` on SQLite in a state directory, probes three "
        "simulated models every 5 s with a short and a long prompt, prints a live table, makes one model slower "
        "after a minute so a regression incident opens (the log receiver prints it) and resolves. Ctrl-C stops.",
    ),
    Listing(
        serve,
        help="serve the status pages and JSON API alone, read-only (no probing)",
        description="Serve the status pages (overview, series, compare, incidents) and /api/v1/ from the config's "
        "database, read-only, with /healthz and /readyz. `run` serves the same pages on metrics.listen.",
    ),
    Listing(
        report,
        help="the comparison of targets and prompt sizes from the stored history, as HTML, Markdown or JSON",
        description="TTFT median, p90, n and 95% bootstrap interval per target and prompt, pairwise differences "
        "and prefill slopes: the numbers of the compare page. HTML is one self-contained file that opens offline.",
    ),
)


def _commands() -> dict[str, Command]:
    return {listing.module.NAME: cast(Command, listing.module) for listing in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="ttft-monitor",
        description="Measure and watch LLM endpoints' time to first token (TTFT).",
    )
    parser.add_argument("--version", action="version", version=f"ttft-monitor {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for listing in COMMANDS:
        command = cast(Command, listing.module)
        command.register(subparsers.add_parser(command.NAME, help=listing.help, description=listing.description))
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
