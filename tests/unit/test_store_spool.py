"""The local spool on a real file system: durable, ordered, bounded, and loud when it drops."""

from __future__ import annotations

import dataclasses
import json
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from monitor.store.spool import Spool, SpoolError, SpoolFull, encode
from tests.support.store_fixtures import T0, make_batch


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, **fields: Any) -> None:
        self.seen.append((name, fields))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [fields for seen, fields in self.seen if seen == name]


def batches(count: int) -> list[list[Any]]:
    return [make_batch(T0 + timedelta(minutes=5 * i), targets=("qwen3-8b",), prompts=("short",)) for i in range(count)]


def run_ids(entries: list[Any]) -> list[Any]:
    return [entry.run.run_id for entry in entries]


def test_it_returns_records_in_the_order_they_were_written(tmp_path: Path) -> None:
    written = batches(5)
    with Spool(tmp_path, max_bytes=10**7) as spool:
        for batch in written:
            spool.append(batch)
        assert spool.depth == 5
        entries = spool.peek(100)
    assert run_ids(entries) == [batch[0][0].run_id for batch in written]
    assert [(e.run, e.samples) for e in entries] == [batch[0] for batch in written]


def test_records_survive_a_crash_and_are_replayed_once(tmp_path: Path) -> None:
    written = batches(6)
    spool = Spool(tmp_path, max_bytes=10**7, segment_bytes=1)  # one segment per record
    for batch in written:
        spool.append(batch)
    spool.ack(spool.peek(2)[-1])
    spool.close()  # the process dies here; nothing else is flushed

    reopened = Spool(tmp_path, max_bytes=10**7)
    assert reopened.depth == 4
    entries = reopened.peek(100)
    assert run_ids(entries) == [batch[0][0].run_id for batch in written[2:]]
    reopened.ack(entries[-1])
    assert (reopened.depth, reopened.bytes) == (0, 0)
    reopened.close()
    with Spool(tmp_path, max_bytes=10**7) as again:
        assert again.peek(100) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cursor", "lock"]


def test_acknowledging_part_of_a_segment_survives_a_restart(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=10**7) as spool:
        for batch in batches(4):
            spool.append(batch)
        first = spool.peek(3)
        spool.ack(first[1])
        assert spool.depth == 2
    with Spool(tmp_path, max_bytes=10**7) as spool:
        assert spool.depth == 2
        assert spool.peek(10)[0].run == first[2].run
        spool.append(batches(1)[0])  # a new process appends to a new segment
        assert spool.depth == 3


def test_a_line_torn_by_a_crash_is_reported_and_skipped(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=10**7) as spool:
        spool.append(batches(1)[0])
    segment = next(tmp_path.glob("0*.jsonl"))
    with segment.open("ab") as handle:
        handle.write(encode(*batches(1)[0][0])[:-40])  # the write the crash interrupted
    size_before_the_crash = segment.stat().st_size
    events = Events()
    with Spool(tmp_path, max_bytes=10**7, on_event=events) as spool:
        assert spool.depth == 1
        assert spool.torn_tails == 1
        assert segment.stat().st_size == len(encode(*batches(1)[0][0]))  # the fragment is cut off
        assert size_before_the_crash > segment.stat().st_size
        assert len(spool.peek(10)) == 1
        spool.append(batches(1)[0])
        assert len(spool.peek(10)) == 2
    [torn] = events.named("spool_torn_tail")
    assert torn["segment"] == segment.name and torn["bytes"] > 0 and torn["action"] == "truncated"
    with Spool(tmp_path, max_bytes=10**7, on_event=events) as spool:
        assert spool.torn_tails == 0  # reported once
        assert [entry.problem for entry in spool.peek(10)] == [None, None]


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past `limit` bytes fail part-way with EFBIG, as on a full disk (no root needed)."""
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_an_append_that_fails_part_way_leaves_nothing_behind(tmp_path: Path) -> None:
    first, big, after = batches(1)[0], make_batch(T0 + timedelta(hours=1)), batches(3)[2]
    with Spool(tmp_path, max_bytes=10**7) as spool:
        spool.append(first)
        segment = next(tmp_path.glob("0*.jsonl"))
        size = segment.stat().st_size
        with file_size_limit(size + 8000), pytest.raises(OSError):
            spool.append(big)  # four records: the first fits, the second is cut
        assert segment.stat().st_size == size
        assert spool.depth == 1
        spool.append(after)  # lands right behind the first record, not behind a fragment
        assert [e.run.run_id if e.run else e.problem for e in spool.peek(10)] == run_ids_of(first + after)
    with Spool(tmp_path, max_bytes=10**7) as spool:  # and after a restart: the failed batch never comes back
        assert spool.torn_tails == 0
        assert [e.run.run_id if e.run else e.problem for e in spool.peek(10)] == run_ids_of(first + after)


def run_ids_of(batch: list[Any]) -> list[Any]:
    return [run.run_id for run, _ in batch]


def test_a_record_cut_short_or_damaged_is_never_read_as_another(tmp_path: Path) -> None:
    line = encode(*batches(1)[0][0])
    glued = line[:-300] + line  # a torn record with the next one written behind it
    flipped = line[:100] + bytes([line[100] ^ 0x01]) + line[101:]
    with Spool(tmp_path, max_bytes=10**7) as spool:
        spool.append(batches(1)[0])
    segment = next(tmp_path.glob("0*.jsonl"))
    segment.write_bytes(glued + flipped + line)
    with Spool(tmp_path, max_bytes=10**7) as spool:
        first, second, third = spool.peek(10)
    assert first.run is None and "cut or damaged" in (first.problem or "")
    assert second.run is None and "checksum" in (second.problem or "")
    assert third.run is not None and third.problem is None


def test_records_spooled_by_the_previous_version_are_still_read(tmp_path: Path) -> None:
    run, samples = batches(1)[0][0]
    legacy = encode(run, samples)[18:]  # a bare JSON line, as written before records had a header
    with Spool(tmp_path, max_bytes=10**7) as spool:
        spool.append(batches(1)[0])
    segment = next(tmp_path.glob("0*.jsonl"))
    segment.write_bytes(legacy)
    with Spool(tmp_path, max_bytes=10**7) as spool:
        [entry] = spool.peek(10)
    assert entry.run == run and entry.samples == samples


def test_a_damaged_line_is_handed_out_with_its_problem_so_the_rest_can_flow(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=10**7) as spool:
        spool.append(batches(1)[0])
    segment = next(tmp_path.glob("0*.jsonl"))
    segment.write_bytes(b"{not json\n" + segment.read_bytes())
    with Spool(tmp_path, max_bytes=10**7) as spool:
        bad, good = spool.peek(10)
        assert bad.run is None and bad.problem is not None and "unreadable record" in bad.problem
        assert good.run is not None
        spool.reject(bad, bad.problem)
        spool.ack(bad)
        assert spool.depth == 1
        assert spool.rejected == 1
    assert "{not json" in (tmp_path / "rejected.jsonl").read_text()


def test_when_full_it_drops_the_oldest_records_and_says_so(tmp_path: Path) -> None:
    record = len(encode(*batches(1)[0][0]))
    events = Events()
    spool = Spool(tmp_path, max_bytes=record * 4 + 10, segment_bytes=record * 2, on_event=events)
    written = batches(7)
    for batch in written:
        spool.append(batch)
    # Segments of two records each; the oldest two segments went to make room.
    assert spool.dropped == 4
    assert spool.depth == 3
    assert spool.bytes <= spool.max_bytes
    assert run_ids(spool.peek(10)) == [batch[0][0].run_id for batch in written[4:]]
    assert [e["dropped_runs"] for e in events.named("spool_full")] == [2, 2]
    spool.close()


def test_a_batch_larger_than_the_spool_is_refused_loudly(tmp_path: Path) -> None:
    events = Events()
    with Spool(tmp_path, max_bytes=100, on_event=events) as spool:
        with pytest.raises(SpoolFull, match=r"raise database\.spool_max_mb"):
            spool.append(batches(1)[0])
        assert (spool.dropped, spool.depth) == (1, 0)
    assert events.named("spool_full")[0]["dropped_runs"] == 1


def test_an_acknowledgement_for_a_dropped_record_is_ignored(tmp_path: Path) -> None:
    record = len(encode(*batches(1)[0][0]))
    spool = Spool(tmp_path, max_bytes=record * 2 + 10, segment_bytes=record, on_event=Events())
    spool.append(batches(1)[0])
    in_flight = spool.peek(1)[0]  # being written to the database ...
    for batch in batches(2):  # ... while the outage fills the spool
        spool.append(batch)
    spool.ack(in_flight)
    assert spool.depth == 2
    spool.close()


def test_two_processes_cannot_share_a_spool(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=10**6), pytest.raises(SpoolError, match="in use by another ttft-monitor"):
        Spool(tmp_path, max_bytes=10**6)


def test_it_lives_in_the_state_directory(tmp_path: Path) -> None:
    with Spool.in_state_dir(tmp_path / "state", max_mb=3) as spool:
        assert spool.directory == tmp_path / "state" / "spool"
        assert spool.max_bytes == 3 * 1024 * 1024


def test_an_unreadable_cursor_replays_everything_rather_than_losing_anything(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=10**7) as spool:
        for batch in batches(3):
            spool.append(batch)
        spool.ack(spool.peek(1)[0])
    (tmp_path / "cursor").write_text("{torn")
    events = Events()
    with Spool(tmp_path, max_bytes=10**7, on_event=events) as spool:
        assert spool.depth == 3  # the acknowledged one comes again: its replay is a no-op in the database
    assert [name for name, _ in events.seen] == ["spool_cursor_unreadable"]


def test_a_disturbed_sample_keeps_its_self_delay_through_the_spool(tmp_path: Path) -> None:
    run, samples = batches(1)[0][0]
    samples[0].self_delay_ms, samples[0].disturbed = 51.25, True
    samples[1].self_delay_ms = 0.125
    with Spool(tmp_path, max_bytes=10**7) as spool:
        spool.append([(run, samples)])
    with Spool(tmp_path, max_bytes=10**7) as spool:
        [entry] = spool.peek(10)
    assert entry.samples == samples
    assert entry.samples is not None  # equal to the list just spooled
    assert [(s.self_delay_ms, s.disturbed) for s in entry.samples[:2]] == [(51.25, True), (0.125, False)]


def test_records_spooled_before_samples_had_a_self_delay_replay_as_undisturbed(tmp_path: Path) -> None:
    run, samples = batches(1)[0][0]
    record = json.loads(encode(run, samples)[18:])
    for sample in record["samples"]:
        del sample["self_delay_ms"], sample["disturbed"]
    with Spool(tmp_path, max_bytes=10**7) as spool:
        spool.append(batches(1)[0])
    segment = next(tmp_path.glob("0*.jsonl"))
    segment.write_bytes(json.dumps(record).encode() + b"\n")
    with Spool(tmp_path, max_bytes=10**7) as spool:
        [entry] = spool.peek(10)
    assert entry.run == run
    assert entry.samples == [dataclasses.replace(s, self_delay_ms=None, disturbed=False) for s in samples]
