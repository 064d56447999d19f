"""cold chunks: a series' day of runs and of samples, each as one compressed column-wise chunk, once the day
is past what the hot path reads (monitor/store/cold.py, issue 26)

Adds the table only; nothing is moved by the migration (housekeeping's compaction does that, a series-day
per transaction). The downgrade refuses while chunks are stored: dropping them would lose their runs.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cold_chunks",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("day", sa.DateTime(timezone=True), nullable=False),
        sa.Column("layout", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("first_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("runs_chunk", sa.LargeBinary(), nullable=False),
        sa.Column("samples_chunk", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_cold_chunks_series_id_series")),
        sa.PrimaryKeyConstraint("series_id", "day", name=op.f("pk_cold_chunks")),
    )
    op.create_index(op.f("ix_cold_chunks_last_started_at"), "cold_chunks", ["last_started_at"], unique=False)


def downgrade() -> None:
    stored = op.get_bind().execute(sa.text("SELECT count(*) FROM cold_chunks")).scalar()
    if stored:
        raise RuntimeError(
            f"cold_chunks holds {stored} compacted series-days: downgrading below 0021 would lose their runs and "
            "samples; wait until retention has dropped them, or stay at 0021"
        )
    op.drop_index(op.f("ix_cold_chunks_last_started_at"), table_name="cold_chunks")
    op.drop_table("cold_chunks")
