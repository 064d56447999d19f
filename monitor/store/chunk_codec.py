"""A lossless column-wise codec for a batch of rows: the cold tier's chunks (monitor/store/cold.py, issue 26).

`encode(rows, columns)` writes each column apart: a bitmap of which rows have a value, then the values by
their kind (integers and timestamps as zigzag varints of their difference from the row before, UUIDs and
short texts as a dictionary of the distinct values and each row's index into it, floats as 8 IEEE bytes,
booleans as bits, other texts as UTF-8 joined by NUL), the whole zlib-compressed. `decode` gives the rows
back, equal value for value, type for type (tests/unit/test_chunk_codec.py). Pure: bytes in, rows out.
The cold tier keeps a series' day of runs, and of samples, each as one such chunk (monitor/store/cold.py);
`bench/storage_layouts.py` measures other spans beside it.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_KINDS = {"none": 0, "bool": 1, "int": 2, "float": 3, "time": 4, "uuid": 5, "text": 6}


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _unzigzag(value: int) -> int:
    return value // 2 if value % 2 == 0 else -(value + 1) // 2


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def varint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def take(self, count: int) -> bytes:
        piece = self.data[self.at : self.at + count]
        self.at += count
        return piece


def _kind(values: Sequence[Any]) -> str:
    present = [value for value in values if value is not None]
    if not present:
        return "none"
    first = present[0]
    if isinstance(first, bool):
        return "bool"
    if isinstance(first, int):
        return "int"
    if isinstance(first, float):
        return "float"
    if isinstance(first, datetime):
        return "time"
    if isinstance(first, uuid.UUID):
        return "uuid"
    if isinstance(first, str):
        return "text"
    raise TypeError(f"chunk_codec: no encoding for {type(first).__name__}")


def _micros(moment: datetime) -> int:
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _encode_column(values: Sequence[Any], out: bytearray) -> None:
    kind = _kind(values)
    out.append(_KINDS[kind])
    bits = bytearray((len(values) + 7) // 8)
    for index, value in enumerate(values):
        if value is not None:
            bits[index // 8] |= 1 << (index % 8)
    out += bits
    present = [value for value in values if value is not None]
    if kind == "bool":
        flags = bytearray((len(present) + 7) // 8)
        for index, value in enumerate(present):
            if value:
                flags[index // 8] |= 1 << (index % 8)
        out += flags
    elif kind in ("int", "time"):
        previous = 0
        for value in present:
            number = _micros(value) if kind == "time" else value
            _varint(_zigzag(number - previous), out)
            previous = number
    elif kind == "float":
        out += struct.pack(f"<{len(present)}d", *present)
    elif kind in ("uuid", "text"):
        distinct: dict[Any, int] = {}
        indexes = [distinct.setdefault(value, len(distinct)) for value in present]
        _varint(len(distinct), out)
        for value in distinct:
            if kind == "uuid":
                out += value.bytes
            else:
                raw = value.encode("utf-8", "surrogatepass")
                _varint(len(raw), out)
                out += raw
        for index in indexes:
            _varint(index, out)


def _decode_column(reader: _Reader, rows: int) -> list[Any]:
    kind = {number: name for name, number in _KINDS.items()}[reader.take(1)[0]]
    bits = reader.take((rows + 7) // 8)
    where = [bool(bits[index // 8] & (1 << (index % 8))) for index in range(rows)]
    count = sum(where)
    present: list[Any]
    if kind == "none":
        present = []
    elif kind == "bool":
        flags = reader.take((count + 7) // 8)
        present = [bool(flags[index // 8] & (1 << (index % 8))) for index in range(count)]
    elif kind in ("int", "time"):
        present, previous = [], 0
        for _ in range(count):
            previous += _unzigzag(reader.varint())
            present.append(EPOCH + timedelta(microseconds=previous) if kind == "time" else previous)
    elif kind == "float":
        present = list(struct.unpack(f"<{count}d", reader.take(8 * count)))
    else:
        distinct: list[Any] = []
        for _ in range(reader.varint()):
            if kind == "uuid":
                distinct.append(uuid.UUID(bytes=reader.take(16)))
            else:
                distinct.append(reader.take(reader.varint()).decode("utf-8", "surrogatepass"))
        present = [distinct[reader.varint()] for _ in range(count)]
    values = iter(present)
    return [next(values) if has else None for has in where]


def encode(rows: Sequence[Sequence[Any]], columns: int, *, level: int = 9) -> bytes:
    """`rows` (each `columns` values long) as one compressed chunk."""
    out = bytearray()
    _varint(len(rows), out)
    _varint(columns, out)
    for column in range(columns):
        _encode_column([row[column] for row in rows], out)
    return zlib.compress(bytes(out), level)


def decode(chunk: bytes) -> list[tuple[Any, ...]]:
    """The rows `encode` was given, timestamps in UTC."""
    reader = _Reader(zlib.decompress(chunk))
    rows, columns = reader.varint(), reader.varint()
    values = [_decode_column(reader, rows) for _ in range(columns)]
    return list(zip(*values, strict=True)) if columns else [() for _ in range(rows)]
