"""PostgreSQL: `runs` and `samples` partitioned by the UTC day of their run's scheduled tick.

Each day is one partition of each table (`runs_p20261206`, `samples_p20261206`), so retention drops a
day of raw history as two tables instead of deleting millions of rows (no dead tuples, no vacuum
debt), and the partitions being written stay small. The partition key is `intended_at`: it is in the
one-run-per-tick unique key (series, job, intended_at), so two replicas' runs of one tick always meet
in one partition; a sample stores its run's `intended_at` (records: `_sample_row`), so a run and its
samples share a day. What falls outside every day (history older than the partitions, a clock far
ahead) lands in the `_default` partitions and is pruned row by row as before.

Housekeeping creates the days ahead (`AHEAD_DAYS`) before they are written; a day that was written
into the default partitions meanwhile (a daemon stopped for longer than that) gets its rows moved
into the new day's partition as it is attached. SQLite keeps one table each: nothing here runs there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

PARTITIONED = ("runs", "samples")
PARTITION_KEY = "intended_at"
AHEAD_DAYS = 7  # created ahead of the clock: a week of housekeeping that never ran before rows go astray
# A drop waits at most this long for the tables' lock (a long read holds it); else the next pass retries.
DROP_LOCK_TIMEOUT = "2s"
PARTITION_LOCK_KEY = 0x7474_6670  # "ttfp": held while a day's partitions are made or dropped
# A partition whose statistics are older than this share of its rows (and STALE_ROWS rows) is analyzed by
# housekeeping: autovacuum analyzes at 10% and 50 rows, when it gets there, and PostgreSQL never
# analyzes the partitioned parents.
STALE_SHARE = 0.2
STALE_ROWS = 10_000
_DAY = re.compile(r"^(runs|samples)_p(\d{8})$")
_ANY = re.compile(r"^(runs|samples)_(p\d{8}|default)$")


def is_partition(name: str) -> bool:
    """Whether a table is one of the partitions (the schema's models know only their parents)."""
    return _ANY.match(name) is not None


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def day_of(name: str) -> date | None:
    """The day a partition holds, from its name; None for the default partition and other tables."""
    found = _DAY.match(name)
    return datetime.strptime(found.group(2), "%Y%m%d").date() if found else None


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def days_around(now: datetime, ahead: int = AHEAD_DAYS) -> list[date]:
    """The days housekeeping keeps partitions for: yesterday (a run scheduled before midnight, stored
    after) to `ahead` days after today, UTC."""
    today = now.astimezone(UTC).date()
    return [today + timedelta(days=offset) for offset in range(-1, ahead + 1)]


def _literal(moment: datetime) -> str:
    # Partition bounds are DDL: no bind parameters. The value is a datetime we made, not input.
    return f"'{moment.astimezone(UTC).isoformat()}'"


def create_parent_sql(table: str, columns_from: str) -> str:
    """A partitioned table with the columns (and defaults) of `columns_from`."""
    return f"CREATE TABLE {table} (LIKE {columns_from} INCLUDING DEFAULTS) PARTITION BY RANGE ({PARTITION_KEY})"


def create_default_sql(table: str) -> str:
    return f"CREATE TABLE IF NOT EXISTS {default_name(table)} PARTITION OF {table} DEFAULT"


def create_day_sql(table: str, day: date, *, parent: str | None = None) -> str:
    """A day's partition of an empty-for-that-day parent (the migration's; housekeeping moves rows)."""
    start, end = day_bounds(day)
    return (
        f"CREATE TABLE IF NOT EXISTS {partition_name(table, day)} PARTITION OF {parent or table} "
        f"FOR VALUES FROM ({_literal(start)}) TO ({_literal(end)})"
    )


def attach_day_sql(table: str, day: date) -> list[str]:
    """Statements (one transaction) that add a day's partition even when the default partition holds
    rows of that day already: the rows move into the new table, which is then attached. The default
    is locked first, so no row of that day can land in it between the move and the attach."""
    start, end = day_bounds(day)
    name, default = partition_name(table, day), default_name(table)
    in_day = f"{PARTITION_KEY} >= {_literal(start)} AND {PARTITION_KEY} < {_literal(end)}"
    return [
        f"LOCK TABLE {default} IN SHARE ROW EXCLUSIVE MODE",
        f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)",
        f"WITH moved AS (DELETE FROM {default} WHERE {in_day} RETURNING *) INSERT INTO {name} SELECT * FROM moved",
        f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({_literal(start)}) TO ({_literal(end)})",
    ]


EXISTING_SQL = text(
    """
SELECT child.relname FROM pg_inherits
JOIN pg_class child ON child.oid = pg_inherits.inhrelid
JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
JOIN pg_namespace ns ON ns.oid = parent.relnamespace
WHERE parent.relname = :parent AND ns.nspname = current_schema()
"""
)


@dataclass(frozen=True)
class Dropped:
    """A day of raw history dropped whole: its day and the rows its two partitions held."""

    day: date
    runs: int
    samples: int


def missing_days(existing: Iterable[str], table: str, wanted: Iterable[date]) -> list[date]:
    have = {day_of(name) for name in existing}
    return sorted(day for day in set(wanted) if day not in have)


def droppable_days(days: Iterable[date], *, cutoff: datetime) -> list[date]:
    """Days wholly before `cutoff` (their end at or before it), oldest first: the candidates; each is
    dropped only if every run in it also started before the cutoff (`Repository.prune` checks)."""
    return sorted(day for day in days if day_bounds(day)[1] <= cutoff)


async def existing(connection: AsyncConnection, table: str) -> list[str]:
    """The partitions of `table` (its days' and its default's names)."""
    return list(await connection.scalars(EXISTING_SQL, {"parent": table}))


async def ensure_days(engine: AsyncEngine, days: Iterable[date]) -> list[str]:
    """Create the partitions of `days` that do not exist yet, for both tables, each day in a short
    transaction of its own; returns the names created."""
    wanted = list(days)
    created: list[str] = []
    for table in PARTITIONED:
        async with engine.connect() as connection:
            names = await existing(connection, table)
        for day in missing_days(names, table, wanted):
            async with engine.begin() as connection:
                await serialize(connection)
                if await exists(connection, partition_name(table, day)):
                    continue  # another daemon's housekeeping made it meanwhile
                for statement in attach_day_sql(table, day):
                    await connection.exec_driver_sql(statement)
            created.append(partition_name(table, day))
    return created


def is_stale(*, live_rows: int, changed_since_analyze: int) -> bool:
    """Whether a partition's statistics lag too far behind its rows for the planner to trust them."""
    return changed_since_analyze > max(STALE_ROWS, STALE_SHARE * live_rows)


STATISTICS_SQL = text(
    "SELECT relname, n_live_tup, n_mod_since_analyze FROM pg_stat_user_tables "
    "WHERE schemaname = current_schema() AND (relname LIKE 'runs\\_%' OR relname LIKE 'samples\\_%')"
)


async def analyze_stale(engine: AsyncEngine) -> list[str]:
    """ANALYZE the day partitions whose statistics lag their rows (`is_stale`), each on its own; returns
    their names. Without statistics a freshly filled day looks empty to the planner, and an hour's
    rollup then sorted every day's samples (15 s per 500 series-hours at 20M samples, against 0.2 s
    once analyzed: bench/scale.py)."""
    async with engine.connect() as connection:
        rows = (await connection.execute(STATISTICS_SQL)).all()
    stale = [
        name
        for name, live, changed in rows
        if is_partition(name) and is_stale(live_rows=int(live or 0), changed_since_analyze=int(changed or 0))
    ]
    for name in sorted(stale):
        async with engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.exec_driver_sql(f'ANALYZE "{name}"')
    return sorted(stale)


async def serialize(connection: AsyncConnection) -> None:
    """Within a transaction: wait for any other daemon's partition change (making or dropping a day)
    to finish, so each day is made or dropped once, whoever gets there first."""
    await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PARTITION_LOCK_KEY})


async def exists(connection: AsyncConnection, name: str) -> bool:
    """Whether a table exists now: read from pg_class with this statement's snapshot, which sees another
    session's drop committed while this one waited (`to_regclass` may answer from a stale cache)."""
    found = await connection.scalar(
        text(
            "SELECT EXISTS (SELECT 1 FROM pg_class JOIN pg_namespace ns ON ns.oid = pg_class.relnamespace "
            "WHERE relname = :name AND ns.nspname = current_schema())"
        ),
        {"name": name},
    )
    return found is True
