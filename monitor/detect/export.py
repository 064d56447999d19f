"""`ttft-monitor replay --export`: the stored history as a samples CSV, so users tune on their own data."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TextIO

from monitor.detect.replay import SampleRow, write_samples_csv
from monitor.store.records import SeriesKey
from monitor.store.repository import Repository

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Samples are read a day of runs at a time, so memory stays flat whatever the retention.
CHUNK = timedelta(days=1)


def series_names(keys: Sequence[SeriesKey]) -> dict[SeriesKey, str]:
    """`target/prompt/location` for each series (the target's name finds its SLO on replay); series
    that would share a name (the target's model or provider changed) get `[provider:model]` added."""
    plain = {key: f"{key.target}/{key.prompt}/{key.location}" for key in keys}
    taken = list(plain.values())
    return {
        key: name if taken.count(name) == 1 else f"{name}[{key.provider}:{key.model}]" for key, name in plain.items()
    }


async def stored_rows(
    repository: Repository, keys: Sequence[SeriesKey], *, since: datetime | None = None
) -> AsyncIterator[SampleRow]:
    """Every measured sample of the series `keys` started since `since` (default: all), series by series."""
    now = datetime.now(UTC)
    for key, name in series_names(keys).items():
        runs = await repository.runs_between(key, since or EPOCH, now + CHUNK)
        if not runs:
            continue
        start = runs[0].started_at
        while start <= runs[-1].started_at:
            for run, samples in await repository.load_runs(key, start, start + CHUNK):
                run_id = str(run.run_id)
                for sample in samples:
                    if sample.warmup:
                        continue
                    yield SampleRow(
                        timestamp=sample.sent_at or sample.intended_at or run.started_at,
                        series=name,
                        ttft_ms=sample.ttft_ms,
                        error=sample.error.value if sample.error is not None else None,
                        run_id=run_id,
                    )
            start += CHUNK


async def export_samples(repository: Repository, stream: TextIO, *, since: datetime | None = None) -> int:
    """Write the stored history to `stream` as a samples CSV; the number of samples written."""
    keys = await repository.series_list()  # before writing anything: fails first if the schema is missing
    write_samples_csv([], stream)
    count = 0
    batch: list[SampleRow] = []
    async for row in stored_rows(repository, keys, since=since):
        batch.append(row)
        if len(batch) >= 10_000:
            count += write_samples_csv(batch, stream, header=False)
            batch.clear()
    return count + write_samples_csv(batch, stream, header=False)
