"""coordination: job tick claims, incidents, detector state, alert outbox and deliveries

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def ts(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def json_type() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "job_ticks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        ts("scheduled_at"),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("claimed_by", sa.Text(), nullable=False),
        ts("claimed_at"),
        ts("finished_at", nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_ticks")),
        sa.UniqueConstraint("job", "scheduled_at", "location", name=op.f("uq_job_ticks_job_scheduled_at_location")),
    )
    op.create_table(
        "incidents",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        ts("opened_at"),
        ts("resolved_at", nullable=True),
        sa.Column("baseline_ms", sa.Double(), nullable=True),
        sa.Column("observed_ms", sa.Double(), nullable=True),
        sa.Column("ratio", sa.Double(), nullable=True),
        sa.Column("error", sa.String(length=32), nullable=True),
        sa.Column("details", json_type(), nullable=True),
        ts("updated_at"),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_incidents_series_id_series")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index("ix_incidents_opened_at", "incidents", ["opened_at"])
    op.create_index(
        "uq_incidents_open_series_kind",
        "incidents",
        ["series_id", "kind"],
        unique=True,
        postgresql_where=sa.text("resolved_at IS NULL"),
        sqlite_where=sa.text("resolved_at IS NULL"),
    )
    op.create_table(
        "detector_state",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("state", json_type(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        ts("updated_at"),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_detector_state_series_id_series")),
        sa.PrimaryKeyConstraint("series_id", name=op.f("pk_detector_state")),
    )
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("dedup_key", sa.Text(), nullable=False),
        sa.Column("incident_id", sa.Uuid(), nullable=True),
        sa.Column("receiver", sa.Text(), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("payload", json_type(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        ts("next_attempt_at"),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        ts("claimed_until", nullable=True),
        ts("created_at"),
        ts("sent_at", nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"], name=op.f("fk_alert_outbox_incident_id_incidents")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_outbox")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_alert_outbox_dedup_key")),
    )
    op.create_index("ix_alert_outbox_status_next_attempt_at", "alert_outbox", ["status", "next_attempt_at"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("outbox_id", sa.Uuid(), nullable=False),
        ts("attempted_at"),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["outbox_id"],
            ["alert_outbox.id"],
            name=op.f("fk_alert_deliveries_outbox_id_alert_outbox"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
    )
    op.create_index("ix_alert_deliveries_outbox_id", "alert_deliveries", ["outbox_id"])


def downgrade() -> None:
    op.drop_index("ix_alert_deliveries_outbox_id", table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index("ix_alert_outbox_status_next_attempt_at", table_name="alert_outbox")
    op.drop_table("alert_outbox")
    op.drop_table("detector_state")
    op.drop_index("uq_incidents_open_series_kind", table_name="incidents")
    op.drop_index("ix_incidents_opened_at", table_name="incidents")
    op.drop_table("incidents")
    op.drop_table("job_ticks")
