"""samples record how late the monitor itself was around their stamps: self_delay_ms, and disturbed
(beyond `probe_self_delay_bound_ms`: stored and shown, but no evidence for detection)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Samples stored before this migration measured no self delay: null, and not disturbed.
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("self_delay_ms", sa.Double(), nullable=True))
        batch.add_column(sa.Column("disturbed", sa.Boolean(), server_default=sa.text("false"), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("disturbed")
        batch.drop_column("self_delay_ms")
