"""`ttft-monitor db housekeep`: the daemon's hourly housekeeping as one command, for a deployment that
runs only `once` (a Kubernetes CronJob) and so has no daemon to roll up, summarise and prune."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from monitor.store.engine import create_engine
from monitor.store.repository import Repository
from tests.conftest import run_cli
from tests.support.store_fixtures import make_batch


def _config(tmp_path: Path, *, raw_days: int = 30) -> tuple[Path, Path]:
    db = tmp_path / "ttft.db"
    config = tmp_path / "config.yaml"
    retention = f"  retention:\n    raw_days: {raw_days}\n    rollup_days: 400\n"
    config.write_text(f"database:\n  url: sqlite+aiosqlite:///{db}\n{retention}jobs: []\n")
    return config, db


async def _save_hours(db: Path, start: datetime, hours: int) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{db}")
    try:
        repository = Repository(engine)
        for step in range(hours * 12):
            await repository.save_runs(make_batch(start + timedelta(minutes=5 * step)))
    finally:
        await engine.dispose()


def _count(db: Path, sql: str) -> int:
    with sqlite3.connect(db) as connection:
        return int(connection.execute(sql).fetchone()[0])


def test_housekeep_rolls_up_the_finished_hours_and_makes_the_overviews_summary(tmp_path: Path) -> None:
    config, db = _config(tmp_path)
    assert run_cli("db", "upgrade", "--config", str(config)).code == 0
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    asyncio.run(_save_hours(db, start, hours=2))
    assert _count(db, "SELECT count(*) FROM rollups_hourly") == 0

    result = run_cli("db", "housekeep", "--config", str(config))
    assert result.code == 0, str(result)
    # 4 series (2 targets x 2 prompts), each with 2 finished hours.
    assert "hours rolled up 8" in result.stdout and "series summarised 4" in result.stdout, result.stdout
    assert _count(db, "SELECT count(*) FROM rollups_hourly") == 8
    assert _count(db, "SELECT count(*) FROM rollup_pending") == 0
    assert _count(db, "SELECT count(*) FROM overview_summary") == 4

    again = run_cli("db", "housekeep", "--config", str(config))  # nothing new: nothing rolled up twice
    assert again.code == 0 and "hours rolled up 0" in again.stdout, str(again)
    assert _count(db, "SELECT count(*) FROM rollups_hourly") == 8


def test_housekeep_prunes_what_is_past_retention(tmp_path: Path) -> None:
    config, db = _config(tmp_path, raw_days=1)
    assert run_cli("db", "upgrade", "--config", str(config)).code == 0
    asyncio.run(_save_hours(db, datetime.now(UTC) - timedelta(days=3), hours=1))
    result = run_cli("db", "housekeep", "--config", str(config))
    assert result.code == 0, str(result)
    assert _count(db, "SELECT count(*) FROM runs") == 0
    assert _count(db, "SELECT count(*) FROM rollups_hourly") > 0  # the rollups outlive the raw runs


def test_housekeep_on_a_database_behind_the_schema_changes_nothing_and_names_the_fix(tmp_path: Path) -> None:
    config, db = _config(tmp_path)
    result = run_cli("db", "housekeep", "--config", str(config))
    assert result.code == 3, str(result)
    assert "run `ttft-monitor db upgrade`" in result.stderr and "Traceback" not in result.stderr
    assert _count(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table'") == 0  # no schema made
