"""monitor/store/chunk_codec.py, the codec of the cold tier's chunks: it must give back every row value for value,
type for type, or a compacted day would read back other than it was stored."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.store import chunk_codec as codec

_MOMENTS = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
# Each column holds one kind of value or none, as a database column does.
_KINDS = [
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    _MOMENTS,
    st.uuids(),
    st.text(),
]


@st.composite
def _tables(draw: st.DrawFn) -> tuple[list[tuple[Any, ...]], int]:
    kinds = draw(st.lists(st.sampled_from(_KINDS), max_size=6))
    count = draw(st.integers(min_value=0, max_value=40))
    columns = [draw(st.lists(st.none() | kind, min_size=count, max_size=count)) for kind in kinds]
    return [tuple(column[row] for column in columns) for row in range(count)], len(kinds)


@settings(max_examples=200, deadline=None)
@given(_tables())
def test_every_row_comes_back_value_for_value(table: tuple[list[tuple[Any, ...]], int]) -> None:
    rows, columns = table
    back = codec.decode(codec.encode(rows, columns))
    assert back == rows
    # Equal is not enough for booleans (True == 1) or floats (-0.0 == 0.0): the types and signs too.
    for original, decoded in zip(rows, back, strict=True):
        for a, b in zip(original, decoded, strict=True):
            assert type(a) is type(b)
            if isinstance(a, float):
                assert repr(a) == repr(b)


def test_a_day_of_samples_costs_a_fraction_of_its_rows_text() -> None:
    """What the layouts bench relies on: repeated values (a run's id, its served model) are kept once."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    rows = []
    for run in range(48):
        run_id = uuid.UUID(int=run + 1)
        for round_ in range(1, 7):
            rows.append((run_id, round_, start + timedelta(minutes=30 * run), "org/Model-7B-Instruct", 250_000 + run))
    chunk = codec.encode(rows, 5)
    assert codec.decode(chunk) == rows
    # 288 rows whose text alone is over 21 kB.
    assert len(chunk) < 1_000


def test_a_value_it_has_no_encoding_for_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="no encoding for bytes"):
        codec.encode([(b"raw",)], 1)


@settings(max_examples=200, deadline=None)
@given(_tables(), st.data())
def test_a_reader_of_some_columns_gets_exactly_those(
    table: tuple[list[tuple[Any, ...]], int], data: st.DataObject
) -> None:
    rows, columns = table
    wanted = data.draw(st.sets(st.integers(min_value=0, max_value=max(columns - 1, 0))))
    count, values = codec.decode_columns(codec.encode(rows, columns), wanted)
    assert count == len(rows)
    for index in range(columns):
        assert values[index] == ([row[index] for row in rows] if index in wanted else None)
