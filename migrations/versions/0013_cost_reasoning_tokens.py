"""samples keep their hidden reasoning tokens (reasoning_tokens), as the API reports them or estimated from
the stream's reasoning events (reasoning_tokens_estimated), for what probing costs

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Samples stored before this migration have no count (null), and so nothing estimated.
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("reasoning_tokens", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("reasoning_tokens_estimated", sa.Boolean(), server_default=sa.text("false"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("reasoning_tokens_estimated")
        batch.drop_column("reasoning_tokens")
