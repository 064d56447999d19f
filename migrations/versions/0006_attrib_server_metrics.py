"""runs keep what the server's own metrics said over the run: waiting, running, caches, TTFT split

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    "server_waiting",
    "server_running",
    "server_kv_cache_usage",
    "server_prefix_hit_rate",
    "server_ttft_ms",
    "server_queue_ms",
    "server_prefill_ms",
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
