"""The start-up schema check, without importing alembic (half a second of `once`'s start-up).

Only when the revision is not the expected head does it hand over to `migrate`, which knows the
whole history and says precisely what to do.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

# The newest migration under migrations/versions; tests/unit/test_store_schema.py keeps it equal to
# alembic's head, so adding a migration without bumping this fails the suite.
HEAD_REVISION = "0022"


async def ensure_current(engine: AsyncEngine) -> str:
    """The schema revision when it is `HEAD_REVISION`; otherwise migrate.ensure_current's verdict."""
    try:
        async with engine.connect() as connection:
            revision = (await connection.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    except Exception:
        revision = None  # no version table yet, or unreachable: let migrate give the exact reason
    if revision == HEAD_REVISION:
        return HEAD_REVISION
    from monitor.store import migrate

    return await migrate.ensure_current(engine)
