"""`once` (the CronJob) on PostgreSQL makes the coming days' partitions after storing, as the daemon's
housekeeping does: a CronJob that runs for weeks after `db upgrade` keeps its runs in their own day,
not in the default partition."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from monitor.store import partitions
from tests.conftest import SimProcess, run_cli
from tests.support.daemon import _admin, _fresh_postgres_database, _query, upgrade, write_config


@pytest.fixture
def postgres_url() -> Iterator[str]:
    admin = os.environ.get("TTFT_TEST_POSTGRES_URL")
    if admin is None:
        pytest.skip("needs PostgreSQL: set TTFT_TEST_POSTGRES_URL (see tests/support/store_fixtures.py)")
    name, url = _fresh_postgres_database(admin)
    try:
        yield url
    finally:
        _admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_once_a_week_after_the_upgrade_stores_its_run_in_its_own_day(
    sim: SimProcess, tmp_path: Path, postgres_url: str
) -> None:
    config = write_config(tmp_path, sim, db_url=postgres_url)
    upgrade(config)
    now = datetime.now(UTC)
    # As if the migration's week ahead had run out with no daemon's housekeeping: no day from
    # yesterday on has its partitions.
    dropped = [
        partitions.partition_name(table, day) for table in partitions.PARTITIONED for day in partitions.days_around(now)
    ]
    _admin(postgres_url, "DROP TABLE " + ", ".join(dropped))
    result = run_cli("once", "--config", str(config), timeout=60)
    assert result.code == 0, str(result)
    assert "partitions_created" in result.stdout + result.stderr
    today = datetime.now(UTC).date()
    placed = _query(postgres_url, "SELECT tableoid::regclass::text, count(*) FROM runs GROUP BY 1")
    assert [name for name, _count in placed] == [partitions.partition_name("runs", today)], placed
    samples = _query(postgres_url, "SELECT tableoid::regclass::text, count(*) FROM samples GROUP BY 1")
    assert [name for name, _count in samples] == [partitions.partition_name("samples", today)], samples
    made = {row[0] for row in _query(postgres_url, "SELECT relname FROM pg_class WHERE relname LIKE 'runs_p%'")}
    assert {partitions.partition_name("runs", day) for day in partitions.days_around(now)} <= made
