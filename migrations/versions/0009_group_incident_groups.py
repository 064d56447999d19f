"""incident groups: one notification per outage (several series behind one provider regressing together)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "incident_groups",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("lead_incident_id", sa.Uuid(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notified_members", sa.Integer(), nullable=False),
        sa.Column("notified_severity", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incident_groups")),
    )
    op.create_index("ix_incident_groups_opened_at", "incident_groups", ["opened_at"])
    op.create_table(
        "incident_group_scopes",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("group_id", sa.Uuid(), nullable=False),
        sa.Column("last_joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_incident_group_scopes")),
    )
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(sa.Column("group_id", sa.Uuid(), nullable=True))
        batch.create_foreign_key(
            batch.f("fk_incidents_group_id_incident_groups"), "incident_groups", ["group_id"], ["id"]
        )
        batch.create_index("ix_incidents_group_id", ["group_id"])


def downgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.drop_index("ix_incidents_group_id")
        batch.drop_constraint("fk_incidents_group_id_incident_groups", type_="foreignkey")
        batch.drop_column("group_id")
    op.drop_table("incident_group_scopes")
    op.drop_index("ix_incident_groups_opened_at", table_name="incident_groups")
    op.drop_table("incident_groups")
