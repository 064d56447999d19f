"""time-partitioned raw history: on PostgreSQL `runs` and `samples` become tables partitioned by the
UTC day of their run's scheduled tick (`intended_at`), a partition per day with data in the last
`BACKFILL_DAYS` and per day from yesterday to a week ahead, the rest in a default partition; a
sample's `intended_at` is its run's and never null (on SQLite too, which keeps one table each)

Converts in place: the rows are copied into the partitioned tables, the old tables dropped and the
new ones renamed; the indexes are built after the copy (faster than maintaining them row by row).
On PostgreSQL the primary key of `runs` becomes (id, intended_at) (a partitioned table's unique keys
must hold its partition key) and `samples` has none (no query looks a sample up by its id).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from alembic import op

from monitor.store import partitions

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_DAYS = 120  # older history (past any sane raw_days) goes to the default partition, pruned by rows
EPOCH = "'1970-01-01 00:00:00+00'"

_RUN_INDEXES = (
    "CREATE UNIQUE INDEX uq_runs_series_id_job_intended_at ON runs (series_id, job, intended_at) WHERE job <> 'adhoc'",
    "CREATE INDEX ix_runs_series_id_started_at ON runs (series_id, started_at)",
    "CREATE INDEX ix_runs_started_at ON runs (started_at)",
    "ALTER TABLE runs ADD CONSTRAINT fk_runs_series_id_series FOREIGN KEY (series_id) REFERENCES series (id)",
)
_SAMPLE_INDEXES = ("CREATE INDEX ix_samples_run_id ON samples (run_id)",)


def _columns(bind: sa.engine.Connection, table: str) -> list[str]:
    return [column["name"] for column in sa.inspect(bind).get_columns(table)]


def _days(bind: sa.engine.Connection) -> list[date]:
    now = datetime.now(UTC)
    found = bind.execute(
        sa.text(
            "SELECT DISTINCT (intended_at AT TIME ZONE 'UTC')::date FROM runs "
            "WHERE intended_at >= :since AND intended_at < :until"
        ),
        {"since": now - timedelta(days=BACKFILL_DAYS), "until": now + timedelta(days=partitions.AHEAD_DAYS + 1)},
    ).scalars()
    return sorted(set(found) | set(partitions.days_around(now)))


def _copy_into(bind: sa.engine.Connection, *, partitioned: bool) -> None:
    """Copy runs and samples into new tables (partitioned or plain), then swap them in by name."""
    # Writes wait until the swap commits (reads go on): a run stored into the old tables after the copy
    # began would be dropped with them. A daemon left running meanwhile fails its save and spools it.
    op.execute("LOCK TABLE runs, samples IN EXCLUSIVE MODE")
    runs_columns = ", ".join(f'"{name}"' for name in _columns(bind, "runs"))
    sample_names = _columns(bind, "samples")
    sample_columns = ", ".join(f'"{name}"' for name in sample_names)
    days = _days(bind) if partitioned else []
    for table in partitions.PARTITIONED:
        new = f"{table}_swap"
        if partitioned:
            op.execute(partitions.create_parent_sql(new, table))
        else:
            op.execute(f"CREATE TABLE {new} (LIKE {table} INCLUDING DEFAULTS)")
        if table == "samples":
            op.execute(f"ALTER TABLE {new} ALTER COLUMN intended_at {'SET' if partitioned else 'DROP'} NOT NULL")
        if partitioned:
            op.execute(f"CREATE TABLE {partitions.default_name(table)} PARTITION OF {new} DEFAULT")
            for day in days:
                op.execute(partitions.create_day_sql(table, day, parent=new))
    op.execute(f"INSERT INTO runs_swap ({runs_columns}) SELECT {runs_columns} FROM runs")
    # A sample's intended_at is its run's (the day it is kept with); one without a run keeps its own.
    chosen = ", ".join(
        f"COALESCE(r.intended_at, s.intended_at, s.sent_at, {EPOCH})" if name == "intended_at" else f's."{name}"'
        for name in sample_names
    )
    joined = "samples s LEFT JOIN runs r ON r.id = s.run_id"
    op.execute(f"INSERT INTO samples_swap ({sample_columns}) SELECT {chosen} FROM {joined}")
    op.execute("DROP TABLE samples")
    op.execute("DROP TABLE runs")
    for table in partitions.PARTITIONED:
        op.execute(f"ALTER TABLE {table}_swap RENAME TO {table}")
    if partitioned:
        op.execute("ALTER TABLE runs ADD CONSTRAINT pk_runs PRIMARY KEY (id, intended_at)")
        # No key on samples: nothing looks a sample up by its id, a sample is written only with its run
        # (the run's key keeps both once), and its index cost 39 bytes a sample (bench/storage.py).
    else:
        op.execute("ALTER TABLE runs ADD CONSTRAINT pk_runs PRIMARY KEY (id)")
        op.execute("ALTER TABLE samples ADD CONSTRAINT pk_samples PRIMARY KEY (id)")
    for statement in (*_RUN_INDEXES, *_SAMPLE_INDEXES):
        op.execute(statement)
    # New tables have no statistics: until autovacuum reached them, an hour's rollup query took 8 s after
    # migrating 5M samples; with them, 60,500 series-hours rolled up in 37 s after migrating 1M.
    for table in partitions.PARTITIONED:
        op.execute(f"ANALYZE {table}")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        _copy_into(bind, partitioned=True)
        return
    op.execute(
        "UPDATE samples SET intended_at = COALESCE("
        "(SELECT runs.intended_at FROM runs WHERE runs.id = samples.run_id), intended_at, sent_at, "
        "'1970-01-01 00:00:00.000000')"
    )
    with op.batch_alter_table("samples") as batch:
        batch.alter_column("intended_at", existing_type=sa.DateTime(timezone=True), nullable=False)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        _copy_into(bind, partitioned=False)
        return
    with op.batch_alter_table("samples") as batch:
        batch.alter_column("intended_at", existing_type=sa.DateTime(timezone=True), nullable=True)
