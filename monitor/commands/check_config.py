"""`ttft-monitor check-config`: validate the config and show the jobs' next run times and what the schedule
costs (monitor.config.check, monitor.config.cost); with a database holding samples, the cost projection uses
the tokens actually seen per probe over the last HISTORY_DAYS days.

Exit codes: 0 valid, 2 config error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from monitor.commands.args import config_arg, config_path

if TYPE_CHECKING:
    from monitor.config.cost import Seen
    from monitor.config.models import Config

NAME = "check-config"
HISTORY_DAYS = 2  # the cold tier leaves 3 days as rows (config.models.COLD_FLOOR_DAYS)
# check-config is a quick check: a database that does not answer soon is reported, not waited for.
HISTORY_CONNECT_TIMEOUT_S = 3.0


def register(parser: argparse.ArgumentParser) -> None:
    config_arg(parser)
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="project costs from the schedule and max_tokens only, without reading the database",
    )


def main(args: argparse.Namespace) -> int:
    from monitor.config.check import check_config

    code, text = check_config(config_path(args.config), history=None if args.no_history else tokens_seen)
    (sys.stdout if code == 0 else sys.stderr).write(text.rstrip("\n") + "\n")
    return code


def tokens_seen(config: Config) -> tuple[Mapping[tuple[str, str], Seen], str]:
    """The tokens per probe the config's database holds, and a line saying where they came from. Never
    creates a database (an SQLite file that does not exist is left so) and never fails the check."""
    import asyncio

    from monitor.store.engine import create_engine, describe_db_error, sqlite_path
    from monitor.store.repository import Repository

    url = config.database.url
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return {}, f"history: none yet ({path} does not exist)"
    since = datetime.now(UTC) - timedelta(days=HISTORY_DAYS)

    async def read() -> Mapping[tuple[str, str], Seen]:
        engine = create_engine(url, connect_timeout_s=HISTORY_CONNECT_TIMEOUT_S)
        try:
            return await Repository(engine).tokens_seen(config.location, since)
        finally:
            await engine.dispose()

    try:
        seen = asyncio.run(read())
    except Exception as exc:
        return {}, f"history: not read ({describe_db_error(exc, url)})"
    samples = sum(s.samples for s in seen.values())
    return seen, f"history: {samples} samples of {len(seen)} target x prompt pairs over the last {HISTORY_DAYS} days"
