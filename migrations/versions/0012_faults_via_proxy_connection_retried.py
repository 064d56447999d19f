"""samples say whether they went through a forward proxy (via_proxy: their connect phase is the proxy's)
and whether a stale pooled connection made the probe send again on a fresh one (connection_retried)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Samples stored before this migration were never proxied nor retried: the probe could do neither.
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("via_proxy", sa.Boolean(), server_default=sa.text("false"), nullable=False))
        batch.add_column(sa.Column("connection_retried", sa.Boolean(), server_default=sa.text("false"), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("connection_retried")
        batch.drop_column("via_proxy")
