"""hourly rollups keep the p10, the phases' and token counts' medians and the server metrics' medians,
so long ranges of the series view show what short ones do; a covering index for the overview's scan

Existing rollups whose hour still has raw runs are marked pending: the daemon's next maintenance
(`Repository.rollup`) recomputes them with the new columns. Hours whose raw data retention has
deleted keep NULL there (nothing left to compute them from).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    "ttft_p10_ms",
    "dns_ms_p50",
    "connect_ms_p50",
    "tls_ms_p50",
    "ttfb_ms_p50",
    "first_event_ms_p50",
    "ttfa_ms_p50",
    "prompt_tokens_p50",
    "cached_tokens_p50",
    "server_waiting_p50",
    "server_running_p50",
    "server_kv_cache_usage_p50",
    "server_prefix_hit_rate_p50",
    "server_ttft_ms_p50",
    "server_queue_ms_p50",
    "server_prefill_ms_p50",
)
INDEX = "ix_rollups_hourly_overview"
INDEX_COLUMNS = ["series_id", "hour", "samples", "errors", "ttft_p50_ms"]

# Hours with a rollup and raw runs left: recompute them. (SQLite keeps UTC text 'YYYY-MM-DD HH:MM:SS...'.)
_MARK_PENDING = {
    "postgresql": """
        INSERT INTO rollup_pending (series_id, hour, marked_at)
        SELECT h.series_id, h.hour, now() FROM rollups_hourly h
        WHERE EXISTS (SELECT 1 FROM runs r WHERE r.series_id = h.series_id
                      AND r.started_at >= h.hour AND r.started_at < h.hour + interval '1 hour')
        ON CONFLICT (series_id, hour) DO NOTHING
    """,
    "sqlite": """
        INSERT INTO rollup_pending (series_id, hour, marked_at)
        SELECT h.series_id, h.hour, strftime('%Y-%m-%d %H:%M:%f', 'now') FROM rollups_hourly h
        WHERE EXISTS (SELECT 1 FROM runs r WHERE r.series_id = h.series_id
                      AND r.started_at >= h.hour
                      AND r.started_at < strftime('%Y-%m-%d %H:%M:%f', h.hour, '+1 hour'))
        ON CONFLICT (series_id, hour) DO NOTHING
    """,
}


def upgrade() -> None:
    with op.batch_alter_table("rollups_hourly") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
        batch.create_index(INDEX, INDEX_COLUMNS)
    op.execute(sa.text(_MARK_PENDING[op.get_bind().dialect.name]))


def downgrade() -> None:
    with op.batch_alter_table("rollups_hourly") as batch:
        batch.drop_index(INDEX)
        for name in reversed(COLUMNS):
            batch.drop_column(name)
