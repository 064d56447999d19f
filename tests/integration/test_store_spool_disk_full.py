"""The spool on a real, tiny file system that fills up: what it reports is what it keeps.

A 64 KiB tmpfs holds the spool while the database is away; a filler file takes most of it, so
appends fail part-way (the kernel writes what fits, then ENOSPC). Space is freed, more is spooled,
the process "restarts" (a new Spool on the same directory) and replays into the database: the runs
stored are exactly the runs the writer reported spooled, none of those it reported lost.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from monitor.store.engine import create_engine
from monitor.store.repository import Repository
from monitor.store.spool import Spool
from monitor.store.writer import ResultWriter, Saved
from tests.support.store_fixtures import T0, Outage, make_batch

pytest_plugins = ("tests.support.store_fixtures",)

TMPFS_BYTES = 64 * 1024


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, **fields: Any) -> None:
        self.seen.append((name, fields))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [fields for seen, fields in self.seen if seen == name]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the disk-full spool test runs as root (e.g. in .ci/run's container)")
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mountpoint)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); the disk-full spool test needs one")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def batch(index: int, *, small: bool) -> list[Any]:
    at = T0 + timedelta(minutes=5 * index)
    if small:
        return make_batch(at, targets=("qwen3-8b",), prompts=("short",))  # one run, about 6 KB
    return make_batch(at)  # four runs, about 23 KB


async def test_a_full_disk_loses_exactly_what_it_reports_lost(outage: Outage, tiny_disk: Path, tmp_path: Path) -> None:
    spool_dir = tiny_disk / "spool"
    engine = create_engine(outage.app_url, sqlite_busy_timeout_ms=outage.sqlite_busy_timeout_ms, connect_timeout_s=2)
    events = Events()
    spooled: set[Any] = set()
    lost: set[Any] = set()
    index = 0

    async def save(writer: ResultWriter, *, small: bool) -> Saved:
        nonlocal index
        runs = batch(index, small=small)
        index += 1
        outcome = await writer.save(runs)
        assert outcome in (Saved.SPOOLED, Saved.LOST)
        (spooled if outcome is Saved.SPOOLED else lost).update(run.run_id for run, _ in runs)
        return outcome

    try:
        await outage.cut()
        filler = tiny_disk / "filler"
        filler.write_bytes(b"\0" * (TMPFS_BYTES - 28 * 1024))
        with Spool(spool_dir, max_bytes=10**7, on_event=events) as spool:
            writer = ResultWriter(Repository(engine), spool, on_event=events, db_timeout_s=2)
            # Alternately four runs and one: a batch can tear mid-record or between records.
            outcomes = [await save(writer, small=bool(i % 2)) for i in range(6)]
            assert Saved.LOST in outcomes, outcomes  # the disk filled up
            filler.unlink()  # space again: these land behind whatever the full disk left
            outcomes += [await save(writer, small=True) for _ in range(3)]
            assert outcomes[-3:] == [Saved.SPOOLED] * 3, (outcomes, events.named("results_lost"))
            assert writer.lost_runs == len(lost) and writer.spooled_runs == len(spooled)
        await outage.restore()
        # A restart: a new process opens the spool and replays it.
        with Spool(spool_dir, max_bytes=10**7, on_event=events) as spool:
            assert spool.depth == len(spooled)
            writer = ResultWriter(Repository(engine), spool, on_event=events, db_timeout_s=10)
            assert await writer.drain() == len(spooled)
            assert spool.depth == 0
            assert spool.rejected == 0, events.named("spool_record_rejected")
        async with engine.connect() as connection:
            stored = {str(i).replace("-", "") for i in await connection.scalars(sa.text("SELECT id FROM runs"))}
    finally:
        await engine.dispose()
    assert stored == {run_id.hex for run_id in spooled}
    assert not stored & {run_id.hex for run_id in lost}
