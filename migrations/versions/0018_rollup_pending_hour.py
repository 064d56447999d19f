"""rollup_pending by hour: the rollup claims the oldest pending hours first, and without an index on the
hour every claim sorted the whole queue (55 ms at 100,000 pending series-hours, about 1 s at 1.7M, once
per batch of 500: a backlog of days at 5,000 series took hours to roll up)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_rollup_pending_hour"), "rollup_pending", ["hour"])


def downgrade() -> None:
    op.drop_index(op.f("ix_rollup_pending_hour"), table_name="rollup_pending")
