"""The `db` command line: argparse only, so building the CLI stays fast (no alembic import)."""

from __future__ import annotations

import argparse
from typing import Any

from monitor.cliargs import config_arg


def _config_arg(parser: argparse.ArgumentParser) -> None:
    config_arg(parser, note="; its database.url is used")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `db` and its actions to the CLI's subparsers; `run(args)` executes the parsed command."""
    db = subparsers.add_parser(
        "db",
        help="manage the database schema (migrations)",
        description="Create, migrate and inspect the database schema named by database.url in the config.",
    )
    actions = db.add_subparsers(dest="db_command", metavar="ACTION")
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
    return db
