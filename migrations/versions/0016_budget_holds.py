"""budget holds: a crossed budget's action (reduce or pause) on a job until its period ends, kept in the
database so a restart, another replica of the location and every `once` of a CronJob hold the job too

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "budget_holds",
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("budget", sa.Text(), nullable=False),
        sa.Column("per", sa.String(8), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("location", "job", name=op.f("pk_budget_holds")),
    )


def downgrade() -> None:
    op.drop_table("budget_holds")
