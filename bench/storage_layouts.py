"""What a sample would cost on PostgreSQL in other layouts: measured on real rows, not estimated (issue 26).

Reads the samples and runs of a database filled by `bench/storage.py --db postgres --keep` (what
`Repository.save_runs` stores), copies them into a scratch schema in each candidate layout, and prints
the bytes per sample of each (heap, TOAST and indexes, `pg_total_relation_size`), with its run's share
(the `runs` row and its indexes) beside it. The copies are plain tables, the current layout included,
so partitioning does not tell them apart. Nothing in the project uses these layouts: they are what a
migration could aim at, measured.

    .venv/bin/python bench/storage.py --db postgres --samples 120000 --series 100 --keep   # prints its URL
    .venv/bin/python bench/storage_layouts.py postgresql://postgres@127.0.0.1:5432/ttft_bench_...

The layouts:

- `current`: the samples table as it is (a copy), with its one index (`run_id`).
- `narrow`: a row per sample without its own id; the 14 timings as integer microseconds (int4: up to 35
  minutes), `decode_tps` as real; `round`, `http_status` as int2 and the six flags as one int2; the
  prompt's configured size and length (the same for every sample of a run) left to the run; the served
  model only where it differs from the run's first sample's; 8-byte columns first, so no padding.
- `packed`: a row per run (its id and day), each field an array over the run's samples in round order.
- `packed into runs`: the same arrays as columns of the run's own row (no second table, no second
  index): what a sample costs when the run carries its samples.
- `packed binary`: a row per run holding its samples as one `bytea` of fixed-width integers (`binary_record`),
  the served model once per run; and the same `bytea` as a column of the run's row.
- `chunks`: a row per series and day (and per series and hour) holding that day's samples as one
  compressed, column-wise chunk (`monitor/store/chunk_codec.py`: lossless, every chunk decoded and compared with
  its rows here), what a cold tier could keep once a day is rolled up and no longer written; and the
  same with the day's runs in a chunk of their own too (no `runs` rows left for that day).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.store.chunk_codec import decode, encode
from monitor.store.records import STORED_DURATIONS

SCHEMA = "ttft_layouts"
SOURCE = f"{SCHEMA}.source_samples"
TIMINGS = STORED_DURATIONS  # the 14 durations, by their names in milliseconds
COUNTS = ("token_events", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")
FLAGS = (
    "warmup",
    "connection_reused",
    "disturbed",
    "via_proxy",
    "connection_retried",
    "reasoning_tokens_estimated",
)
RARE = (
    "error",
    "error_message",
    "server_processing_ms",
    "ratelimit_remaining_requests",
    "ratelimit_remaining_tokens",
    "retry_after",
    "server_timing",
    "timing_path",
    "fingerprint",
)


def micros(column: str) -> str:
    return f"round({column} * 1000)::int4"


def flags() -> str:
    bits = " | ".join(f"(coalesce({name}, false)::int << {bit})" for bit, name in enumerate(FLAGS))
    return f"({bits})::int2"


def narrow_select() -> str:
    served = "nullif(s.served_model, first_value(s.served_model) over (partition by s.run_id order by s.round))"
    columns = [
        "s.run_id",
        "s.intended_at",
        "s.sent_at",
        *(f"{micros('s.' + name)} as {name}" for name in TIMINGS),
        "s.decode_tps::real as decode_tps",
        *(f"s.{name}" for name in COUNTS),
        "s.round::int2 as round",
        "s.http_status::int2 as http_status",
        f"{flags()} as flags",
        "s.request_id",
        f"{served} as served_model",
        *(f"s.{name}" for name in RARE),
    ]
    return f"select {', '.join(columns)} from {SOURCE} s order by s.intended_at, s.run_id, s.round"


def packed_columns() -> list[str]:
    ordered = "order by round"
    columns = [
        f"array_agg(round(extract(epoch from sent_at - intended_at) * 1e6)::int8 {ordered}) as sent_us",
        *(f"array_agg({micros(name)} {ordered}) as {name}" for name in TIMINGS),
        f"array_agg(decode_tps::real {ordered}) as decode_tps",
        *(f"array_agg({name} {ordered}) as {name}" for name in COUNTS),
        f"array_agg(http_status::int2 {ordered}) as http_status",
        f"array_agg({flags()} {ordered}) as flags",
        f"array_agg(request_id {ordered}) as request_id",
        # One served model for the run when its samples agree (the usual case), else each sample's.
        "case when count(distinct served_model) <= 1 then max(served_model) end as served_model",
        f"case when count(distinct served_model) > 1 then array_agg(served_model {ordered}) end as served_models",
        # The rare fields: an array only when some sample of the run has one.
        *(f"case when count({name}) > 0 then array_agg({name}::text {ordered}) end as {name}" for name in RARE),
    ]
    return columns


def binary_record() -> str:
    """One sample as bytes, the way a packed run could hold it: each timing, count and flag as a fixed-width
    integer (-1: none), the request id as 16 bytes where it is a prefix and 32 hex digits (OpenAI's and
    vLLM's `chatcmpl-...`; the prefix is the run's), else as text; the rare fields left out (a run
    keeps them aside only when it has them)."""
    fields = [
        "int8send(coalesce(round(extract(epoch from sent_at - intended_at) * 1e6)::int8, -1))",
        *(f"int4send(coalesce({micros(name)}, -1))" for name in TIMINGS),
        "float4send(coalesce(decode_tps::real, -1))",
        *(f"int4send(coalesce({name}, -1))" for name in COUNTS),
        "int2send(coalesce(http_status, -1)::int2)",
        f"int2send({flags()})",
        "case when request_id ~ '^[a-z-]*[0-9a-f]{32}$' then decode(right(request_id, 32), 'hex') "
        "else convert_to(coalesce(request_id, ''), 'UTF8') end",
    ]
    return " || ".join(fields)


async def source_view(connection: asyncpg.Connection) -> str:
    """The samples as the candidate layouts read them, durations in milliseconds (`*_ms`), whichever
    layout the database has: doubles of milliseconds before migration 0020, int4 microseconds (`*_us`) since."""
    names = await connection.fetch(
        "select column_name from information_schema.columns "
        "where table_schema = 'public' and table_name = 'samples' order by ordinal_position"
    )
    columns = [
        f"{name} / 1000.0 as {name.removesuffix('_us')}_ms" if name.endswith("_us") else name
        for name in (row["column_name"] for row in names)
    ]
    return f"create view {SOURCE} as select {', '.join(columns)} from public.samples"


async def size(connection: asyncpg.Connection, relation: str) -> int:
    return int(await connection.fetchval("select pg_total_relation_size($1::regclass)", relation))


async def partitioned_size(connection: asyncpg.Connection, parent: str) -> int:
    return int(
        await connection.fetchval(
            "select coalesce(sum(pg_total_relation_size(relid)), 0) from pg_partition_tree($1::regclass)", parent
        )
    )


async def measure(url: str) -> list[tuple[str, float, float]]:
    connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        samples = int(await connection.fetchval("select count(*) from public.samples"))
        if not samples:
            raise SystemExit(f"{url}: no samples (fill it with bench/storage.py --db postgres --keep)")
        await connection.execute(f"drop schema if exists {SCHEMA} cascade; create schema {SCHEMA}")
        await connection.execute(
            f"create table {SCHEMA}.current as select * from public.samples order by intended_at, run_id, round"
        )
        await connection.execute(f"create index on {SCHEMA}.current (run_id)")
        await connection.execute(await source_view(connection))
        await connection.execute(f"create table {SCHEMA}.narrow as {narrow_select()}")
        await connection.execute(f"create index on {SCHEMA}.narrow (run_id)")
        await connection.execute(
            f"create table {SCHEMA}.packed as select run_id, intended_at, {', '.join(packed_columns())} "
            f"from {SOURCE} group by run_id, intended_at order by intended_at, run_id"
        )
        await connection.execute(f"create unique index on {SCHEMA}.packed (run_id)")
        await connection.execute(
            f"create table {SCHEMA}.packed_binary as select run_id, intended_at, "
            f"string_agg({binary_record()}, ''::bytea order by round) as samples, "
            "case when count(distinct served_model) <= 1 then max(served_model) end as served_model "
            f"from {SOURCE} group by run_id, intended_at order by intended_at, run_id"
        )
        await connection.execute(f"create unique index on {SCHEMA}.packed_binary (run_id)")
        # The run's own row and its four indexes, as `runs` has them, with the packed arrays added.
        await connection.execute(f"create table {SCHEMA}.runs as select * from public.runs order by intended_at, id")
        await connection.execute(
            f"create table {SCHEMA}.runs_packed as select r.*, {', '.join(_packed_names(prefix='p.'))} "
            f"from public.runs r join {SCHEMA}.packed p on p.run_id = r.id order by r.intended_at, r.id"
        )
        await connection.execute(
            f"create table {SCHEMA}.runs_binary as select r.*, p.samples, p.served_model "
            f"from public.runs r join {SCHEMA}.packed_binary p on p.run_id = r.id order by r.intended_at, r.id"
        )
        for table in ("runs", "runs_packed", "runs_binary"):
            await connection.execute(f"create unique index on {SCHEMA}.{table} (id, intended_at)")
            await connection.execute(f"create index on {SCHEMA}.{table} (series_id, started_at)")
            await connection.execute(f"create index on {SCHEMA}.{table} (started_at)")
            await connection.execute(
                f"create unique index on {SCHEMA}.{table} (series_id, job, intended_at) where job <> 'adhoc'"
            )
        await connection.execute(
            f"vacuum analyze {SCHEMA}.current, {SCHEMA}.narrow, {SCHEMA}.packed, {SCHEMA}.packed_binary"
        )
        runs = await size(connection, f"{SCHEMA}.runs")
        rows = [
            ("current (a copy, plain table)", await size(connection, f"{SCHEMA}.current"), runs),
            ("narrow", await size(connection, f"{SCHEMA}.narrow"), runs),
            ("packed (a row per run)", await size(connection, f"{SCHEMA}.packed"), runs),
            ("packed into runs", 0, await size(connection, f"{SCHEMA}.runs_packed")),
            ("packed binary (a row per run)", await size(connection, f"{SCHEMA}.packed_binary"), runs),
            ("packed binary into runs", 0, await size(connection, f"{SCHEMA}.runs_binary")),
        ]
        rows += await chunked(connection)
        blob = await connection.fetchval(f"select avg(pg_column_size(samples)) from {SCHEMA}.packed_binary")
        print(f"a run's packed samples: {float(blob):.0f} bytes (its samples' fixed fields and request ids)")
        live = await partitioned_size(connection, "public.samples"), await partitioned_size(connection, "public.runs")
        print(f"{samples:,} samples, {await connection.fetchval('select count(*) from public.runs'):,} runs")
        print(
            f"as stored (day partitions): samples {live[0] / samples:.0f} + runs {live[1] / samples:.0f} "
            f"= {(live[0] + live[1]) / samples:.0f} bytes a sample"
        )
        request_ids = await connection.fetchval("select avg(pg_column_size(request_id)) from public.samples")
        print(f"a request id alone: {float(request_ids or 0):.0f} bytes (a provider's id, as text)")
        return [(name, table / samples, run_share / samples) for name, table, run_share in rows]
    finally:
        await connection.execute(f"drop schema if exists {SCHEMA} cascade")
        await connection.close()


async def chunked(connection: asyncpg.Connection) -> list[tuple[str, int, int]]:
    """A row per series and day (and hour) of its samples, and of its runs, as compressed column-wise chunks
    (`monitor/store/chunk_codec.py`), each decoded again and compared with the rows it was made of."""
    runs_columns = [row["attname"] for row in await connection.fetch(_COLUMNS, "public.runs")]
    sample_columns = [row["attname"] for row in await connection.fetch(_COLUMNS, "public.samples")]
    sample_rows = await connection.fetch(
        f"select r.series_id as chunk_series, {', '.join('s.' + name for name in sample_columns)} "
        "from public.samples s join public.runs r on r.id = s.run_id and r.intended_at = s.intended_at "
        "order by r.series_id, s.intended_at, s.run_id, s.round"
    )
    run_rows = await connection.fetch(
        f"select {', '.join(runs_columns)} from public.runs order by series_id, intended_at, id"
    )
    out: list[tuple[str, int, int]] = []
    for span, name in (("day", "a series' day"), ("hour", "a series' hour")):
        table = f"{SCHEMA}.chunks_{span}"
        await connection.execute(
            f"create table {table} (series_id int4, period timestamptz, what text, payload bytea, "
            "primary key (series_id, period, what))"
        )
        records = []
        for what, rows, columns, series_of, at_of in (
            ("samples", sample_rows, sample_columns, "chunk_series", "intended_at"),
            ("runs", run_rows, runs_columns, "series_id", "intended_at"),
        ):
            groups: dict[tuple[Any, Any], list[tuple[Any, ...]]] = {}
            for row in rows:
                at = row[at_of]
                period = at.replace(minute=0, second=0, microsecond=0)
                if span == "day":
                    period = period.replace(hour=0)
                groups.setdefault((row[series_of], period), []).append(tuple(row[column] for column in columns))
            for (series, period), members in groups.items():
                payload = encode(members, len(columns))
                if decode(payload) != members:
                    raise SystemExit(f"chunk_codec: {what} of {series} {period} did not decode to its rows")
                records.append((series, period, what, payload))
        await connection.copy_records_to_table(
            f"chunks_{span}", schema_name=SCHEMA, records=records, columns=["series_id", "period", "what", "payload"]
        )
        await connection.execute(f"vacuum analyze {table}")
        total = await size(connection, table)
        samples_part = int(
            await connection.fetchval(f"select sum(pg_column_size(payload)) from {table} where what = 'samples'")
        )
        runs_part = int(
            await connection.fetchval(f"select sum(pg_column_size(payload)) from {table} where what = 'runs'")
        )
        # The table's overhead (rows, index, TOAST pointers) split in proportion to the payloads.
        samples_share = total * samples_part // (samples_part + runs_part)
        out.append((f"chunks: {name} of samples", samples_share, await size(connection, f"{SCHEMA}.runs")))
        out.append((f"chunks: {name}, samples and runs", total, 0))
    return out


_COLUMNS = (
    "select attname from pg_attribute where attrelid = $1::regclass and attnum > 0 and not attisdropped order by attnum"
)


def _packed_names(*, prefix: str) -> list[str]:
    names = ["sent_us", *TIMINGS, "decode_tps", *COUNTS, "http_status", "flags", "request_id"]
    names += ["served_model", "served_models", *RARE]
    # As columns of the run's row, named apart from its own (`error`).
    return [f"{prefix}{name} as sample_{name}" for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="a PostgreSQL database bench/storage.py filled (--keep)")
    args = parser.parse_args(argv)
    rows = asyncio.run(measure(args.url))
    print(f"{'layout':32s} {'samples':>8s} {'run':>6s} {'total':>6s}  bytes a sample, indexes included")
    for name, own, run in rows:
        print(f"{name:32s} {own:8.0f} {run:6.0f} {own + run:6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
