"""The schema, as typed SQLAlchemy models. Only the migrations under migrations/ create it.

Results: `series` (one row per thing whose history is compared), `runs` (one probe run of a series,
with its summary), `samples` (every request), `rollups_hourly` (kept after raw samples expire),
`rollup_pending` (hours whose rollup must be (re)computed) and `calibration` (prompt sizing).

Coordination for the daemon, detection and alerting: `job_ticks`, `incidents`, `detector_state`,
`alert_outbox` and `alert_deliveries`. They carry what several daemons sharing one database need to
claim work atomically; their owners extend them with new migrations.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, ClassVar, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    and_,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from monitor.store.records import ADHOC_JOB
from monitor.store.types import Microseconds, UtcDateTime, float_list_type, json_type

# Deterministic constraint names, so migrations (and SQLite batch mode) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
NOW = text("CURRENT_TIMESTAMP")
ERROR_CLASS_LENGTH = 32
TIMING_PATH_LENGTH = 16


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UtcDateTime(),
        uuid.UUID: Uuid(),
        dict[str, Any]: json_type(),
    }


metadata = Base.metadata


# ---------------------------------------------------------------- results


class SeriesRow(Base):
    """What one history is about: a model on a provider, with one prompt profile, from one place."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("target", "provider", "model", "prompt", "location"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target: Mapped[str] = mapped_column(Text)
    provider: Mapped[str] = mapped_column(Text)
    model: Mapped[str] = mapped_column(Text)
    prompt: Mapped[str] = mapped_column(Text)
    location: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=NOW)


class RunRow(Base):
    """One probe run of one series: its rounds' summary. The id is client-generated (idempotent replays).

    On PostgreSQL `runs` and `samples` are partitioned by day of `intended_at` (migration 0017,
    monitor/store/partitions.py): the primary key of `runs` there is (id, intended_at), since a
    partitioned table's unique keys must hold its partition key, and `samples` has no key of its own
    (nothing looks a sample up by id; its run's key keeps both once). The ids are UUIDs, unique on
    their own; alembic's comparison does not look at primary keys."""

    __tablename__ = "runs"
    __table_args__ = (
        # One run per scheduled tick of a series (its location is part of the series): replicas that
        # both probed a tick while they could not claim it store it once, whichever spool replays
        # first. Ad-hoc runs (`probe --store`) have no tick: each is its own run.
        # The partial indexes here name their predicate for SQLite only, though the migrations give it on
        # both backends (0002, 0003): `postgresql_where` would import SQLAlchemy's PostgreSQL dialect, with
        # every one of its drivers' modules, into each process that loads the models, only to validate the
        # keyword (2.3 MB resident of a daemon on SQLite). The migrations create the schema, and alembic's
        # comparison does not look at an index's predicate.
        Index(
            "uq_runs_series_id_job_intended_at",
            "series_id",
            "job",
            "intended_at",
            unique=True,
            sqlite_where=text(f"job <> '{ADHOC_JOB}'"),
        ),
        # "The last N runs of a series" and "a series between two times".
        Index("ix_runs_series_id_started_at", "series_id", "started_at"),
        # Retention walks runs oldest first.
        Index("ix_runs_started_at", "started_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"))
    job: Mapped[str] = mapped_column(Text)
    api: Mapped[str] = mapped_column(Text)
    intended_at: Mapped[datetime]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    rounds: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[int] = mapped_column(Integer)
    ok: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    ttft_p50_ms: Mapped[float | None] = mapped_column(Double)
    ttft_min_ms: Mapped[float | None] = mapped_column(Double)
    ttft_max_ms: Mapped[float | None] = mapped_column(Double)
    ttfa_p50_ms: Mapped[float | None] = mapped_column(Double)
    decode_tps_p50: Mapped[float | None] = mapped_column(Double)
    prompt_tokens_p50: Mapped[float | None] = mapped_column(Double)
    error: Mapped[str | None] = mapped_column(String(ERROR_CLASS_LENGTH))
    stored_at: Mapped[datetime] = mapped_column(server_default=NOW)
    # The server's own metrics over the run (providers with `server_metrics_url`), else NULL.
    server_waiting: Mapped[float | None] = mapped_column(Double)
    server_running: Mapped[float | None] = mapped_column(Double)
    server_kv_cache_usage: Mapped[float | None] = mapped_column(Double)
    server_prefix_hit_rate: Mapped[float | None] = mapped_column(Double)
    server_ttft_ms: Mapped[float | None] = mapped_column(Double)
    server_queue_ms: Mapped[float | None] = mapped_column(Double)
    server_prefill_ms: Mapped[float | None] = mapped_column(Double)
    # The hash of the target's canary answer (monitor/probe/canary.py); null without one, and before 0014.
    canary: Mapped[str | None] = mapped_column(String(32))
    # What a self-hosted server says it runs (monitor/probe/server_metrics.py `server_build`); null for
    # providers without `server_metrics_url`, and before 0015.
    server_build: Mapped[str | None] = mapped_column(String(256))


class SampleRow(Base):
    """One streamed request, every field the probe records (target, model, prompt via run and series)."""

    __tablename__ = "samples"

    # No id of its own (since migration 0020: it cost 16 bytes a sample and nothing looked a sample up
    # by it): a sample is its run's round. The databases keep no key on the pair (its index would cost
    # more than the run_id one); declared here for the mapper only.
    # Deliberately not a declared foreign key: the per-row check cost about a fifth of PostgreSQL's
    # insert time and doubled the WAL per sample (bench/storage.py). Samples are written only in
    # their run's transaction (Repository.save_runs) and deleted with it (Repository.prune).
    run_id: Mapped[uuid.UUID] = mapped_column(primary_key=True, index=True)
    round: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    warmup: Mapped[bool] = mapped_column(Boolean)
    # Its run's scheduled tick (the run's `intended_at`): on PostgreSQL the day it is partitioned by,
    # so a run and its samples are kept, and dropped, together (monitor/store/partitions.py).
    intended_at: Mapped[datetime]
    sent_at: Mapped[datetime | None]
    # The durations: milliseconds here, whole microseconds in the database (`*_us` columns, int4:
    # 4 bytes each against a double's 8; types.Microseconds).
    dns_ms: Mapped[float | None] = mapped_column("dns_us", Microseconds(), key="dns_ms")
    connect_ms: Mapped[float | None] = mapped_column("connect_us", Microseconds(), key="connect_ms")
    tls_ms: Mapped[float | None] = mapped_column("tls_us", Microseconds(), key="tls_ms")
    connection_reused: Mapped[bool | None] = mapped_column(Boolean)
    setup_ms: Mapped[float | None] = mapped_column("setup_us", Microseconds(), key="setup_ms")
    ttfb_ms: Mapped[float | None] = mapped_column("ttfb_us", Microseconds(), key="ttfb_ms")
    first_event_ms: Mapped[float | None] = mapped_column("first_event_us", Microseconds(), key="first_event_ms")
    ttft_ms: Mapped[float | None] = mapped_column("ttft_us", Microseconds(), key="ttft_ms")
    ttfa_ms: Mapped[float | None] = mapped_column("ttfa_us", Microseconds(), key="ttfa_ms")
    first_tool_call_ms: Mapped[float | None] = mapped_column(
        "first_tool_call_us", Microseconds(), key="first_tool_call_ms"
    )
    total_ms: Mapped[float | None] = mapped_column("total_us", Microseconds(), key="total_ms")
    gap_p50_ms: Mapped[float | None] = mapped_column("gap_p50_us", Microseconds(), key="gap_p50_ms")
    gap_p95_ms: Mapped[float | None] = mapped_column("gap_p95_us", Microseconds(), key="gap_p95_ms")
    gap_max_ms: Mapped[float | None] = mapped_column("gap_max_us", Microseconds(), key="gap_max_ms")
    decode_tps: Mapped[float | None] = mapped_column(Double)
    token_events: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    # Hidden reasoning tokens (part of completion_tokens), reported by the API or estimated from the
    # stream (`reasoning_tokens_estimated`); null before migration 0013.
    reasoning_tokens: Mapped[int | None] = mapped_column(Integer)
    reasoning_tokens_estimated: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    prompt_tokens_target: Mapped[int | None] = mapped_column(Integer)
    prompt_chars: Mapped[int | None] = mapped_column(Integer)
    served_model: Mapped[str | None] = mapped_column(Text)
    # OpenAI's system_fingerprint (the backend configuration that answered); null before migration 0014.
    fingerprint: Mapped[str | None] = mapped_column(Text)
    request_id: Mapped[str | None] = mapped_column(Text)
    http_status: Mapped[int | None] = mapped_column(Integer)
    server_processing_ms: Mapped[float | None] = mapped_column(Double)
    ratelimit_remaining_requests: Mapped[int | None] = mapped_column(BigInteger)
    ratelimit_remaining_tokens: Mapped[int | None] = mapped_column(BigInteger)
    retry_after: Mapped[str | None] = mapped_column(Text)
    server_timing: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(String(ERROR_CLASS_LENGTH))
    error_message: Mapped[str | None] = mapped_column(Text)
    # Which clock measured the sample (probe.result.TimingPath); null before migration 0007 and when
    # no response head arrived.
    timing_path: Mapped[str | None] = mapped_column(String(TIMING_PATH_LENGTH))
    # How late the monitor itself was around the sample's stamps (probe.self_delay); null before
    # migration 0011 and when nothing measured it. `disturbed`: beyond the bound, so no evidence.
    self_delay_ms: Mapped[float | None] = mapped_column("self_delay_us", Microseconds(), key="self_delay_ms")
    disturbed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # Through a forward proxy (its connect phase is the proxy's), and retried on a fresh connection after
    # a stale pooled one failed before answering; false before migration 0012.
    via_proxy: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    connection_retried: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class RollupRow(Base):
    """An hour of a series, kept after its raw samples expire. Measured (non-warm-up) samples only."""

    __tablename__ = "rollups_hourly"
    __table_args__ = (
        Index("ix_rollups_hourly_hour", "hour"),
        # Covering the overview's scan of every series' last 30 days (availability, baseline,
        # sparkline): read from the index alone, not row by row from the table.
        Index("ix_rollups_hourly_overview", "series_id", "hour", "samples", "errors", "ttft_p50_ms"),
    )

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    samples: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    ttft_p50_ms: Mapped[float | None] = mapped_column(Double)
    ttft_p90_ms: Mapped[float | None] = mapped_column(Double)
    ttft_p99_ms: Mapped[float | None] = mapped_column(Double)
    ttft_min_ms: Mapped[float | None] = mapped_column(Double)
    ttft_max_ms: Mapped[float | None] = mapped_column(Double)
    decode_tps_p50: Mapped[float | None] = mapped_column(Double)
    # Added by migration 0007: the p10 of the series view's band, the phases' and token counts'
    # medians, and the medians of the runs' server metrics (records.HourlyStats).
    ttft_p10_ms: Mapped[float | None] = mapped_column(Double)
    dns_ms_p50: Mapped[float | None] = mapped_column(Double)
    connect_ms_p50: Mapped[float | None] = mapped_column(Double)
    tls_ms_p50: Mapped[float | None] = mapped_column(Double)
    ttfb_ms_p50: Mapped[float | None] = mapped_column(Double)
    first_event_ms_p50: Mapped[float | None] = mapped_column(Double)
    ttfa_ms_p50: Mapped[float | None] = mapped_column(Double)
    prompt_tokens_p50: Mapped[float | None] = mapped_column(Double)
    cached_tokens_p50: Mapped[float | None] = mapped_column(Double)
    server_waiting_p50: Mapped[float | None] = mapped_column(Double)
    server_running_p50: Mapped[float | None] = mapped_column(Double)
    server_kv_cache_usage_p50: Mapped[float | None] = mapped_column(Double)
    server_prefix_hit_rate_p50: Mapped[float | None] = mapped_column(Double)
    server_ttft_ms_p50: Mapped[float | None] = mapped_column(Double)
    server_queue_ms_p50: Mapped[float | None] = mapped_column(Double)
    server_prefill_ms_p50: Mapped[float | None] = mapped_column(Double)


class RollupPendingRow(Base):
    """An hour that received runs since its rollup was computed. Written in the runs' own transaction,
    so late arrivals (a spool replayed after an outage) are rolled up too."""

    __tablename__ = "rollup_pending"
    # The rollup claims the oldest hours first (migration 0018).
    __table_args__ = (Index("ix_rollup_pending_hour", "hour"),)

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    # Updated on every save so the row is locked by it, ordering saves against a concurrent rollup.
    marked_at: Mapped[datetime]


class OverviewSummaryRow(Base):
    """The overview's reading of one series' rollups for the current hour (monitor/store/
    overview_summary.py), written by housekeeping after the rollup, so the overview reads a row per
    series instead of a month of hours. Replaced whole each time; `generation` ties it to its state."""

    __tablename__ = "overview_summary"

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    generation: Mapped[uuid.UUID]
    # ok samples and errors of the up-to-date whole hours in the day, week and month windows.
    ok_day: Mapped[int] = mapped_column(BigInteger)
    errors_day: Mapped[int] = mapped_column(BigInteger)
    ok_week: Mapped[int] = mapped_column(BigInteger)
    errors_week: Mapped[int] = mapped_column(BigInteger)
    ok_month: Mapped[int] = mapped_column(BigInteger)
    errors_month: Mapped[int] = mapped_column(BigInteger)
    # The median of the hourly p50s of the week before the last hour.
    baseline_ms: Mapped[float | None] = mapped_column(Double)
    # The sparkline's 24 hourly p50s (null: no up-to-date rollup that hour). An array on PostgreSQL:
    # 5,000 of them decode in milliseconds, where as jsonb they took longer than the scan they replace.
    sparkline: Mapped[list[float | None]] = mapped_column(float_list_type())
    # Its last run in the month before the summary was made, and that run's ok samples: later runs are
    # in the hours the overview reads from runs (the current one, pending ones), so it needs no search.
    last_run_at: Mapped[datetime | None]
    last_run_ok: Mapped[int | None] = mapped_column(Integer)


class OverviewSummaryStateRow(Base):
    """Which hours the stored overview summary read: one row, replaced with the summary."""

    __tablename__ = "overview_summary_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[uuid.UUID]
    hour: Mapped[datetime]  # the current hour when it was made: valid until the hour ends
    window_starts: Mapped[list[str]] = mapped_column(json_type())
    # The (series, hour) pairs pending when it was made: their hours were counted from runs.
    pending: Mapped[list[list[Any]]] = mapped_column(json_type())
    series: Mapped[int] = mapped_column(Integer)
    computed_at: Mapped[datetime]


class CalibrationRow(Base):
    """Characters per token learnt per (target, prompt profile), so a restart keeps prompts on target."""

    __tablename__ = "calibration"

    target: Mapped[str] = mapped_column(Text, primary_key=True)
    prompt: Mapped[str] = mapped_column(Text, primary_key=True)
    chars_per_token: Mapped[float] = mapped_column(Double)
    overhead_tokens: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[datetime]


class BudgetHoldRow(Base):
    """A crossed budget's action on one job of a location until its period ends (monitor/detect/
    budget_service.py): here, so a restart, another replica and each `once` of a CronJob hold the job too."""

    __tablename__ = "budget_holds"

    location: Mapped[str] = mapped_column(Text, primary_key=True)
    job: Mapped[str] = mapped_column(Text, primary_key=True)
    action: Mapped[str] = mapped_column(String(16))  # reduce or pause
    budget: Mapped[str] = mapped_column(Text)  # its key path under `budget`
    per: Mapped[str] = mapped_column(String(8))  # day or month
    since: Mapped[datetime]
    until: Mapped[datetime]


# ---------------------------------------------------------------- coordination (daemon, detection, alerts)


class JobTickRow(Base):
    """A claimed job tick. The unique key lets several daemons race for a tick; one insert wins."""

    __tablename__ = "job_ticks"
    __table_args__ = (
        UniqueConstraint("job", "scheduled_at", "location"),
        # Retention deletes the oldest claims.
        Index("ix_job_ticks_scheduled_at", "scheduled_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[str] = mapped_column(Text)
    scheduled_at: Mapped[datetime]
    location: Mapped[str] = mapped_column(Text)
    claimed_by: Mapped[str] = mapped_column(Text)
    claimed_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String(16))


class IncidentRow(Base):
    """A regression, availability or SLO incident of a series; open while `resolved_at` is null."""

    __tablename__ = "incidents"
    __table_args__ = (
        # At most one open incident per series and kind, whichever daemon opens it.
        Index(
            "uq_incidents_open_series_kind",
            "series_id",
            "kind",
            unique=True,
            sqlite_where=text("resolved_at IS NULL"),  # for SQLite only, as RunRow's (the migration has both)
        ),
        Index("ix_incidents_opened_at", "opened_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"))
    kind: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16))
    opened_at: Mapped[datetime]
    resolved_at: Mapped[datetime | None]
    baseline_ms: Mapped[float | None] = mapped_column(Double)
    observed_ms: Mapped[float | None] = mapped_column(Double)
    ratio: Mapped[float | None] = mapped_column(Double)
    error: Mapped[str | None] = mapped_column(String(ERROR_CLASS_LENGTH))
    details: Mapped[dict[str, Any] | None]
    updated_at: Mapped[datetime]

    # ---- detect branch (migration 0003_detect_incidents): what mattered. The baseline and observed
    # TTFT when the incident opened (baseline_ms/observed_ms/ratio follow its updates and its resolve),
    # and the highest ratio while it was open, with when.
    opened_baseline_ms: Mapped[float | None] = mapped_column(Double)
    opened_observed_ms: Mapped[float | None] = mapped_column(Double)
    peak_ratio: Mapped[float | None] = mapped_column(Double)
    peak_at: Mapped[datetime | None]
    # ---- end of the detect branch's block
    # Migration 0009: the outage this incident was notified as part of.
    group_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("incident_groups.id"), index=True)


class IncidentGroupRow(Base):
    """Regression incidents of one provider that opened within minutes of each other: one outage,
    notified once (as its lead incident) while the members are recorded each on their own."""

    __tablename__ = "incident_groups"
    __table_args__ = (Index("ix_incident_groups_opened_at", "opened_at"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str] = mapped_column(Text)  # or the location, for `alerts.grouping.by: location`
    lead_incident_id: Mapped[uuid.UUID]
    opened_at: Mapped[datetime]
    resolved_at: Mapped[datetime | None]
    # What the last notification claimed (members and severity): a new one goes out when either grows.
    notified_members: Mapped[int] = mapped_column(Integer)
    notified_severity: Mapped[str | None] = mapped_column(String(16))


class IncidentGroupScopeRow(Base):
    """The group a scope's next regression joins, claimed by one atomic upsert (several daemons)."""

    __tablename__ = "incident_group_scopes"

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    group_id: Mapped[uuid.UUID]
    last_joined_at: Mapped[datetime]


class DetectorStateRow(Base):
    """The detector's per-series memory (confirmations, hysteresis); `version` for compare-and-set."""

    __tablename__ = "detector_state"

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    state: Mapped[dict[str, Any]]
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime]
    # Where the series' detection read its history from at its last evaluation (migration 0022; compaction kept
    # it as rows until detection read chunks too, 2026-12-07): how far back a series' detection reaches.
    reads_from: Mapped[datetime | None]


class AlertOutboxRow(Base):
    """A notification to deliver. `dedup_key` makes each state change enqueued once; a worker claims a
    row by setting `claimed_by`/`claimed_until` in one UPDATE and acts only if it changed one row."""

    __tablename__ = "alert_outbox"
    __table_args__ = (Index("ix_alert_outbox_status_next_attempt_at", "status", "next_attempt_at"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    dedup_key: Mapped[str] = mapped_column(Text, unique=True)
    incident_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("incidents.id"))
    receiver: Mapped[str] = mapped_column(Text)
    event: Mapped[str] = mapped_column(String(16))
    payload: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime]
    claimed_by: Mapped[str | None] = mapped_column(Text)
    claimed_until: Mapped[datetime | None]
    created_at: Mapped[datetime]
    sent_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)


class AlertDeliveryRow(Base):
    """One delivery attempt of an outbox row, with the receiver's answer."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    outbox_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("alert_outbox.id", ondelete="CASCADE"), index=True)
    attempted_at: Mapped[datetime]
    outcome: Mapped[str] = mapped_column(String(16))
    http_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float | None] = mapped_column(Double)


class IncidentTriageRow(Base):
    """What people said about an incident (`ttft-monitor incidents ack|label|resolve`); at most one row per
    incident, written only by those commands, so the detector's updates of `incidents` never race it."""

    __tablename__ = "incident_triage"

    incident_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"), primary_key=True)
    acked_at: Mapped[datetime | None]
    acked_by: Mapped[str | None] = mapped_column(Text)
    label: Mapped[str | None] = mapped_column(String(16))
    labelled_at: Mapped[datetime | None]
    labelled_by: Mapped[str | None] = mapped_column(Text)
    # Set when the incident was resolved by hand (`incidents resolve`), with the note given.
    resolved_at: Mapped[datetime | None]
    resolved_by: Mapped[str | None] = mapped_column(Text)
    note: Mapped[str | None] = mapped_column(Text)


class AnnotationRow(Base):
    """A change marker (`ttft-monitor annotate`): what changed, when, and for which target (null: all)."""

    __tablename__ = "annotations"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(index=True)
    text: Mapped[str] = mapped_column(Text)
    target: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(Text)


class ColdChunkRow(Base):
    """The cold tier (monitor/store/cold.py): a series' day of runs, and of their samples, each as one compressed
    column-wise chunk (monitor/store/chunk_codec.py), written in the transaction that deletes their rows. The day
    is the runs' scheduled day (`intended_at`, as the partitions'); `layout` names the columns the chunks hold
    (cold.LAYOUTS); the first and last run start let reads and retention find a chunk by time."""

    __tablename__ = "cold_chunks"
    __table_args__ = (Index("ix_cold_chunks_last_started_at", "last_started_at"),)

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id"), primary_key=True)
    day: Mapped[datetime] = mapped_column(primary_key=True)
    layout: Mapped[int] = mapped_column(Integer)
    runs: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    first_started_at: Mapped[datetime]
    last_started_at: Mapped[datetime]
    runs_chunk: Mapped[bytes] = mapped_column(LargeBinary)
    samples_chunk: Mapped[bytes] = mapped_column(LargeBinary)


def table_of(model: type[Base]) -> Table:
    """The Core table of a model, typed as a Table (for insert/delete statements)."""
    return cast(Table, model.__table__)


SERIES = table_of(SeriesRow)
RUNS = table_of(RunRow)
SAMPLES = table_of(SampleRow)
ROLLUPS = table_of(RollupRow)
ROLLUP_PENDING = table_of(RollupPendingRow)
# A run's samples: by its id and by the day both are kept in, so that on PostgreSQL a join reads only the
# run's own partition of `samples` (monitor/store/partitions.py), not every day's index.
SAMPLES_OF_RUN = and_(SAMPLES.c.run_id == RUNS.c.id, SAMPLES.c.intended_at == RUNS.c.intended_at)
CALIBRATION = table_of(CalibrationRow)
BUDGET_HOLDS = table_of(BudgetHoldRow)
INCIDENTS = table_of(IncidentRow)
GROUPS = table_of(IncidentGroupRow)
SCOPES = table_of(IncidentGroupScopeRow)
TRIAGE = table_of(IncidentTriageRow)
ANNOTATIONS = table_of(AnnotationRow)
COLD_CHUNKS = table_of(ColdChunkRow)
DETECTOR_STATE = table_of(DetectorStateRow)
OUTBOX = table_of(AlertOutboxRow)
DELIVERIES = table_of(AlertDeliveryRow)
