"""The cold tier: a series' day of runs and samples kept as two compressed chunks instead of rows (issue 26).

Compaction (`compact_series_day`) reads a series' day of runs (by their scheduled day, `intended_at`, the day
partitions' key) with their samples, encodes each table's rows column-wise (`chunk_codec`: lossless), and in
the same transaction stores the chunk row and deletes the rows. A crash before the commit leaves the rows; after
it, the chunk: never both, never neither. A day compacted again (a late run arrived: a spool drained after an
outage) is decoded, joined by the new rows and written again, in one transaction too.

Reads (`read_runs`) take the runs of some series started in a time range from both the rows and the chunks,
in one snapshot, so a read never sees a day twice or not at all while compaction commits beside it. A run kept
in a chunk wins over a row of the same run (same id) or the same tick (series, job, scheduled time; not ad-hoc
runs): `save_runs` cannot see chunks, so a replica's late second run of a tick may land as a row; it is left
out of every read, as the one-run-per-tick key leaves it out of the rows, and the next compaction deletes it.

Each chunk holds the tables' columns as they were when it was written (`LAYOUTS[layout]`); a migration that
changes `runs` or `samples` adds a layout (tests/integration/test_store_cold.py fails until it does).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any

from sqlalchemy import Integer, and_, bindparam, delete, func, null, or_, select, text, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection

from monitor.store import chunk_codec
from monitor.store.direct import DirectStatement
from monitor.store.models import COLD_CHUNKS, RUNS, SAMPLES
from monitor.store.records import ADHOC_JOB
from monitor.store.types import Microseconds, UtcDateTime

DAY = timedelta(days=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Held (per series, within the compaction's transaction) so two daemons never compact one series-day at once.
COLD_LOCK_KEY = 0x7474_6663  # "ttfc"
SAMPLE_BATCH = 500  # run ids per statement reading or deleting their samples

# The columns each layout's chunks hold, by the database's column names (durations as `*_us` integers).
LAYOUTS: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {
    1: (
        (
            "id", "series_id", "job", "api", "intended_at", "started_at", "finished_at", "rounds", "warmup", "ok",
            "errors", "ttft_p50_ms", "ttft_min_ms", "ttft_max_ms", "ttfa_p50_ms", "decode_tps_p50",
            "prompt_tokens_p50", "error", "stored_at", "server_waiting", "server_running", "server_kv_cache_usage",
            "server_prefix_hit_rate", "server_ttft_ms", "server_queue_ms", "server_prefill_ms", "canary",
            "server_build",
        ),
        (
            "run_id", "round", "warmup", "intended_at", "sent_at", "dns_us", "connect_us", "tls_us",
            "connection_reused", "setup_us", "ttfb_us", "first_event_us", "ttft_us", "ttfa_us", "first_tool_call_us",
            "total_us", "gap_p50_us", "gap_p95_us", "gap_max_us", "decode_tps", "token_events", "prompt_tokens",
            "completion_tokens", "cached_tokens", "reasoning_tokens", "reasoning_tokens_estimated",
            "prompt_tokens_target", "prompt_chars", "served_model", "fingerprint", "request_id", "http_status",
            "server_processing_ms", "ratelimit_remaining_requests", "ratelimit_remaining_tokens", "retry_after",
            "server_timing", "error", "error_message", "timing_path", "self_delay_us", "disturbed", "via_proxy",
            "connection_retried",
        ),
    ),
}  # fmt: skip
LAYOUT = max(LAYOUTS)

# A column's key (what `select(RUNS)` / `select(SAMPLES)` rows are read by: `ttft_ms`) by its database name.
_RUN_KEYS = {column.name: column.key for column in RUNS.c}
_SAMPLE_KEYS = {column.name: column.key for column in SAMPLES.c}
_MICROS = frozenset(column.name for column in SAMPLES.c if isinstance(column.type, Microseconds))
# The rows as stored: the durations as their integers, not converted to milliseconds.
_RAW_RUNS = [RUNS.c[_RUN_KEYS[name]] for name in LAYOUTS[LAYOUT][0]]
_RAW_SAMPLES = [
    type_coerce(column, Integer()).label(name) if name in _MICROS else column
    for name in LAYOUTS[LAYOUT][1]
    for column in (SAMPLES.c[_SAMPLE_KEYS[name]],)
]


def day_of(moment: datetime) -> datetime:
    """The UTC day (its midnight) a run scheduled at `moment` belongs to."""
    moment = moment.astimezone(UTC)
    return datetime(moment.year, moment.month, moment.day, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Compacted:
    """What one compaction of a series' day did."""

    runs: int  # runs moved from rows into the chunk
    samples: int  # samples moved so
    duplicates: int  # rows of a run or tick the chunk already held, deleted (never read)
    chunk_runs: int  # runs the chunk holds now
    chunk_samples: int
    bytes: int  # the two chunks' size


def _as_read(
    chunk: bytes, names: Sequence[str], keys: Mapping[str, str], only: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """The rows of a chunk as a `select` of their table reads them: by column key, the durations in milliseconds
    (as `types.Microseconds` converts them); a column the chunk's layout lacks is None. Only the keys in `only`
    when given (the other columns are not decoded)."""
    wanted = None if only is None else {index for index, name in enumerate(names) if keys.get(name) in only}
    _rows, columns = chunk_codec.decode_columns(chunk, wanted)
    found: list[str] = []
    values: list[list[Any]] = []
    for name, column in zip(names, columns, strict=True):
        key = keys.get(name)
        if key is None or column is None:
            continue  # a column a later migration dropped, or one not asked for
        found.append(key)
        values.append([None if v is None else v / 1000 for v in column] if name in _MICROS else column)
    missing = {key: None for key in keys.values() if key not in found and (only is None or key in only)}
    if missing:
        return [{**dict(zip(found, row, strict=True)), **missing} for row in zip(*values, strict=True)]
    return [dict(zip(found, row, strict=True)) for row in zip(*values, strict=True)]


def decode_chunk(
    layout: int,
    runs_chunk: bytes,
    samples_chunk: bytes | None,
    *,
    run_keys: Collection[str] | None = None,
    sample_keys: Collection[str] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs and samples of a chunk row, as `select(RUNS)` and `select(SAMPLES)` read rows (no samples when
    `samples_chunk` is None; only the columns of `run_keys` and `sample_keys` when given); columns a later
    layout added are None."""
    if layout not in LAYOUTS:
        raise ValueError(f"cold chunk of layout {layout}: this version reads layouts {sorted(LAYOUTS)}; upgrade it")
    run_names, sample_names = LAYOUTS[layout]
    runs = _as_read(runs_chunk, run_names, _RUN_KEYS, run_keys)
    samples = _as_read(samples_chunk, sample_names, _SAMPLE_KEYS, sample_keys) if samples_chunk is not None else []
    return runs, samples


def _in_layout(rows: Sequence[Sequence[Any]], names: Sequence[str], wanted: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows stored in one layout as another's columns (absent ones None): an older chunk joined by new rows."""
    if tuple(names) == tuple(wanted):
        return [tuple(row) for row in rows]
    at = {name: index for index, name in enumerate(names)}
    return [tuple(row[at[name]] if name in at else None for name in wanted) for row in rows]


def _tick(run: Mapping[str, Any]) -> tuple[str, datetime] | None:
    return None if run["job"] == ADHOC_JOB else (run["job"], run["intended_at"])


def _run_sort(run: Sequence[Any]) -> tuple[datetime, uuid.UUID]:
    return run[4], run[0]  # intended_at, id (LAYOUTS' order)


def _sample_sort(sample: Sequence[Any]) -> tuple[datetime, uuid.UUID, int]:
    return sample[3], sample[0], sample[1]  # intended_at, run_id, round


async def _raw_rows(
    connection: AsyncConnection, series_id: int, start: datetime, end: datetime
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The stored rows (as the chunks hold them) of the series' runs scheduled in [start, end), and their samples."""
    runs = [
        tuple(row)
        for row in await connection.execute(
            select(*_RAW_RUNS).where(
                RUNS.c.series_id == series_id,
                RUNS.c.intended_at >= type_coerce(start, UtcDateTime()),
                RUNS.c.intended_at < type_coerce(end, UtcDateTime()),
            )
        )
    ]
    ids = [run[0] for run in runs]
    samples: list[tuple[Any, ...]] = []
    for offset in range(0, len(ids), SAMPLE_BATCH):
        samples += [
            tuple(row)
            for row in await connection.execute(
                select(*_RAW_SAMPLES).where(
                    SAMPLES.c.run_id.in_(ids[offset : offset + SAMPLE_BATCH]),
                    SAMPLES.c.intended_at >= type_coerce(start, UtcDateTime()),
                    SAMPLES.c.intended_at < type_coerce(end, UtcDateTime()),
                )
            )
        ]
    return runs, samples


async def lock_series(connection: AsyncConnection, series_id: int) -> bool:
    """Within a write transaction: whether this session may compact the series now (PostgreSQL: an advisory
    lock no other daemon holds; SQLite's write transaction already holds the whole database)."""
    if connection.dialect.name != "postgresql":
        return True
    got = await connection.scalar(
        text("SELECT pg_try_advisory_xact_lock(:key, :series)"), {"key": COLD_LOCK_KEY, "series": series_id}
    )
    return bool(got)


async def compact_series_day(connection: AsyncConnection, series_id: int, day: datetime) -> Compacted:
    """Within the caller's write transaction: move the series' runs scheduled on `day` (a UTC midnight), with
    their samples, from rows into its chunk (joining the chunk already there), and delete the rows."""
    end = day + DAY
    runs, samples = await _raw_rows(connection, series_id, day, end)
    stored = (
        await connection.execute(
            select(COLD_CHUNKS.c.layout, COLD_CHUNKS.c.runs_chunk, COLD_CHUNKS.c.samples_chunk).where(
                COLD_CHUNKS.c.series_id == series_id, COLD_CHUNKS.c.day == type_coerce(day, UtcDateTime())
            )
        )
    ).first()
    run_names, sample_names = LAYOUTS[LAYOUT]
    kept_runs: list[tuple[Any, ...]] = []
    kept_samples: list[tuple[Any, ...]] = []
    if stored is not None:
        if stored.layout not in LAYOUTS:
            raise ValueError(f"cold chunk of layout {stored.layout}: this version knows layouts {sorted(LAYOUTS)}")
        old_runs, old_samples = LAYOUTS[stored.layout]
        kept_runs = _in_layout(chunk_codec.decode(stored.runs_chunk), old_runs, run_names)
        kept_samples = _in_layout(chunk_codec.decode(stored.samples_chunk), old_samples, sample_names)
    held_ids = {run[0] for run in kept_runs}
    held_ticks = {tick for run in kept_runs if (tick := _tick(dict(zip(run_names, run, strict=True)))) is not None}
    moved = {
        run[0]
        for run in runs
        if run[0] not in held_ids and _tick(dict(zip(run_names, run, strict=True))) not in held_ticks
    }
    new_runs = [run for run in runs if run[0] in moved]
    new_samples = [sample for sample in samples if sample[0] in moved]
    all_runs = sorted(kept_runs + new_runs, key=_run_sort)
    all_samples = sorted(kept_samples + new_samples, key=_sample_sort)
    if not all_runs:
        return Compacted(0, 0, 0, 0, 0, 0)
    runs_chunk = chunk_codec.encode(all_runs, len(run_names))
    samples_chunk = chunk_codec.encode(all_samples, len(sample_names))
    where = (COLD_CHUNKS.c.series_id == series_id, COLD_CHUNKS.c.day == type_coerce(day, UtcDateTime()))
    await connection.execute(delete(COLD_CHUNKS).where(*where))
    await connection.execute(
        COLD_CHUNKS.insert().values(
            series_id=series_id,
            day=day,
            layout=LAYOUT,
            runs=len(all_runs),
            samples=len(all_samples),
            first_started_at=min(run[5] for run in all_runs),
            last_started_at=max(run[5] for run in all_runs),
            runs_chunk=runs_chunk,
            samples_chunk=samples_chunk,
        )
    )
    ids = [run[0] for run in runs]
    in_day = (
        SAMPLES.c.intended_at >= type_coerce(day, UtcDateTime()),
        SAMPLES.c.intended_at < type_coerce(end, UtcDateTime()),
    )
    for offset in range(0, len(ids), SAMPLE_BATCH):
        part = ids[offset : offset + SAMPLE_BATCH]
        await connection.execute(delete(SAMPLES).where(SAMPLES.c.run_id.in_(part), *in_day))
        await connection.execute(
            delete(RUNS).where(
                RUNS.c.id.in_(part),
                RUNS.c.intended_at >= type_coerce(day, UtcDateTime()),
                RUNS.c.intended_at < type_coerce(end, UtcDateTime()),
            )
        )
    return Compacted(
        runs=len(new_runs),
        samples=len(new_samples),
        duplicates=len(runs) - len(new_runs),
        chunk_runs=len(all_runs),
        chunk_samples=len(all_samples),
        bytes=len(runs_chunk) + len(samples_chunk),
    )


async def chunks_touching(
    connection: AsyncConnection, series_ids: Iterable[int], start: datetime, end: datetime, *, samples: bool = True
) -> list[Any]:
    """The chunk rows of `series_ids` holding a run started in [start, end) (by their first and last start);
    without their samples' chunk (None) unless `samples`."""
    ids = list(series_ids)
    if not ids:
        return []
    samples_chunk = COLD_CHUNKS.c.samples_chunk if samples else null().label("samples_chunk")
    return list(
        await connection.execute(
            select(
                COLD_CHUNKS.c.series_id,
                COLD_CHUNKS.c.day,
                COLD_CHUNKS.c.layout,
                COLD_CHUNKS.c.runs_chunk,
                samples_chunk,
            )
            .where(
                COLD_CHUNKS.c.series_id.in_(ids),
                COLD_CHUNKS.c.last_started_at >= type_coerce(start, UtcDateTime()),
                COLD_CHUNKS.c.first_started_at < type_coerce(end, UtcDateTime()),
            )
            .order_by(COLD_CHUNKS.c.series_id, COLD_CHUNKS.c.day)
        )
    )


# Whether a chunk may hold a run started in [:start, :end), by its first and last start; or a run a row started
# then repeats: a run starts within a day of its scheduled tick, so a row started in the window belongs to one of
# the days from :day_from (`_day_from`).
_MAY_HOLD = or_(
    and_(
        COLD_CHUNKS.c.last_started_at >= bindparam("start", type_=UtcDateTime()),
        COLD_CHUNKS.c.first_started_at < bindparam("end", type_=UtcDateTime()),
    ),
    and_(
        COLD_CHUNKS.c.day >= bindparam("day_from", type_=UtcDateTime()),
        COLD_CHUNKS.c.day < bindparam("end", type_=UtcDateTime()),
    ),
)


def _window(start: datetime, end: datetime) -> dict[str, datetime]:
    return {"start": start, "end": end, "day_from": day_of(max(start, _EPOCH + DAY)) - DAY}


async def any_chunk(connection: AsyncConnection, series_ids: Iterable[int], start: datetime, end: datetime) -> bool:
    """Whether a chunk may hold a run of `series_ids` started in [start, end), or a run a row started then
    repeats (a replica's late second run of a tick, started after every run of its chunk): by the chunks' first
    and last start, and by their day. A cheap look: readers of recent ranges keep their own statements when it
    is false."""
    ids = list(series_ids)
    if not ids:
        return False
    statement = select(func.count()).select_from(COLD_CHUNKS).where(COLD_CHUNKS.c.series_id.in_(ids), _MAY_HOLD)
    return bool(await connection.scalar(statement, _window(start, end)))


# `any_chunk` for one series, as detection asks it on each read of a series' whole history: compiled once and run
# without SQLAlchemy's execution around it on SQLite (store/direct.py), whose objects, made for every call, were
# most of the cyclic garbage a probe left (bench/daemon.py: 4.0 objects a probe against 0.8 without the look).
_ANY_CHUNK_OF_SERIES = DirectStatement(
    select(func.count()).select_from(COLD_CHUNKS).where(COLD_CHUNKS.c.series_id == bindparam("series_id"), _MAY_HOLD)
)


async def any_chunk_of_series(connection: AsyncConnection, series_id: int, start: datetime, end: datetime) -> bool:
    """`any_chunk` for one series."""
    [(found,)] = await _ANY_CHUNK_OF_SERIES.rows(connection, {"series_id": series_id, **_window(start, end)})
    return bool(found)


# What `read_runs` reads of every run and sample it decodes, whatever else its caller asks for.
_RUN_NEEDS = ("id", "series_id", "job", "intended_at", "started_at")
_SAMPLE_NEEDS = ("run_id", "round")


@dataclass(slots=True)
class Read:
    """Runs (and, when asked, their samples) as `select(RUNS)` / `select(SAMPLES)` rows read them, by column key:
    runs oldest first by start (then id), samples by run in that order, then round."""

    runs: list[dict[str, Any]]
    samples: dict[uuid.UUID, list[dict[str, Any]]]
    from_chunks: set[uuid.UUID] = field(default_factory=set)  # the ids of the runs read from a chunk, not a row


async def read_runs(
    connection: AsyncConnection,
    series_ids: Iterable[int],
    start: datetime,
    end: datetime,
    *,
    samples: bool = True,
    run_keys: Collection[str] | None = None,
    sample_keys: Collection[str] | None = None,
) -> Read:
    """The runs of `series_ids` started in [start, end), from the rows and the chunks alike, with their samples
    when `samples` (then on one snapshot: call it in a transaction of REPEATABLE READ on PostgreSQL, any
    transaction on SQLite; the runs alone are whole in READ COMMITTED too, the rows being read first). The one
    read of older runs every reader goes through when a chunk may hold some. Runs and samples kept in chunks
    carry only the columns of `run_keys` and `sample_keys` when given (those a reader needs: the others are not
    decoded), and always the ones the read itself needs."""
    if run_keys is not None:
        run_keys = {*run_keys, *_RUN_NEEDS}
    if sample_keys is not None:
        sample_keys = {*sample_keys, *_SAMPLE_NEEDS}
    ids = list(series_ids)
    found: list[dict[str, Any]] = []
    if ids:
        # The rows before the chunks: a compaction committing between the two reads (a reader in READ COMMITTED,
        # as detection's is) is then seen twice, its runs as rows and in their chunk (the chunk's kept, below),
        # never neither. The rows' columns a reader asked for, as the chunks' runs carry them: each column read is
        # a value typed in Python for every run of the range (a month of a series' runs holds thousands).
        columns = list(RUNS.c) if run_keys is None else [c for c in RUNS.c if c.key in run_keys]
        raw = await connection.execute(
            select(*columns).where(
                RUNS.c.series_id.in_(ids),
                RUNS.c.started_at >= type_coerce(start, UtcDateTime()),
                RUNS.c.started_at < type_coerce(end, UtcDateTime()),
            )
        )
        run_columns = [c.key for c in columns]
        found = [dict(zip(run_columns, row, strict=True)) for row in raw]
    chunk_rows = await chunks_touching(connection, ids, start, end, samples=samples)
    out_runs: list[dict[str, Any]] = []
    out_samples: dict[uuid.UUID, list[dict[str, Any]]] = {}
    # Each scheduled tick a chunk holds, with its run's id: a row of the tick with another id is a replica's
    # late second run, left out; one with the same id is that run (a compaction that committed meanwhile).
    held_ticks: dict[tuple[int, str, datetime], uuid.UUID] = {}
    decoded = {(row.series_id, day_of(row.day)) for row in chunk_rows}

    def hold(runs: Iterable[Mapping[str, Any]]) -> None:
        for run in runs:
            if (tick := _tick(run)) is not None:
                held_ticks[run["series_id"], *tick] = run["id"]

    for row in chunk_rows:
        runs, members = decode_chunk(
            row.layout, row.runs_chunk, row.samples_chunk, run_keys=run_keys, sample_keys=sample_keys
        )
        hold(runs)
        for run in runs:
            if start <= run["started_at"] < end:
                out_runs.append(run)
        if samples:
            wanted = {run["id"] for run in runs if start <= run["started_at"] < end}
            for sample in members:
                if sample["run_id"] in wanted:
                    out_samples.setdefault(sample["run_id"], []).append(sample)
    from_chunks = {run["id"] for run in out_runs}
    if found:
        # A row of a compacted day whose chunk holds none of the window's runs (a replica's late second run
        # of a tick started just inside the window, its chunk's runs just outside): that chunk's runs too.
        await _hold_other_chunks(connection, found, decoded, hold)
        raw_runs = []
        for run in found:
            if run["id"] in from_chunks:
                continue  # read from its chunk
            tick = _tick(run)
            holder = held_ticks.get((run["series_id"], *tick)) if tick is not None else None
            if holder is not None and holder != run["id"]:
                continue  # a chunk holds a run of this tick
            raw_runs.append(run)
        out_runs += raw_runs
        if samples and raw_runs:
            sample_columns = [c.key for c in SAMPLES.c]
            by_id = [run["id"] for run in raw_runs]
            ticks = [run["intended_at"] for run in raw_runs]
            for offset in range(0, len(by_id), SAMPLE_BATCH):
                part = by_id[offset : offset + SAMPLE_BATCH]
                days = ticks[offset : offset + SAMPLE_BATCH]
                for row in await connection.execute(
                    select(SAMPLES).where(
                        SAMPLES.c.run_id.in_(part),
                        SAMPLES.c.intended_at >= type_coerce(min(days), UtcDateTime()),
                        SAMPLES.c.intended_at <= type_coerce(max(days), UtcDateTime()),
                    )
                ):
                    out_samples.setdefault(row.run_id, []).append(dict(zip(sample_columns, row, strict=True)))
    out_runs.sort(key=lambda run: (run["started_at"], run["id"]))
    for members in out_samples.values():
        members.sort(key=lambda sample: sample["round"])
    return Read(out_runs, out_samples, from_chunks)


async def history_runs(
    connection: AsyncConnection,
    series_id: int,
    rows: Sequence[Sequence[Any]],
    start: datetime,
    end: datetime,
    keys: Sequence[str],
) -> tuple[list[tuple[Any, ...]], list[bool]]:
    """`rows`, the series' runs started in [start, end) as rows (the columns of `keys`, `started_at` first, oldest
    first; read before this call), with the runs its chunks hold in that range, oldest first, and for each whether
    it came from a chunk: what `read_runs` gives of those columns, without a Python object for each run's id or
    a dict for each row (detection reads a week and more of each series' runs this way, on every evaluation that
    keeps no history). A row of a run a chunk holds (a compaction that committed after the rows were read: the
    same start) is read once; a row of a tick a chunk holds another run of (a replica's late second run) is left
    out, as `read_runs` leaves it."""
    chunk_rows = await chunks_touching(connection, [series_id], start, end, samples=False)
    pick = itemgetter(*keys)
    wanted = {*keys, "job", "intended_at"}
    from_chunks: list[tuple[Any, ...]] = []
    chunk_starts: set[datetime] = set()
    held: dict[tuple[str, datetime], datetime] = {}  # each tick a chunk holds: its run's start

    def hold(runs: Iterable[Mapping[str, Any]]) -> None:
        for run in runs:
            if run["job"] != ADHOC_JOB:
                held[run["job"], run["intended_at"]] = run["started_at"]

    for chunk in chunk_rows:
        runs, _ = decode_chunk(chunk.layout, chunk.runs_chunk, None, run_keys=wanted)
        hold(runs)
        for run in runs:
            if start <= run["started_at"] < end:
                from_chunks.append(pick(run))
                chunk_starts.add(run["started_at"])
    # The rows that may repeat a chunk's tick: those scheduled on a day a chunk read holds (late runs into a
    # compacted day), or on the window's first day or the one before (whose chunk may hold no run in the window:
    # a run starts within a day of its tick). Nearly always none.
    decoded = {day_of(chunk.day) for chunk in chunk_rows}
    before = max([day + DAY for day in decoded] + [day_of(start) + DAY])
    suspects = list(
        await connection.execute(
            select(RUNS.c.job, RUNS.c.intended_at, RUNS.c.started_at).where(
                RUNS.c.series_id == series_id,
                *_started_in(RUNS.c.started_at, start, end),
                RUNS.c.intended_at < type_coerce(before, UtcDateTime()),
            )
        )
    )
    if suspects:
        found = [{"series_id": series_id, "job": j, "intended_at": i, "started_at": t} for j, i, t in suspects]
        await _hold_other_chunks(connection, found, {(series_id, day) for day in decoded}, hold)
    left_out = {at for job, intended, at in suspects if (ran := held.get((job, intended))) is not None and ran != at}
    merged = [(row[0], False, tuple(row)) for row in rows if row[0] not in chunk_starts and row[0] not in left_out]
    merged += [(run[0], True, run) for run in from_chunks]
    merged.sort(key=itemgetter(0))
    return [run for _, _, run in merged], [chunked for _, chunked, _ in merged]


async def compactable(
    connection: AsyncConnection, *, before: datetime, held_from: datetime | None
) -> list[tuple[int, datetime]]:
    """The (series id, day) pairs with runs in rows whose whole scheduled day ends at or before `before`, and
    before `held_from` (the oldest hour still waiting for its rollup) when given, oldest first."""
    limit = before if held_from is None else min(before, held_from)
    cutoff = day_of(limit)
    if cutoff > limit:
        cutoff -= DAY
    oldest = await connection.scalar(select(func.min(RUNS.c.started_at)))
    if oldest is None:
        return []
    pairs: list[tuple[int, datetime]] = []
    day = day_of(oldest) - DAY  # a run scheduled before midnight may start after it
    while day < cutoff:
        found = await connection.execute(
            select(RUNS.c.series_id)
            .where(
                RUNS.c.intended_at >= type_coerce(day, UtcDateTime()),
                RUNS.c.intended_at < type_coerce(day + DAY, UtcDateTime()),
                # What the runs index (started_at) narrows it to: a run starts about when it was scheduled.
                RUNS.c.started_at >= type_coerce(day - DAY, UtcDateTime()),
                RUNS.c.started_at < type_coerce(day + 2 * DAY, UtcDateTime()),
            )
            .distinct()
        )
        pairs += sorted((series_id, day) for (series_id,) in found)
        day += DAY
    return pairs


async def _hold_other_chunks(
    connection: AsyncConnection,
    rows: Sequence[Mapping[str, Any]],
    decoded: set[tuple[int, datetime]],
    hold: Callable[[Iterable[Mapping[str, Any]]], None],
) -> None:
    """`hold` the runs of the chunks of the days of `rows` not decoded yet (none, nearly always: a chunk's day
    has rows only after a late run)."""
    days = {(run["series_id"], day_of(run["intended_at"])) for run in rows} - decoded
    if not days:
        return
    first, last = min(day for _, day in days), max(day for _, day in days)
    keys = await connection.execute(
        select(COLD_CHUNKS.c.series_id, COLD_CHUNKS.c.day).where(
            COLD_CHUNKS.c.series_id.in_(sorted({series_id for series_id, _ in days})),
            COLD_CHUNKS.c.day >= type_coerce(first, UtcDateTime()),
            COLD_CHUNKS.c.day <= type_coerce(last, UtcDateTime()),
        )
    )
    for series_id, day in [key for key in keys if (key[0], day_of(key[1])) in days]:
        stored = (
            await connection.execute(
                select(COLD_CHUNKS.c.layout, COLD_CHUNKS.c.runs_chunk).where(
                    COLD_CHUNKS.c.series_id == series_id, COLD_CHUNKS.c.day == type_coerce(day, UtcDateTime())
                )
            )
        ).one()
        runs, _ = decode_chunk(stored.layout, stored.runs_chunk, None, run_keys=_RUN_NEEDS)
        hold(runs)
        decoded.add((series_id, day_of(day)))


async def newest_start(connection: AsyncConnection, series_id: int, start: datetime, end: datetime) -> datetime | None:
    """The latest start of a run of the series in [start, end), as rows or chunks hold it (a chunk's by its
    last run, wherever in the window): where a reader going back from the newest day may begin."""
    in_window = (
        RUNS.c.started_at >= type_coerce(start, UtcDateTime()),
        RUNS.c.started_at < type_coerce(end, UtcDateTime()),
    )
    row = await connection.scalar(select(func.max(RUNS.c.started_at)).where(RUNS.c.series_id == series_id, *in_window))
    chunk = await connection.scalar(
        select(func.max(COLD_CHUNKS.c.last_started_at)).where(
            COLD_CHUNKS.c.series_id == series_id,
            COLD_CHUNKS.c.first_started_at < type_coerce(end, UtcDateTime()),
            COLD_CHUNKS.c.last_started_at >= type_coerce(start, UtcDateTime()),
        )
    )
    found = [_moment(moment) for moment in (row, chunk) if moment is not None]
    return min(max(found), end) if found else None


def _moment(value: datetime | str) -> datetime:
    # max() of a timestamp comes back from SQLite as text, without the column's type.
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def count_runs(
    connection: AsyncConnection, series_ids: Iterable[int], start: datetime, end: datetime
) -> tuple[int, int]:
    """How many runs of `series_ids` started in [start, end): (as rows, in chunks). A chunk the window holds
    whole counts as stored; one it cuts is decoded (its runs' starts only). For choosing how to read, not for
    showing: a row repeating a chunk's run (a replica's late second run of a held tick, which every read leaves
    out) is counted."""
    ids = list(series_ids)
    if not ids:
        return 0, 0
    rows = await connection.scalar(
        select(func.count()).where(RUNS.c.series_id.in_(ids), *_started_in(RUNS.c.started_at, start, end))
    )
    whole = await connection.scalar(
        select(func.coalesce(func.sum(COLD_CHUNKS.c.runs), 0)).where(
            COLD_CHUNKS.c.series_id.in_(ids),
            COLD_CHUNKS.c.first_started_at >= type_coerce(start, UtcDateTime()),
            COLD_CHUNKS.c.last_started_at < type_coerce(end, UtcDateTime()),
        )
    )
    cut = sum(1 for moment in await _cut_chunk_starts(connection, ids, start, end) if start <= moment < end)
    return int(rows or 0), int(whole or 0) + cut


async def first_start(
    connection: AsyncConnection, series_ids: Iterable[int], start: datetime, end: datetime
) -> datetime | None:
    """The earliest start of a run of `series_ids` started in [start, end), rows and chunks alike (the chunks by
    their first start; one the window's start cuts decoded)."""
    ids = list(series_ids)
    if not ids:
        return None
    row = await connection.scalar(
        select(func.min(RUNS.c.started_at)).where(
            RUNS.c.series_id.in_(ids), *_started_in(RUNS.c.started_at, start, end)
        )
    )
    chunk = await connection.scalar(
        select(func.min(COLD_CHUNKS.c.first_started_at)).where(
            COLD_CHUNKS.c.series_id.in_(ids), *_started_in(COLD_CHUNKS.c.first_started_at, start, end)
        )
    )
    found = [_moment(moment) for moment in (row, chunk) if moment is not None]
    found += [m for m in await _cut_chunk_starts(connection, ids, start, end, only_start=True) if start <= m < end]
    return min(found, default=None)


def _started_in(column: Any, start: datetime, end: datetime) -> tuple[Any, Any]:
    return column >= type_coerce(start, UtcDateTime()), column < type_coerce(end, UtcDateTime())


async def _cut_chunk_starts(
    connection: AsyncConnection, ids: list[int], start: datetime, end: datetime, *, only_start: bool = False
) -> list[datetime]:
    """The run starts of the chunks that hold runs on both sides of the window's start, or (unless `only_start`)
    of its end: the chunks a count by their stored figures cannot take whole."""
    at_start = and_(
        COLD_CHUNKS.c.first_started_at < type_coerce(start, UtcDateTime()),
        COLD_CHUNKS.c.last_started_at >= type_coerce(start, UtcDateTime()),
    )
    at_end = and_(
        COLD_CHUNKS.c.first_started_at < type_coerce(end, UtcDateTime()),
        COLD_CHUNKS.c.last_started_at >= type_coerce(end, UtcDateTime()),
    )
    rows = await connection.execute(
        select(COLD_CHUNKS.c.layout, COLD_CHUNKS.c.runs_chunk).where(
            COLD_CHUNKS.c.series_id.in_(ids), at_start if only_start else or_(at_start, at_end)
        )
    )
    starts: list[datetime] = []
    for layout, runs_chunk in rows:
        runs, _ = decode_chunk(layout, runs_chunk, None, run_keys=("started_at",))
        starts += [run["started_at"] for run in runs]
    return starts
