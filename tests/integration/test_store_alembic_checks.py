"""pytest-alembic's built-in checks, on SQLite and PostgreSQL: one head, base to head upgrades, the models
match what the migrations build, and every downgrade works."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_alembic
from pytest_alembic.config import Config
from pytest_alembic.tests import default as checks
from sqlalchemy.pool import NullPool

from monitor.store.engine import create_engine
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"
CHECKS: dict[str, Callable[[Any], None]] = {
    "single_head": checks.test_single_head_revision,
    "upgrade": checks.test_upgrade,
    "models_match_ddl": checks.test_model_definitions_match_ddl,
    "up_down_consistency": checks.test_up_down_consistency,
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_the_migrations_pass_pytest_alembics_check(empty_backend: Backend, check: str) -> None:
    # A new event loop per alembic command (pytest-alembic runs each with asyncio.run): no pooled
    # connection may outlive its loop.
    engine = create_engine(empty_backend.url, poolclass=NullPool)
    config = Config(config_options={"file": str(MIGRATIONS / "alembic.ini"), "script_location": str(MIGRATIONS)})
    # pytest-alembic annotates `engine` as a sync Connectable but runs an AsyncEngine (its executor checks).
    with pytest_alembic.runner(config=config, engine=engine) as alembic_runner:  # type: ignore[arg-type]
        CHECKS[check](alembic_runner)
