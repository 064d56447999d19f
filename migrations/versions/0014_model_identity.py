"""which model answered: samples keep the configuration the API says answered (fingerprint: OpenAI's
system_fingerprint) and runs the hash of their target's canary answer (canary), so a change behind an
unchanged model id is seen (a change marker and a new baseline epoch)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column without a default: PostgreSQL and SQLite add it without rewriting the table.
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("fingerprint", sa.Text(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("canary", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("canary")
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("fingerprint")
