"""`ttft-monitor db upgrade|downgrade|current|check|housekeep`: the schema, managed from the command line,
and one pass of the daemon's housekeeping for deployments without a daemon (a CronJob of `once`).

Exit codes: 0 done, 1 `check` found differences, 2 usage or config error (including an unknown
revision), 3 the database could not be reached or failed.

Building the parser imports argparse only (alembic is imported when a `db` action runs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TextIO

from monitor.commands.args import config_arg
from monitor.commands.common import load_config_or_explain, run_against_database
from monitor.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from monitor.config.models import ColdPolicy, Database

NAME = "db"


def _config_arg(parser: argparse.ArgumentParser) -> None:
    config_arg(parser, note="; its database.url is used")


def register(parser: argparse.ArgumentParser) -> None:
    """`db`'s actions; `run(args)` executes the parsed command."""
    actions = parser.add_subparsers(dest="db_command", metavar="ACTION")
    actions.required = True
    upgrade = actions.add_parser(
        "upgrade", help="migrate the schema up to REV (default: head, what this version needs)"
    )
    upgrade.add_argument("revision", nargs="?", default="head", metavar="REV")
    _config_arg(upgrade)
    downgrade = actions.add_parser("downgrade", help="migrate the schema down to REV (`base` drops every table)")
    downgrade.add_argument("revision", metavar="REV")
    _config_arg(downgrade)
    current = actions.add_parser("current", help="show the schema revision and whether it is current")
    _config_arg(current)
    check = actions.add_parser("check", help="compare the models with the migrated schema; exit 1 when they differ")
    _config_arg(check)
    housekeep = actions.add_parser(
        "housekeep",
        help="one pass of the daemon's housekeeping: partitions, statistics, hourly rollups, the overview's "
        "summary, retention (for a CronJob-only deployment: run it hourly)",
    )
    _config_arg(housekeep)


def main(args: argparse.Namespace) -> int:
    return run(args)


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    from monitor.store import migrate

    out = stdout or sys.stdout
    err = stderr or sys.stderr
    config = load_config_or_explain(args.config, err)
    if config is None:
        return EXIT_USAGE
    url = config.database.url
    actions: dict[str, Callable[[], Coroutine[Any, Any, int]]] = {
        "upgrade": lambda: _migrate(migrate.upgrade, "upgraded", url, out, args.revision),
        "downgrade": lambda: _migrate(migrate.downgrade, "downgraded", url, out, args.revision),
        "current": lambda: _current(url, out),
        "check": lambda: _check(url, out),
        "housekeep": lambda: _housekeep(config.database, out, cold=config.cold_policy()),
    }
    return run_against_database(
        actions[args.db_command](),
        command=f"ttft-monitor db {args.db_command}",
        url=url,
        err=err,
        usage_errors=(migrate.MigrationError,),
    )


def _name(revision: str | None) -> str:
    return revision if revision is not None else "(empty)"


async def _migrate(
    step: Callable[[str, str], Awaitable[tuple[str | None, str | None]]],
    verb: str,
    url: str,
    out: TextIO,
    revision: str,
) -> int:
    """`step` is migrate.upgrade or migrate.downgrade; `verb` says which in the answer."""
    from monitor.store.engine import display_url

    before, after = await step(url, revision)
    where = display_url(url)
    if before == after:
        out.write(f"{where}: schema already at {_name(after)}\n")
    else:
        out.write(f"{where}: schema {verb} from {_name(before)} to {_name(after)}\n")
    return EXIT_OK


async def _current(url: str, out: TextIO) -> int:
    from monitor.store import migrate
    from monitor.store.engine import display_url

    revision = await migrate.current(url)
    problem = migrate.schema_problem(revision)
    state = "(head: up to date)" if problem is None else f"- {problem}"
    out.write(f"{display_url(url)}: {_name(revision)} {state}\n")
    return EXIT_OK


async def _check(url: str, out: TextIO) -> int:
    from monitor.store import migrate
    from monitor.store.engine import display_url

    differences = await migrate.check(url)
    where = display_url(url)
    if not differences:
        out.write(f"{where}: the models match the migrations (schema at {migrate.head()})\n")
        return EXIT_OK
    if len(differences) == 1 and differences[0].startswith(migrate.NOT_AT_HEAD):
        out.write(f"{where}: {differences[0]}\n")  # names `db upgrade`; no migration to write
        return EXIT_FAILED
    out.write(f"{where}: the models and the migrations differ:\n")
    for line in differences:
        out.write(f"  {line}\n")
    out.write("write a migration for these (see docs/storage.md, 'Changing the schema')\n")
    return EXIT_FAILED


async def _housekeep(database: Database, out: TextIO, *, cold: ColdPolicy | None) -> int:
    """What the daemon does each hour (`maintain_once`), once, on the config's database and retention."""
    from monitor.schedule.maintenance import maintain_once
    from monitor.store import migrate
    from monitor.store.engine import create_engine, display_url
    from monitor.store.repository import Repository

    engine = create_engine(database.url)
    try:
        await migrate.ensure_current(engine)  # a schema behind head: `db upgrade` first, nothing touched
        counts = await maintain_once(Repository(engine), database, cold=cold)
    finally:
        await engine.dispose()
    done = ", ".join(f"{name.replace('_', ' ')} {count:,}" for name, count in counts.items())
    out.write(f"{display_url(database.url)}: housekept: {done}\n")
    return EXIT_OK
