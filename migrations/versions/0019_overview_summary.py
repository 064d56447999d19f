"""overview summary: the overview's reading of the hourly rollups, kept by housekeeping once an hour, so
the overview reads one row per series instead of a month of hours (monitor/store/overview_summary.py)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
FLOATS = sa.JSON().with_variant(postgresql.ARRAY(sa.Double()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "overview_summary",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Uuid(), nullable=False),
        *(
            sa.Column(f"{what}_{window}", sa.BigInteger(), nullable=False)
            for window in ("day", "week", "month")
            for what in ("ok", "errors")
        ),
        sa.Column("baseline_ms", sa.Double(), nullable=True),
        sa.Column("sparkline", FLOATS, nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_ok", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_overview_summary_series_id_series")),
        sa.PrimaryKeyConstraint("series_id", name=op.f("pk_overview_summary")),
    )
    op.create_table(
        "overview_summary_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Uuid(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_starts", JSON, nullable=False),
        sa.Column("pending", JSON, nullable=False),
        sa.Column("series", sa.Integer(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_overview_summary_state")),
    )


def downgrade() -> None:
    op.drop_table("overview_summary_state")
    op.drop_table("overview_summary")
