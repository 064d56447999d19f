"""The datetime column type writes on SQLite, in one step, exactly the text SQLAlchemy's own two steps write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import cast

import pytest
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator

from monitor.store.types import UtcDateTime

SQLITE = sqlite.dialect()


def _through_sqlalchemy(value: datetime | None) -> object:
    """`process_bind_param`, then SQLite's DATETIME processor: what SQLAlchemy does without the override."""
    adapted = cast(TypeDecorator[datetime], UtcDateTime().dialect_impl(SQLITE))
    process = TypeDecorator.bind_processor(adapted, SQLITE)
    assert process is not None
    return process(value)


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 12, 6, 10, 0, 0, tzinfo=UTC),  # no microseconds: still six zeros
        datetime(2026, 12, 6, 10, 0, 0, 123456, tzinfo=UTC),
        datetime(2026, 12, 6, 10, 0, 0, 7, tzinfo=timezone(timedelta(hours=-5))),  # another offset: as UTC
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=2))),  # across midnight into the day before
        datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=UTC),  # a year of three digits, padded
        None,
    ],
)
def test_a_datetime_is_written_to_sqlite_as_sqlalchemy_writes_it(value: datetime | None) -> None:
    process = UtcDateTime()._cached_bind_processor(SQLITE)
    assert process is not None
    assert process(value) == _through_sqlalchemy(value)


def test_a_naive_datetime_is_refused_on_sqlite_as_elsewhere() -> None:
    process = UtcDateTime()._cached_bind_processor(SQLITE)
    assert process is not None
    with pytest.raises(ValueError, match="naive datetime"):
        process(datetime(2026, 12, 6, 10, 0))


def test_postgresql_keeps_the_aware_datetime() -> None:
    process = UtcDateTime()._cached_bind_processor(postgresql.dialect())
    moment = datetime(2026, 12, 6, 10, 0, tzinfo=timezone(timedelta(hours=1)))
    assert (process(moment) if process is not None else moment) == moment
