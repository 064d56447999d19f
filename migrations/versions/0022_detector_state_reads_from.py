"""detector state reads_from: where the series' detection read its history from at its last evaluation, so
the cold tier's compaction, run by any daemon on the database, keeps every row some daemon's detection reads
(a location whose rules read further back than the compacting daemon's: issue 26, docs/storage.md)

A nullable column; a state written before it has none, and compaction then goes by the series' runs alone
(as before) until its detection writes the state again, at its next run.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("detector_state", sa.Column("reads_from", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("detector_state") as batch:
        batch.drop_column("reads_from")
