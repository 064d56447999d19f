"""An append-only, fsync'd local spool for runs the database could not take.

Layout of the spool directory (under `database.state_dir`):
  NNNNNNNNNN.jsonl  segments; one record per line: a run with its samples, appended then fsync'd
  cursor            how far the records have been stored in the database (atomic rename + fsync)
  rejected.jsonl    records the database refused as invalid, kept for a human (never replayed)
  lock              held (flock) while a process uses the spool

A record is one line, `LLLLLLLL CCCCCCCC {json}`: the JSON's length and CRC-32 in hex, so a record
cut short or damaged is recognised as such, never read as another one. A batch is appended with one
write and one fsync; when either fails (a full disk), the file is truncated back to where the
batch began, so the batch is either wholly spooled or wholly absent: a batch reported lost is never
replayed, and the next append never lands behind a fragment. A crash mid-append can still leave a
torn tail: the next process truncates it at start, counts it (`torn_tails`) and reports it.

A record is forgotten only after the database committed it, so a crash at any point loses nothing:
at worst records are replayed twice, and the store makes the second insert a no-op.

The size is bounded by `max_bytes`. When a new batch would not fit, the oldest segments are dropped
(the newest results say how the endpoints are doing now; the configuration documents this), the
dropped records are counted in `dropped` and reported through `on_event("spool_full", **fields)`.

The methods block (file I/O and fsync): call them from a worker thread in async code. They are
thread-safe.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import logging
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from monitor.probe.result import Sample
from monitor.store.engine import StoreError
from monitor.store.records import RunRecord, run_from_dict, run_to_dict, sample_from_dict, sample_to_dict

# Called as on_event(name, **fields): snake_case names, fields safe to log (structlog style).
EventSink = Callable[..., None]
LOUD_EVENTS = frozenset(
    {
        "database_write_failed",
        "results_lost",
        "spool_drain_failed",
        "spool_full",
        "spool_record_rejected",
        "spool_torn_tail",
        "spool_cursor_unreadable",
    }
)
FORMAT_VERSION = 1  # of the JSON inside a record
_HEADER = b"%08x %08x "
_HEADER_BYTES = 18
_SEGMENT_SUFFIX = ".jsonl"
MIN_SEGMENT_BYTES = 64 * 1024
MAX_SEGMENT_BYTES = 16 * 1024 * 1024


class SpoolError(StoreError):
    """The spool cannot be used; the message (one line) says why and what to do."""


class SpoolFull(SpoolError):
    """A single batch larger than the whole spool."""


def log_event(logger: logging.Logger) -> EventSink:
    """An event sink writing to a standard logger: warnings for losses and failures, info otherwise."""

    def sink(name: str, **fields: Any) -> None:
        text = " ".join(f"{key}={value}" for key, value in fields.items())
        logger.log(logging.WARNING if name in LOUD_EVENTS else logging.INFO, "%s %s", name, text)

    return sink


@dataclass(frozen=True, slots=True)
class SpooledRun:
    """One spooled record. `run`/`samples` are None when the line could not be read (`problem` says why)."""

    segment: int
    ordinal: int  # line number within the segment, from 0
    end: int  # byte offset just after the line
    line: bytes
    run: RunRecord | None
    samples: list[Sample] | None
    problem: str | None = None


@dataclass(slots=True)
class _Segment:
    lines: int  # complete lines
    size: int  # bytes on disk


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode(run: RunRecord, samples: Sequence[Sample]) -> bytes:
    record = {"v": FORMAT_VERSION, "run": run_to_dict(run), "samples": [sample_to_dict(s) for s in samples]}
    payload = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    return _HEADER % (len(payload), zlib.crc32(payload)) + payload + b"\n"


def _payload(line: bytes) -> bytes:
    """The JSON of one record line, checked against its length and checksum."""
    if line.startswith(b"{"):
        return line  # written before records carried a length and checksum
    body = line.removesuffix(b"\n")
    try:
        length, checksum = int(body[:8], 16), int(body[9:17], 16)
    except ValueError:
        raise ValueError("no record header (length and checksum)") from None
    payload = body[_HEADER_BYTES:]
    if len(payload) != length or body[8:9] != b" " or body[17:18] != b" ":
        raise ValueError(f"record cut or damaged: {len(payload)} bytes where its header says {length}")
    if zlib.crc32(payload) != checksum:
        raise ValueError("record damaged: checksum mismatch")
    return payload


def decode(line: bytes) -> tuple[RunRecord, list[Sample]]:
    record = json.loads(_payload(line))
    if record.get("v") != FORMAT_VERSION:
        raise ValueError(f"unknown spool record version {record.get('v')!r}")
    return run_from_dict(record["run"]), [sample_from_dict(s) for s in record["samples"]]


def _append_all_or_nothing(path: Path, data: bytes, *, expected_size: int | None = None) -> None:
    """Append `data` to `path` with one write and an fsync; on failure truncate the file back to its
    size before, so nothing of `data` remains. `expected_size`: where the good data ends (bytes left
    after it by an earlier failed append are cut first)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        if expected_size is not None and before != expected_size:
            os.ftruncate(fd, expected_size)
            before = expected_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(f"short write to {path}")
                view = view[written:]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, before)  # freeing blocks needs no space, so this works on a full disk
            os.fsync(fd)
            raise
    finally:
        os.close(fd)


class Spool:
    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int,
        segment_bytes: int | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or min(MAX_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, max_bytes // 16))
        self._emit = on_event or log_event(logging.getLogger("monitor.store.spool"))
        self._lock = threading.Lock()
        self.dropped = 0  # records dropped because the spool was full
        self.rejected = 0  # records moved to rejected.jsonl
        self.torn_tails = 0  # torn tails (a crash mid-append) truncated at start
        self._segments: dict[int, _Segment] = {}
        self._active: int | None = None  # the segment this process appends to
        self._cursor = (0, 0, 0)  # (segment, byte offset, ordinal): everything before it is stored
        self._counts = (0, 0)  # (depth, bytes)
        self._lock_file = self._open_locked()
        try:
            self._load()
        except OSError as exc:
            self.close()
            raise SpoolError(
                f"cannot read the spool in {self.directory}: {exc.strerror}; check the permissions of "
                "database.state_dir"
            ) from exc
        except BaseException:
            self.close()
            raise

    @classmethod
    def in_state_dir(cls, state_dir: str | Path, *, max_mb: int, on_event: EventSink | None = None) -> Spool:
        """The spool of a ttft-monitor state directory (`database.state_dir`, `database.spool_max_mb`)."""
        return cls(Path(state_dir) / "spool", max_bytes=max_mb * 1024 * 1024, on_event=on_event)

    # ---------------------------------------------------------------- opening

    def _open_locked(self) -> Any:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle = open(self.directory / "lock", "a+")  # noqa: SIM115 - held until close()
        except OSError as exc:
            raise SpoolError(
                f"cannot create the spool in {self.directory}: {exc.strerror}; make database.state_dir writable"
            ) from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise SpoolError(
                f"the spool in {self.directory} is in use by another ttft-monitor process; "
                "give each process its own database.state_dir"
            ) from None
        return handle

    def _load(self) -> None:
        cursor_file = self.directory / "cursor"
        if cursor_file.exists():
            try:
                data = json.loads(cursor_file.read_text())
                self._cursor = (int(data["segment"]), int(data["offset"]), int(data["ordinal"]))
            except (ValueError, KeyError, TypeError):
                # Replaying from the start is safe (stored records are no-ops), losing records is not.
                self._emit("spool_cursor_unreadable", file=str(cursor_file), action="replaying every segment")
        for path in sorted(self.directory.glob(f"*{_SEGMENT_SUFFIX}")):
            if path.name == "rejected.jsonl" or not path.stem.isdigit():
                continue
            number = int(path.stem)
            if number < self._cursor[0]:
                path.unlink()  # fully stored before a crash interrupted its removal
                continue
            content = path.read_bytes()
            if content and not content.endswith(b"\n"):
                # A crash mid-append: the batch was never reported spooled. Cut it, so it can never
                # be read as (part of) a record.
                good = content.rfind(b"\n") + 1
                with open(path, "r+b") as handle:
                    handle.truncate(good)
                    handle.flush()
                    os.fsync(handle.fileno())
                self.torn_tails += 1
                self._emit("spool_torn_tail", segment=path.name, bytes=len(content) - good, action="truncated")
                content = content[:good]
            self._segments[number] = _Segment(lines=content.count(b"\n"), size=len(content))
        if self._segments and self._cursor[0] not in self._segments:
            self._cursor = (min(self._segments), 0, 0)
        with contextlib.suppress(FileNotFoundError):
            self.rejected = (self.directory / "rejected.jsonl").read_bytes().count(b"\n")
        self._recount()

    def close(self) -> None:
        with self._lock:
            if self._lock_file is not None:
                self._lock_file.close()
                self._lock_file = None

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- state

    # Read without the lock (one atomic attribute read): the event loop asks for these while a worker
    # thread may hold the lock through an fsync.
    @property
    def depth(self) -> int:
        """Records (runs with their samples) waiting for the database."""
        return self._counts[0]

    @property
    def bytes(self) -> int:
        """Bytes the spool's segments take on disk."""
        return self._counts[1]

    def _recount(self) -> None:
        depth = sum(
            segment.lines - (self._cursor[2] if number == self._cursor[0] else 0)
            for number, segment in self._segments.items()
        )
        self._counts = (depth, sum(segment.size for segment in self._segments.values()))

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:010d}{_SEGMENT_SUFFIX}"

    # ---------------------------------------------------------------- writing

    def append(self, batch: Sequence[tuple[RunRecord, Sequence[Sample]]]) -> int:
        """Write runs durably (one write and fsync for the batch); returns the number written.

        All or nothing: when it raises (a full disk, an I/O error), none of the batch is in the
        spool. Drops the oldest segments when the batch would not fit (counted and reported); raises
        SpoolFull only for a batch larger than the whole spool.
        """
        data = b"".join(encode(run, samples) for run, samples in batch)
        if not data:
            return 0
        with self._lock:
            if len(data) > self.max_bytes:
                self.dropped += len(batch)
                self._emit("spool_full", dropped_runs=len(batch), reason="batch larger than the spool")
                raise SpoolFull(
                    f"a batch of {len(data)} bytes does not fit in the spool ({self.max_bytes} bytes); "
                    "raise database.spool_max_mb"
                )
            self._make_room(len(data))
            number = self._active
            if number is None or self._segments[number].size + len(data) > self.segment_bytes:
                number = self._new_segment()
            segment = self._segments[number]
            _append_all_or_nothing(self._path(number), data, expected_size=segment.size)
            segment.size += len(data)
            segment.lines += len(batch)
            self._recount()
            return len(batch)

    def _new_segment(self) -> int:
        number = max([*self._segments, self._cursor[0] - 1, -1]) + 1
        self._path(number).touch()
        _fsync_dir(self.directory)
        self._segments[number] = _Segment(lines=0, size=0)
        if len(self._segments) == 1:
            self._cursor = (number, 0, 0)
        self._active = number
        self._recount()
        return number

    def _make_room(self, needed: int) -> None:
        dropped = 0
        try:
            while self._segments and self._counts[1] + needed > self.max_bytes:
                oldest = min(self._segments)
                skipped = self._cursor[2] if oldest == self._cursor[0] else 0
                dropped += self._segments[oldest].lines - skipped
                self._remove(oldest)
        finally:  # counted even when the cursor could not be written after a segment was removed
            if dropped:
                self.dropped += dropped
                self._emit(
                    "spool_full",
                    dropped_runs=dropped,
                    dropped_total=self.dropped,
                    max_bytes=self.max_bytes,
                    reason="oldest records dropped to make room",
                )

    def _remove(self, number: int) -> None:
        del self._segments[number]
        if self._active == number:
            self._active = None
        # The file first: it frees space on a full disk, and a cursor naming a missing segment is
        # read as "the oldest segment left, from its start".
        with contextlib.suppress(FileNotFoundError):
            self._path(number).unlink()
        following = min(self._segments) if self._segments else number + 1
        self._write_cursor((following, 0, 0))

    def _write_cursor(self, cursor: tuple[int, int, int]) -> None:
        # In memory first: if the file cannot be written (a full disk), a restart replays from the
        # older cursor, which stores nothing twice; this process goes on from the new one.
        self._cursor = cursor
        self._recount()
        temporary = self.directory / "cursor.tmp"
        with open(temporary, "w") as handle:
            json.dump({"segment": cursor[0], "offset": cursor[1], "ordinal": cursor[2]}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.directory / "cursor")
        _fsync_dir(self.directory)

    # ---------------------------------------------------------------- reading and acknowledging

    def peek(self, limit: int) -> list[SpooledRun]:
        """Up to `limit` of the oldest records not yet stored, in the order they were written."""
        out: list[SpooledRun] = []
        with self._lock:
            segment_no, offset, ordinal = self._cursor
            for number in sorted(n for n in self._segments if n >= segment_no):
                if len(out) >= limit:
                    break
                start, index = (offset, ordinal) if number == segment_no else (0, 0)
                known = self._segments[number].lines
                with open(self._path(number), "rb") as handle:
                    handle.seek(start)
                    position = start
                    while index < known and len(out) < limit:
                        line = handle.readline()
                        if not line.endswith(b"\n"):
                            break  # torn tail: never acknowledged as written
                        position += len(line)
                        out.append(self._parse(number, index, position, line))
                        index += 1
        return out

    @staticmethod
    def _parse(number: int, ordinal: int, end: int, line: builtins.bytes) -> SpooledRun:
        try:
            run, samples = decode(line)
        except Exception as exc:  # a damaged line must not stop the records behind it
            return SpooledRun(number, ordinal, end, line, None, None, f"unreadable record: {exc}")
        return SpooledRun(number, ordinal, end, line, run, samples)

    def ack(self, entry: SpooledRun) -> None:
        """`entry` and every record before it are stored: forget them (durably)."""
        with self._lock:
            position = (entry.segment, entry.ordinal + 1)
            if position <= (self._cursor[0], self._cursor[2]) or entry.segment not in self._segments:
                return  # already acknowledged, or dropped while it was being stored
            for number in [n for n in self._segments if n < entry.segment]:
                self._remove(number)
            if entry.ordinal + 1 >= self._segments[entry.segment].lines:
                # The whole segment is stored; if it was the one being appended to, the next append
                # starts a fresh segment.
                self._remove(entry.segment)
            else:
                self._write_cursor((entry.segment, entry.end, entry.ordinal + 1))

    def reject(self, entry: SpooledRun, reason: str) -> None:
        """Keep a record the database refused in rejected.jsonl (for a human), so the rest can flow."""
        line = {
            "rejected_at": datetime.now(UTC).isoformat(),
            "reason": reason,
            "record": entry.line.decode(errors="replace").rstrip("\n"),
        }
        with self._lock:
            _append_all_or_nothing(self.directory / "rejected.jsonl", (json.dumps(line) + "\n").encode())
            self.rejected += 1
        run_id = str(entry.run.run_id) if entry.run is not None else None
        self._emit("spool_record_rejected", run_id=run_id, reason=reason, rejected_total=self.rejected)
