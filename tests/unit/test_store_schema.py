"""The fast start-up schema check agrees with alembic."""

from __future__ import annotations

from monitor.store import migrate
from monitor.store.schema import HEAD_REVISION


def test_the_fast_check_knows_the_newest_migration() -> None:
    assert migrate.head() == HEAD_REVISION
