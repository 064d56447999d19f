"""samples record which clock measured them: timing_path (stamped on arrival, or read by the task)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: samples stored before this migration did not record their clock.
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("timing_path", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("timing_path")
