"""which server answered: runs keep what a self-hosted server (vLLM, SGLang) says it runs (server_build:
its version, the weights behind the model id, its cache configuration), read beside its metrics, so a
redeploy behind an unchanged model id is seen (a change marker and a new baseline epoch)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column without a default: PostgreSQL and SQLite add it without rewriting the table.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("server_build", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("server_build")
