"""samples: time to the first tool-call token, and what the server's response headers say about it

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("first_tool_call_ms", sa.Double()),
    ("server_processing_ms", sa.Double()),
    ("ratelimit_remaining_requests", sa.BigInteger()),
    ("ratelimit_remaining_tokens", sa.BigInteger()),
    ("retry_after", sa.Text()),
    ("server_timing", sa.Text()),
)


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
