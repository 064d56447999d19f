"""narrower samples: a sample's 14 durations as whole microseconds in int4 columns (`ttft_us`, ...: 4
bytes each against a double's 8) and no id of its own (16 bytes; nothing looked a sample up by it, a
sample is its run's round)

Converts in place. On PostgreSQL one ALTER TABLE rewrites every day partition once (its indexes
rebuilt with it); it holds the tables for as long as that takes: run it with the daemons stopped.
Durations beyond what an int4 of microseconds holds (35 min 47 s) are kept at that bound. SQLite
rebuilds its table (batch mode). The downgrade gives the samples new random ids.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: a migration must not change when the code's list does (monitor/store/records.py STORED_DURATIONS).
DURATIONS = (
    "dns",
    "connect",
    "tls",
    "setup",
    "ttfb",
    "first_event",
    "ttft",
    "ttfa",
    "first_tool_call",
    "total",
    "gap_p50",
    "gap_p95",
    "gap_max",
    "self_delay",
)
BOUND_MS = "2147483.647"  # (2^31 - 1) microseconds


def _micros(column: str, *, postgres: bool) -> str:
    # PostgreSQL's greatest() and least() skip nulls (greatest(NULL, x) is x); SQLite's max() and min()
    # of a null are null. A null duration stays null on both.
    bounded = (
        f"CASE WHEN {column} IS NULL THEN NULL ELSE least(greatest({column}, -{BOUND_MS}), {BOUND_MS}) END"
        if postgres
        else f"min(max({column}, -{BOUND_MS}), {BOUND_MS})"
    )
    return f"round(({bounded}) * 1000)"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name in DURATIONS:
            op.execute(f"ALTER TABLE samples RENAME COLUMN {name}_ms TO {name}_us")
        changes = [
            f"ALTER COLUMN {name}_us TYPE integer USING {_micros(name + '_us', postgres=True)}::integer"
            for name in DURATIONS
        ]
        op.execute(f"ALTER TABLE samples DROP COLUMN id, {', '.join(changes)}")
        op.execute("ANALYZE samples")
        return
    # SQLite: scaled in place first (its columns take any value), then the table rebuilt with the new
    # names and types; batch mode casts each value to INTEGER as it copies.
    scaled = ", ".join(f"{name}_ms = {_micros(name + '_ms', postgres=False)}" for name in DURATIONS)
    op.execute(f"UPDATE samples SET {scaled}")
    with op.batch_alter_table("samples", recreate="always") as batch:
        batch.drop_column("id")
        for name in DURATIONS:
            batch.alter_column(
                f"{name}_ms", new_column_name=f"{name}_us", type_=sa.Integer(), existing_type=sa.Double()
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        changes = [f"ALTER COLUMN {name}_us TYPE double precision USING {name}_us / 1000.0" for name in DURATIONS]
        op.execute(f"ALTER TABLE samples ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid(), {', '.join(changes)}")
        op.execute("ALTER TABLE samples ALTER COLUMN id DROP DEFAULT")
        for name in DURATIONS:
            op.execute(f"ALTER TABLE samples RENAME COLUMN {name}_us TO {name}_ms")
        return
    with op.batch_alter_table("samples", recreate="always") as batch:
        batch.add_column(sa.Column("id", sa.Uuid(), nullable=True))
        for name in DURATIONS:
            batch.alter_column(
                f"{name}_us", new_column_name=f"{name}_ms", type_=sa.Double(), existing_type=sa.Integer()
            )
    op.execute(f"UPDATE samples SET {', '.join(f'{name}_ms = {name}_ms / 1000.0' for name in DURATIONS)}")
    op.execute("UPDATE samples SET id = lower(hex(randomblob(16)))")
    with op.batch_alter_table("samples", recreate="always") as batch:
        batch.alter_column("id", existing_type=sa.Uuid(), nullable=False)
        batch.create_primary_key("pk_samples", ["id"])
