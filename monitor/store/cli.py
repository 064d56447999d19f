"""`ttft-monitor db upgrade|downgrade|current|check`: the schema, managed from the command line.

Exit codes: 0 done, 1 `check` found differences, 2 usage or config error (including an unknown
revision), 3 the database could not be reached or failed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TextIO

from monitor.cliargs import config_path
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.exitcodes import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_USAGE
from monitor.store import migrate
from monitor.store.engine import StoreError, describe_db_error, display_url


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    path = config_path(args.config)
    try:
        config = load_config(path)
    except ConfigError as exc:
        err.write(f"{exc}\n")
        return EXIT_USAGE
    url = config.database.url
    actions: dict[str, Callable[[], Coroutine[Any, Any, int]]] = {
        "upgrade": lambda: _upgrade(url, out, args.revision),
        "downgrade": lambda: _downgrade(url, out, args.revision),
        "current": lambda: _current(url, out),
        "check": lambda: _check(url, out),
    }
    try:
        return asyncio.run(actions[args.db_command]())
    except migrate.MigrationError as exc:
        err.write(f"ttft-monitor db {args.db_command}: {exc}\n")
        return EXIT_USAGE
    except StoreError as exc:  # DatabaseUnavailable and the rest: already one line
        err.write(f"ttft-monitor db {args.db_command}: {exc}\n")
        return EXIT_INFRA
    except Exception as exc:  # a database error we did not classify: one line, never a traceback
        err.write(f"ttft-monitor db {args.db_command}: {describe_db_error(exc, url)}\n")
        return EXIT_INFRA


def _name(revision: str | None) -> str:
    return revision if revision is not None else "(empty)"


async def _upgrade(url: str, out: TextIO, revision: str) -> int:
    before, after = await migrate.upgrade(url, revision)
    where = display_url(url)
    if before == after:
        out.write(f"{where}: schema already at {_name(after)}\n")
    else:
        out.write(f"{where}: schema upgraded from {_name(before)} to {_name(after)}\n")
    return EXIT_OK


async def _downgrade(url: str, out: TextIO, revision: str) -> int:
    before, after = await migrate.downgrade(url, revision)
    where = display_url(url)
    if before == after:
        out.write(f"{where}: schema already at {_name(after)}\n")
    else:
        out.write(f"{where}: schema downgraded from {_name(before)} to {_name(after)}\n")
    return EXIT_OK


async def _current(url: str, out: TextIO) -> int:
    revision = await migrate.current(url)
    problem = migrate.schema_problem(revision)
    state = "(head: up to date)" if problem is None else f"- {problem}"
    out.write(f"{display_url(url)}: {_name(revision)} {state}\n")
    return EXIT_OK


async def _check(url: str, out: TextIO) -> int:
    differences = await migrate.check(url)
    where = display_url(url)
    if not differences:
        out.write(f"{where}: the models match the migrations (schema at {migrate.head()})\n")
        return EXIT_OK
    out.write(f"{where}: the models and the migrations differ:\n")
    for line in differences:
        out.write(f"  {line}\n")
    out.write("write a migration for these (see docs/storage.md, 'Changing the schema')\n")
    return EXIT_FAILED
