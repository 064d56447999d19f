"""Migration 0020 (a sample's durations as int4 microseconds, no sample id) on PostgreSQL: its time and
the bytes a sample before and after, on one history.

Fills N samples (default 5,000,000) over S series through `Repository.save_runs` (bench/storage.py's
runs: 1 warm-up + 5 measured samples every 30 minutes, in day partitions), then:

1. downgrade to 0019 (the samples as they were: doubles of milliseconds and a UUID each), timed;
2. upgrade 0019 -> 0020 (one ALTER TABLE rewriting every day partition), timed;

and prints the database's bytes a sample at 0020, at 0019 and at 0020 again (indexes and the runs'
share included, as bench/storage.py counts them; each measured after VACUUM FULL ANALYZE, so that
the rewrite's own dead space does not count for either side).

    .venv/bin/python bench/narrow_samples.py [--samples 5000000] [--series 500] [--keep]
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from partitions import fill, fill_arguments
from storage import database_size, postgres_scratch

from monitor.store import migrate
from monitor.store.engine import create_engine, display_url


async def bytes_per_sample(url: str) -> tuple[float, int]:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.execute(sa.text("VACUUM FULL ANALYZE"))
            samples = int(await connection.scalar(sa.text("SELECT count(*) FROM samples")) or 0)
        return await database_size(engine, "postgres", None) / samples, samples
    finally:
        await engine.dispose()


async def main() -> int:
    args = fill_arguments(__doc__.split("\n\n")[0]).parse_args()
    print(f"# bench/narrow_samples.py on {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    url, drop = await postgres_scratch(args.postgres_url)
    try:
        print(f"== {display_url(url)}, {args.samples:,} samples over {args.series} series")
        await migrate.upgrade(url)
        await fill(url, args, datetime.now(UTC))
        narrow, samples = await bytes_per_sample(url)
        began = time.perf_counter()
        await migrate.downgrade(url, "0019")
        down = time.perf_counter() - began
        wide, _ = await bytes_per_sample(url)
        began = time.perf_counter()
        await migrate.upgrade(url, "0020")
        up = time.perf_counter() - began
        again, _ = await bytes_per_sample(url)
        print(f"   downgrade 0020 -> 0019: {samples:,} samples in {down:.1f} s")
        print(f"   upgrade 0019 -> 0020:   {samples:,} samples in {up:.1f} s ({samples / up:,.0f} samples/s)")
        print(
            f"   bytes a sample with indexes: {wide:,.0f} at 0019, {again:,.0f} after 0020 "
            f"({narrow:,.0f} stored at 0020 from the start)"
        )
    finally:
        if args.keep:
            print(f"kept: {url}")
        else:
            await drop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
