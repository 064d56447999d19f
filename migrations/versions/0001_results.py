"""results: series, runs, samples, hourly rollups, prompt calibration

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def ts(name: str, *, nullable: bool = False, **kwargs: Any) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, **kwargs)


def ms(name: str) -> sa.Column:
    return sa.Column(name, sa.Double(), nullable=True)


def upgrade() -> None:
    op.create_table(
        "series",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        ts("created_at", server_default=sa.text("CURRENT_TIMESTAMP")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_series")),
        sa.UniqueConstraint(
            "target",
            "provider",
            "model",
            "prompt",
            "location",
            name=op.f("uq_series_target_provider_model_prompt_location"),
        ),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("api", sa.Text(), nullable=False),
        ts("intended_at"),
        ts("started_at"),
        ts("finished_at"),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("warmup", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        ms("ttft_p50_ms"),
        ms("ttft_min_ms"),
        ms("ttft_max_ms"),
        ms("ttfa_p50_ms"),
        ms("decode_tps_p50"),
        ms("prompt_tokens_p50"),
        sa.Column("error", sa.String(length=32), nullable=True),
        ts("stored_at", server_default=sa.text("CURRENT_TIMESTAMP")),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_runs_series_id_series")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index("ix_runs_series_id_started_at", "runs", ["series_id", "started_at"])
    op.create_index("ix_runs_started_at", "runs", ["started_at"])
    op.create_table(
        "samples",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("warmup", sa.Boolean(), nullable=False),
        ts("intended_at", nullable=True),
        ts("sent_at", nullable=True),
        ms("dns_ms"),
        ms("connect_ms"),
        ms("tls_ms"),
        sa.Column("connection_reused", sa.Boolean(), nullable=True),
        ms("setup_ms"),
        ms("ttfb_ms"),
        ms("first_event_ms"),
        ms("ttft_ms"),
        ms("ttfa_ms"),
        ms("total_ms"),
        ms("gap_p50_ms"),
        ms("gap_p95_ms"),
        ms("gap_max_ms"),
        ms("decode_tps"),
        sa.Column("token_events", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("prompt_tokens_target", sa.Integer(), nullable=True),
        sa.Column("prompt_chars", sa.Integer(), nullable=True),
        sa.Column("served_model", sa.Text(), nullable=True),
        sa.Column("request_id", sa.Text(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
    )
    op.create_index("ix_samples_run_id", "samples", ["run_id"])
    op.create_table(
        "rollups_hourly",
        sa.Column("series_id", sa.Integer(), nullable=False),
        ts("hour"),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        ms("ttft_p50_ms"),
        ms("ttft_p90_ms"),
        ms("ttft_p99_ms"),
        ms("ttft_min_ms"),
        ms("ttft_max_ms"),
        ms("decode_tps_p50"),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_rollups_hourly_series_id_series")),
        sa.PrimaryKeyConstraint("series_id", "hour", name=op.f("pk_rollups_hourly")),
    )
    op.create_index("ix_rollups_hourly_hour", "rollups_hourly", ["hour"])
    op.create_table(
        "rollup_pending",
        sa.Column("series_id", sa.Integer(), nullable=False),
        ts("hour"),
        ts("marked_at"),
        sa.ForeignKeyConstraint(["series_id"], ["series.id"], name=op.f("fk_rollup_pending_series_id_series")),
        sa.PrimaryKeyConstraint("series_id", "hour", name=op.f("pk_rollup_pending")),
    )
    op.create_table(
        "calibration",
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("chars_per_token", sa.Double(), nullable=False),
        sa.Column("overhead_tokens", sa.Double(), nullable=False),
        ts("updated_at"),
        sa.PrimaryKeyConstraint("target", "prompt", name=op.f("pk_calibration")),
    )


def downgrade() -> None:
    op.drop_table("calibration")
    op.drop_table("rollup_pending")
    op.drop_index("ix_rollups_hourly_hour", table_name="rollups_hourly")
    op.drop_table("rollups_hourly")
    op.drop_index("ix_samples_run_id", table_name="samples")
    op.drop_table("samples")
    op.drop_index("ix_runs_started_at", table_name="runs")
    op.drop_index("ix_runs_series_id_started_at", table_name="runs")
    op.drop_table("runs")
    op.drop_table("series")
