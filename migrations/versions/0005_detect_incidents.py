"""incidents keep what mattered: baseline and observed at opening, the peak ratio and when it peaked

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(sa.Column("opened_baseline_ms", sa.Double(), nullable=True))
        batch.add_column(sa.Column("opened_observed_ms", sa.Double(), nullable=True))
        batch.add_column(sa.Column("peak_ratio", sa.Double(), nullable=True))
        batch.add_column(sa.Column("peak_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("peak_at")
        batch.drop_column("peak_ratio")
        batch.drop_column("opened_observed_ms")
        batch.drop_column("opened_baseline_ms")
