"""runs: one run per (series, job, scheduled time); job_ticks: an index for retention

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Duplicate runs stored before this revision (two replicas that both probed a tick while the database
was away) are removed first, keeping the first one stored, with their samples; their hours are
marked for a new rollup.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from monitor.store.types import UtcDateTime

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ADHOC = "job <> 'adhoc'"
_BATCH = 500


def _remove_duplicate_runs() -> None:
    bind = op.get_bind()
    runs = sa.table(
        "runs",
        sa.column("id", sa.Uuid()),
        sa.column("series_id", sa.Integer()),
        sa.column("job", sa.Text()),
        sa.column("intended_at", UtcDateTime()),
        sa.column("started_at", UtcDateTime()),
        sa.column("stored_at", UtcDateTime()),
    )
    samples = sa.table("samples", sa.column("run_id", sa.Uuid()))
    pending = sa.table(
        "rollup_pending",
        sa.column("series_id", sa.Integer()),
        sa.column("hour", UtcDateTime()),
        sa.column("marked_at", UtcDateTime()),
    )
    later = runs.alias("later")
    first = runs.alias("first")
    earlier_twin = (
        sa.select(sa.literal(1))
        .select_from(first)
        .where(
            first.c.series_id == later.c.series_id,
            first.c.job == later.c.job,
            first.c.intended_at == later.c.intended_at,
            sa.or_(
                first.c.stored_at < later.c.stored_at,
                sa.and_(first.c.stored_at == later.c.stored_at, first.c.id < later.c.id),
            ),
        )
        .exists()
    )
    duplicates = bind.execute(
        sa.select(later.c.id, later.c.series_id, later.c.started_at).where(later.c.job != "adhoc", earlier_twin)
    ).all()
    hours: set[tuple[int, datetime]] = set()
    for offset in range(0, len(duplicates), _BATCH):
        chunk = duplicates[offset : offset + _BATCH]
        ids = [row.id for row in chunk]
        bind.execute(sa.delete(samples).where(samples.c.run_id.in_(ids)))
        bind.execute(sa.delete(runs).where(runs.c.id.in_(ids)))
        hours.update((row.series_id, row.started_at.replace(minute=0, second=0, microsecond=0)) for row in chunk)
    now = datetime.now(UTC)
    for series_id, hour in sorted(hours):
        bind.execute(sa.delete(pending).where(pending.c.series_id == series_id, pending.c.hour == hour))
        bind.execute(sa.insert(pending).values(series_id=series_id, hour=hour, marked_at=now))


def upgrade() -> None:
    _remove_duplicate_runs()
    op.create_index(
        "uq_runs_series_id_job_intended_at",
        "runs",
        ["series_id", "job", "intended_at"],
        unique=True,
        postgresql_where=sa.text(ADHOC),
        sqlite_where=sa.text(ADHOC),
    )
    op.create_index("ix_job_ticks_scheduled_at", "job_ticks", ["scheduled_at"])


def downgrade() -> None:
    op.drop_index("ix_job_ticks_scheduled_at", table_name="job_ticks")
    op.drop_index("uq_runs_series_id_job_intended_at", table_name="runs")
