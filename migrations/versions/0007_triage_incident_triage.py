"""triage: who acknowledged, labelled or resolved an incident (incident_triage); change markers (annotations)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def ts(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "incident_triage",
        sa.Column("incident_id", sa.Uuid(), nullable=False),
        ts("acked_at", nullable=True),
        sa.Column("acked_by", sa.Text(), nullable=True),
        sa.Column("label", sa.String(length=16), nullable=True),
        ts("labelled_at", nullable=True),
        sa.Column("labelled_by", sa.Text(), nullable=True),
        ts("resolved_at", nullable=True),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_incident_triage_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("incident_id", name=op.f("pk_incident_triage")),
    )
    op.create_table(
        "annotations",
        sa.Column("id", sa.Uuid(), nullable=False),
        ts("at"),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_annotations")),
    )
    op.create_index("ix_annotations_at", "annotations", ["at"])


def downgrade() -> None:
    op.drop_index("ix_annotations_at", table_name="annotations")
    op.drop_table("annotations")
    op.drop_table("incident_triage")
