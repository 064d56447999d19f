"""Migrations on both databases (pytest-alembic's four checks), the start-up gate and `db` commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.cli import build_parser
from monitor.commands import db as cli
from monitor.store import migrate, partitions
from monitor.store.engine import DatabaseUnavailable, create_engine
from monitor.store.models import metadata
from monitor.store.records import MAX_STORED_MS, STORED_DURATIONS
from monitor.store.repository import Repository
from tests.support.ports import free_port
from tests.support.store_fixtures import T0, Backend, make_batch

pytest_plugins = ("tests.support.store_fixtures",)

RESULT_TABLES = {"series", "runs", "samples", "rollups_hourly", "rollup_pending", "calibration"}
COORDINATION_TABLES = {
    "job_ticks",
    "incidents",
    "detector_state",
    "alert_outbox",
    "alert_deliveries",
    "incident_groups",
    "incident_group_scopes",
}
TRIAGE_TABLES = {"incident_triage", "annotations"}
BUDGET_TABLES = {"budget_holds"}  # migration 0016
OVERVIEW_TABLES = {"overview_summary", "overview_summary_state"}  # migration 0019
COLD_TABLES = {"cold_chunks"}  # migration 0021


async def tables(engine: AsyncEngine) -> set[str]:
    """The schema's tables (not the day partitions of runs and samples on PostgreSQL)."""
    return {name for name in await all_tables(engine) if not partitions.is_partition(name)}


async def all_tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        return set(await connection.run_sync(lambda sync: sa.inspect(sync).get_table_names()))


def test_the_migrations_have_a_single_head() -> None:
    assert migrate.heads() == [migrate.head()]


async def test_it_upgrades_from_empty_downgrades_to_base_and_upgrades_again(empty_backend: Backend) -> None:
    engine = empty_backend.engine()
    try:
        assert await migrate.current(engine) is None
        assert await migrate.upgrade(engine) == (None, migrate.head())
        assert await tables(
            engine
        ) == RESULT_TABLES | COORDINATION_TABLES | TRIAGE_TABLES | BUDGET_TABLES | OVERVIEW_TABLES | COLD_TABLES | {
            "alembic_version"
        }
        # Every downgrade works, one step at a time.
        assert await migrate.downgrade(engine, "0001") == (migrate.head(), "0001")
        assert await tables(engine) == RESULT_TABLES | {"alembic_version"}
        assert await migrate.downgrade(engine, "base") == ("0001", None)
        assert await tables(engine) == {"alembic_version"}
        assert await migrate.upgrade(engine) == (None, migrate.head())
        assert await migrate.check(engine) == []
    finally:
        await engine.dispose()


async def test_two_processes_upgrading_at_once_both_succeed(empty_backend: Backend) -> None:
    results = await asyncio.gather(migrate.upgrade(empty_backend.url), migrate.upgrade(empty_backend.url))
    assert sorted(results, key=str) == sorted([(None, migrate.head()), (migrate.head(), migrate.head())], key=str)


async def test_the_models_match_the_migrations(backend: Backend) -> None:
    assert await migrate.check(backend.url) == []


async def test_check_names_a_model_change_without_a_migration(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    changed = sa.MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["runs"].append_column(sa.Column("region", sa.Text(), nullable=True))
    monkeypatch.setattr(migrate, "metadata", changed)
    assert await migrate.check(backend.url) == ["column runs.region: in the models but no migration adds it"]


async def test_runs_stored_twice_before_the_unique_tick_are_removed_on_upgrade(empty_backend: Backend) -> None:
    engine = empty_backend.engine()
    try:
        # Today's repository writes today's columns: store at head, then step back to 0002 (the
        # data stays) and copy every tick's runs as a second replica would have stored them.
        await migrate.upgrade(engine)
        first = make_batch(T0)  # one tick, four series
        adhoc = make_batch(T0, job="adhoc") + make_batch(T0, job="adhoc")
        await Repository(engine).save_runs(first + adhoc)
        await migrate.downgrade(engine, "0002")
        async with engine.begin() as connection:
            twin_ids = await connection.run_sync(_store_a_twin_of_every_tick_run)
            await connection.execute(sa.text("DELETE FROM rollup_pending"))
        await migrate.upgrade(engine)
        async with engine.connect() as connection:
            runs = set((await connection.scalars(sa.text("SELECT id FROM runs WHERE job <> 'adhoc'"))).all())
            adhoc_runs = await connection.scalar(sa.text("SELECT count(*) FROM runs WHERE job = 'adhoc'"))
            kept_series = await connection.scalar(
                sa.text("SELECT count(DISTINCT series_id) FROM runs WHERE job <> 'adhoc'")
            )
            samples = await connection.scalar(sa.text("SELECT count(*) FROM samples"))
            orphans = await connection.scalar(
                sa.text("SELECT count(*) FROM samples WHERE run_id NOT IN (SELECT id FROM runs)")
            )
            pending = await connection.scalar(sa.text("SELECT count(*) FROM rollup_pending"))
        kept = {str(r).replace("-", "") for r in runs}
        assert len(kept) == 4
        assert kept <= {run.run_id.hex for run, _ in first} | twin_ids
        assert len(twin_ids) == 4 and kept_series == 4  # one run left per (series, tick)
        assert orphans == 0
        assert adhoc_runs == 8
        assert samples == (4 + 8) * 6
        assert pending == 4  # the duplicates' hours are rolled up again
        assert await migrate.check(engine) == []
    finally:
        await engine.dispose()


async def test_samples_stored_before_0011_read_as_undisturbed_and_new_ones_keep_their_self_delay(
    empty_backend: Backend,
) -> None:
    engine = empty_backend.engine()
    try:
        await migrate.upgrade(engine)
        old = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
        repository = Repository(engine)
        await repository.save_runs(old)
        assert await migrate.downgrade(engine, "0010") == (migrate.head(), "0010")
        async with engine.connect() as connection:
            columns = await connection.run_sync(
                lambda sync: {c["name"] for c in sa.inspect(sync).get_columns("samples")}
            )
        assert not {"self_delay_ms", "disturbed"} & columns
        assert await migrate.upgrade(engine) == ("0010", migrate.head())
        run = old[0][0]
        [(_, stored)] = await repository.load_runs(run.series, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
        assert {(s.self_delay_ms, s.disturbed) for s in stored} == {(None, False)}
        new = make_batch(T0 + timedelta(minutes=5), targets=("qwen3-8b",), prompts=("short",))
        for index, sample in enumerate(new[0][1]):
            sample.self_delay_ms = 0.25 if index else 48.5
            sample.disturbed = not index
        await repository.save_runs(new)
        loaded = await repository.load_runs(run.series, T0 + timedelta(minutes=4), T0 + timedelta(hours=1))
        assert [(s.self_delay_ms, s.disturbed) for s in loaded[0][1]] == [
            (s.self_delay_ms, s.disturbed) for s in new[0][1]
        ]
        assert await migrate.check(engine) == []
    finally:
        await engine.dispose()


async def test_rollups_with_raw_runs_left_are_recomputed_with_the_new_columns_after_upgrade(
    empty_backend: Backend,
) -> None:
    engine = empty_backend.engine()
    repository = Repository(engine)
    try:
        await migrate.upgrade(engine)
        await repository.save_runs(make_batch(T0) + make_batch(T0 + timedelta(hours=1)))
        assert await repository.rollup(T0 + timedelta(hours=3)) == 8  # four series, two hours
        await migrate.downgrade(engine, "0006")
        async with engine.begin() as connection:
            # An hour whose raw runs retention has deleted: nothing to recompute it from.
            await connection.execute(
                sa.text(
                    "INSERT INTO rollups_hourly (series_id, hour, samples, errors, ttft_p50_ms) "
                    "SELECT id, :hour, 5, 0, 300.0 FROM series"
                ),
                {
                    "hour": T0 - timedelta(days=40)
                    if engine.dialect.name == "postgresql"
                    else "2025-12-01 00:00:00.000000"
                },
            )
        await migrate.upgrade(engine)
        async with engine.connect() as connection:
            pending = await connection.scalar(sa.text("SELECT count(*) FROM rollup_pending"))
        assert pending == 8
        assert await repository.rollup(T0 + timedelta(hours=3)) == 8
        async with engine.connect() as connection:
            filled = (
                await connection.execute(
                    sa.text(
                        "SELECT count(ttft_p10_ms), count(ttfb_ms_p50), count(prompt_tokens_p50), count(*) "
                        "FROM rollups_hourly"
                    )
                )
            ).one()
        assert tuple(filled) == (8, 8, 8, 12)
        assert await migrate.check(engine) == []
    finally:
        await engine.dispose()


def _store_a_twin_of_every_tick_run(connection: sa.Connection) -> set[str]:
    """Copy each non-ad-hoc run and its samples under new ids; the new run ids, as hex."""
    meta = sa.MetaData()
    runs = sa.Table("runs", meta, autoload_with=connection)
    samples = sa.Table("samples", meta, autoload_with=connection)
    native = connection.dialect.name == "postgresql"

    def new_id() -> object:
        return uuid.uuid4() if native else uuid.uuid4().hex

    twins: set[str] = set()
    for run in connection.execute(sa.select(runs).where(runs.c.job != "adhoc")).mappings().all():
        twin_id = new_id()
        twins.add(twin_id.hex if isinstance(twin_id, uuid.UUID) else str(twin_id))
        connection.execute(runs.insert().values({**run, "id": twin_id}))
        for sample in connection.execute(sa.select(samples).where(samples.c.run_id == run["id"])).mappings().all():
            connection.execute(samples.insert().values({**sample, "id": new_id(), "run_id": twin_id}))
    return twins


async def test_the_daemon_refuses_an_empty_schema_naming_the_fix(empty_backend: Backend) -> None:
    engine = empty_backend.engine()
    try:
        with pytest.raises(migrate.SchemaBehind) as caught:
            await migrate.ensure_current(engine)
        assert str(caught.value) == (
            f"the database schema is empty, this version needs {migrate.head()}; run `ttft-monitor db upgrade`"
        )
        await migrate.upgrade(engine, "0001")
        with pytest.raises(migrate.SchemaBehind) as caught:
            await migrate.ensure_current(engine)
        assert str(caught.value) == (
            f"database schema is at 0001, this version needs {migrate.head()}; run `ttft-monitor db upgrade`"
        )
        await migrate.upgrade(engine)
        assert await migrate.ensure_current(engine) == migrate.head()
    finally:
        await engine.dispose()


async def test_the_daemon_refuses_a_schema_from_a_newer_version(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(sa.text("UPDATE alembic_version SET version_num = '0099'"))
    with pytest.raises(migrate.SchemaBehind, match="migrated by a newer ttft-monitor: upgrade ttft-monitor") as caught:
        await migrate.ensure_current(engine)
    assert (caught.value.current, caught.value.newer) == ("0099", True)


async def test_an_unreachable_server_is_one_line_naming_host_and_what_to_check() -> None:
    port = free_port()
    engine = create_engine(f"postgresql+asyncpg://ttft:s3cret-pw@127.0.0.1:{port}/ttft", connect_timeout_s=2)
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            await migrate.ensure_current(engine)
    finally:
        await engine.dispose()
    message = str(caught.value)
    assert message == (
        f"cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused; check that the server is running "
        "and listening there, and the host and port in database.url"
    )


async def test_a_missing_database_says_how_to_create_it(postgres_backend: Backend) -> None:
    url = sa.make_url(postgres_backend.url).set(database="ttft_no_such_db")
    with pytest.raises(DatabaseUnavailable, match="database 'ttft_no_such_db' does not exist on PostgreSQL at"):
        await migrate.current(url)


# ---------------------------------------------------------------- `ttft-monitor db ...`


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))  # the real registry, as `ttft-monitor` parses


def db(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(parse("db", *argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def config_file(tmp_path: Path, url: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(f"database:\n  url: {url}\n  state_dir: {tmp_path / 'state'}\n")
    return str(path)


def test_db_commands_upgrade_report_check_and_downgrade(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'db' / 'ttft.db'}"
    config = config_file(tmp_path, url)
    head = migrate.head()

    result = db("current", "--config", config)
    assert result == (
        0,
        f"{url}: (empty) - the database schema is empty, this version needs {head}; run `ttft-monitor db upgrade`\n",
        "",
    ), result
    result = db("check", "--config", config)
    assert result == (
        1,
        f"{url}: cannot compare: the database schema is empty, this version needs {head}; run `ttft-monitor db "
        "upgrade`, then check again\n",
        "",
    ), result  # the fix is `db upgrade`: no "write a migration" advice

    assert db("upgrade", "0001", "--config", config) == (0, f"{url}: schema upgraded from (empty) to 0001\n", "")
    assert db("upgrade", "--config", config) == (0, f"{url}: schema upgraded from 0001 to {head}\n", "")
    assert db("upgrade", "--config", config) == (0, f"{url}: schema already at {head}\n", "")
    assert db("current", "--config", config) == (0, f"{url}: {head} (head: up to date)\n", "")
    assert db("check", "--config", config) == (
        0,
        f"{url}: the models match the migrations (schema at {head})\n",
        "",
    )
    assert db("downgrade", "base", "--config", config) == (0, f"{url}: schema downgraded from {head} to (empty)\n", "")


def test_db_commands_read_the_config_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTFT_CONFIG", config_file(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'env.db'}"))
    code, out, err = db("upgrade")
    assert code == 0, err
    assert str(tmp_path / "env.db") in out


def test_an_unknown_revision_is_a_usage_error(tmp_path: Path) -> None:
    config = config_file(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    code, out, err = db("upgrade", "0042", "--config", config)
    assert (code, out) == (2, ""), err
    assert err.startswith("ttft-monitor db upgrade: Can't locate revision identified by '0042'")
    assert "Traceback" not in err


def test_a_bad_config_is_reported_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("database:\n  url: mysql://x\n")
    code, out, err = db("current", "--config", str(path))
    assert (code, out) == (2, "")
    assert "database.url" in err and "not supported" in err


def test_an_unreachable_database_is_exit_3_without_the_password(tmp_path: Path) -> None:
    port = free_port()
    config = config_file(tmp_path, f"postgresql+asyncpg://ttft:hunter2-secret@127.0.0.1:{port}/ttft")
    code, out, err = db("upgrade", "--config", config)
    assert (code, out) == (3, ""), err
    assert err == (
        f"ttft-monitor db upgrade: cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused; check "
        "that the server is running and listening there, and the host and port in database.url\n"
    )
    assert "hunter2" not in out + err


def test_outputs_mask_the_password(postgres_backend: Backend, tmp_path: Path) -> None:
    url = sa.make_url(postgres_backend.url).set(password="not-needed-trust-auth").render_as_string(hide_password=False)
    code, out, err = db("current", "--config", config_file(tmp_path, url))
    assert code == 0, err
    assert "not-needed-trust-auth" not in out + err
    assert ":***@" in out


async def test_samples_stored_before_0013_have_no_reasoning_count_and_new_ones_keep_theirs(
    empty_backend: Backend,
) -> None:
    engine = empty_backend.engine()
    try:
        await migrate.upgrade(engine)
        repository = Repository(engine)
        old = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
        await repository.save_runs(old)
        assert await migrate.downgrade(engine, "0012") == (migrate.head(), "0012")
        assert await migrate.upgrade(engine) == ("0012", migrate.head())
        series = old[0][0].series
        [(_, stored)] = await repository.load_runs(series, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
        assert {(s.reasoning_tokens, s.reasoning_tokens_estimated) for s in stored} == {(None, False)}
        new = make_batch(T0 + timedelta(minutes=5), targets=("qwen3-8b",), prompts=("short",))
        for index, sample in enumerate(new[0][1]):
            sample.reasoning_tokens, sample.reasoning_tokens_estimated = 950 + index, bool(index % 2)
        await repository.save_runs(new)
        loaded = await repository.load_runs(series, T0 + timedelta(minutes=4), T0 + timedelta(hours=1))
        assert [(s.reasoning_tokens, s.reasoning_tokens_estimated) for s in loaded[0][1]] == [
            (950 + index, bool(index % 2)) for index in range(len(new[0][1]))
        ]
        assert await migrate.check(engine) == []
    finally:
        await engine.dispose()


async def test_samples_stored_before_0014_have_no_fingerprint_and_new_ones_keep_theirs(empty_backend: Backend) -> None:
    engine = empty_backend.engine()
    try:
        await migrate.upgrade(engine)
        repository = Repository(engine)
        old = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
        await repository.save_runs(old)
        assert await migrate.downgrade(engine, "0013") == (migrate.head(), "0013")
        assert await migrate.upgrade(engine) == ("0013", migrate.head())
        series = old[0][0].series
        [(_, stored)] = await repository.load_runs(series, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
        assert {s.fingerprint for s in stored} == {None}
        [(old_run, _)] = await repository.load_runs(series, T0 - timedelta(hours=1), T0 + timedelta(minutes=1))
        assert old_run.canary is None
        new = make_batch(T0 + timedelta(minutes=5), targets=("qwen3-8b",), prompts=("short",))
        for index, sample in enumerate(new[0][1]):
            # A hostile server's fingerprint: NUL and far too long; stored cleaned and capped.
            sample.fingerprint = "fp_a1" if index else "fp\x00" + "b" * 400
        new = [(dataclasses.replace(run, canary="0123456789abcdef"), samples) for run, samples in new]
        await repository.save_runs(new)
        loaded = await repository.load_runs(series, T0 + timedelta(minutes=4), T0 + timedelta(hours=1))
        assert loaded[0][0].canary == "0123456789abcdef"
        prints = [s.fingerprint for s in loaded[0][1]]
        assert prints[1:] == ["fp_a1"] * (len(prints) - 1)
        assert prints[0] is not None and prints[0].startswith("fp\ufffdbbb") and len(prints[0]) <= 256
        assert await migrate.check(engine) == []
    finally:
        await engine.dispose()


async def test_0017_keeps_every_run_and_sample_in_day_partitions_and_back(empty_backend: Backend) -> None:
    """On PostgreSQL runs and samples become day partitions (a day with data, and yesterday to a week
    ahead; older history in the default partition); nothing is lost either way, and a sample stored
    without an intended time gets its run's (SQLite too, where the tables stay as they are)."""
    engine = empty_backend.engine()
    try:
        # Today's repository writes today's columns: store at head, then step back to 0016 (the data stays).
        await migrate.upgrade(engine)
        repository = Repository(engine)
        now = datetime.now(UTC).replace(microsecond=0)
        recent, old = now - timedelta(days=3), T0  # T0 is months back: past the backfill, default partition
        batch = make_batch(recent) + make_batch(old, targets=("qwen3-8b",))
        await repository.save_runs(batch)
        assert await migrate.downgrade(engine, "0016") == (migrate.head(), "0016")
        async with engine.begin() as connection:
            # Written by an older version: a sample without an intended time.
            run_id = batch[0][0].run_id
            await connection.execute(
                sa.text("UPDATE samples SET intended_at = NULL WHERE run_id = :run AND round = 1"),
                {"run": run_id if engine.dialect.name == "postgresql" else run_id.hex},
            )
            assert await connection.scalar(sa.text("SELECT count(*) FROM samples WHERE intended_at IS NULL")) == 1
        assert await migrate.upgrade(engine) == ("0016", migrate.head())
        assert await migrate.check(engine) == []
        by_series = {run.series: run for run, _ in batch}
        for series, run in by_series.items():
            [(stored, samples)] = await repository.load_runs(
                series, run.started_at - timedelta(minutes=1), run.started_at + timedelta(minutes=1)
            )
            assert stored.run_id == run.run_id
            assert len(samples) == len(next(s for r, s in batch if r.run_id == run.run_id))
            assert {s.intended_at for s in samples} == {run.intended_at}
        if empty_backend.name == "postgres":
            names = await all_tables(engine)
            for table in partitions.PARTITIONED:
                for day in [recent.date(), *partitions.days_around(now)]:
                    assert partitions.partition_name(table, day) in names
                assert partitions.default_name(table) in names
                assert partitions.partition_name(table, old.date()) not in names
            async with engine.connect() as connection:
                where = "SELECT tableoid::regclass::text, count(*) FROM runs GROUP BY 1"
                rows = await connection.execute(sa.text(where))
                placed = {name: count for name, count in rows}
            assert placed == {partitions.partition_name("runs", recent.date()): 4, "runs_default": 2}
        total = await _counts(engine)
        assert await migrate.downgrade(engine, "0016") == (migrate.head(), "0016")
        assert await tables(engine) == await all_tables(engine)  # no partition left behind
        assert await _counts(engine) == total
        assert await migrate.upgrade(engine) == ("0016", migrate.head())
        assert await _counts(engine) == total
    finally:
        await engine.dispose()


async def _counts(engine: AsyncEngine) -> tuple[int, int]:
    async with engine.connect() as connection:
        runs = await connection.scalar(sa.text("SELECT count(*) FROM runs"))
        samples = await connection.scalar(sa.text("SELECT count(*) FROM samples"))
    return int(runs or 0), int(samples or 0)


async def test_0020_keeps_every_duration_to_the_microsecond_and_drops_the_sample_id(empty_backend: Backend) -> None:
    """0020 stores durations as int4 microseconds and no sample id: each value read back is the one stored
    before, to the microsecond; a null stays null; one beyond an int4 of microseconds is kept at its bound."""
    engine = empty_backend.engine()
    postgres = engine.dialect.name == "postgresql"
    try:
        await migrate.upgrade(engine)
        repository = Repository(engine)
        batch = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
        await repository.save_runs(batch)
        assert await migrate.downgrade(engine, "0019") == (migrate.head(), "0019")
        run, samples = batch[0]
        async with engine.begin() as connection:
            # What an older version stored: durations to the nanosecond, and one absurdly long.
            await connection.execute(
                sa.text(
                    "UPDATE samples SET ttft_ms = 123.4567891, total_ms = 1e10, dns_ms = NULL, self_delay_ms = -0.0004 "
                    "WHERE run_id = :run AND round = 2"
                ),
                {"run": run.run_id if postgres else run.run_id.hex},
            )
        before = await _counts(engine)
        assert await migrate.upgrade(engine) == ("0019", migrate.head())
        assert await _counts(engine) == before
        assert await migrate.check(engine) == []
        async with engine.connect() as connection:
            columns = await connection.run_sync(
                lambda sync: {c["name"]: c["type"] for c in sa.inspect(sync).get_columns("samples")}
            )
        assert "id" not in columns and not any(
            name.endswith("_ms") and name != "server_processing_ms" for name in columns
        )
        assert all(isinstance(columns[f"{name}_us"], sa.Integer) for name in ("ttft", "total", "gap_max", "self_delay"))
        [(_, stored)] = await repository.load_runs(run.series, T0 - timedelta(hours=1), T0 + timedelta(hours=1))
        changed = next(s for s in stored if s.round == 2)
        assert (changed.ttft_ms, changed.total_ms, changed.dns_ms, changed.self_delay_ms) == (
            123.457,
            MAX_STORED_MS,
            None,
            0.0,
        )
        for original, read in zip(samples, stored, strict=True):
            for name in STORED_DURATIONS:
                if original.round != 2 or name not in ("ttft_ms", "total_ms", "dns_ms", "self_delay_ms"):
                    assert getattr(read, name) == getattr(original, name), (original.round, name)
        # And back: milliseconds again (to the microsecond), every sample with an id of its own.
        assert await migrate.downgrade(engine, "0019") == (migrate.head(), "0019")
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    sa.text("SELECT id, round, ttft_ms FROM samples WHERE run_id = :run ORDER BY round"),
                    {"run": run.run_id if postgres else run.run_id.hex},
                )
            ).all()
        assert [(r, ttft) for _, r, ttft in rows] == [
            (s.round, 123.457 if s.round == 2 else s.ttft_ms) for s in samples
        ]
        assert len({row_id for row_id, _, _ in rows}) == len(samples) and None not in {row_id for row_id, _, _ in rows}
        assert await _counts(engine) == before
    finally:
        await engine.dispose()
