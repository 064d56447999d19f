"""Column types shared by the models and the migrations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Double, Integer
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from monitor.store.records import to_microseconds


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime in, an aware UTC datetime out, on every backend.

    PostgreSQL keeps `timestamptz`; SQLite has no time zones and would hand back naive values, so
    values are normalised to UTC on the way in and tagged UTC on the way out. Naive datetimes are
    refused: a local time silently stored as UTC would shift a series by hours.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} cannot be stored; give it a time zone (UTC)")
        value = value.astimezone(UTC)
        # SQLite stores text; without the offset its strings sort and compare correctly as UTC.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def bind_processor(self, dialect: Dialect) -> Any:
        """On SQLite, one step from the aware datetime to the text SQLite's DATETIME would write for it (its
        default storage format, `YYYY-MM-DD HH:MM:SS.ffffff`) instead of `process_bind_param`, then that
        type's processor filling its format from a dict: a stored run converts five datetimes, a tick 2,500
        and detection's reads two a series. Any other storage format, and other databases, go the usual way."""
        base = super().bind_processor(dialect)
        if dialect.name != "sqlite" or getattr(self.impl_instance.dialect_impl(dialect), "_storage_format", None) != (
            _SQLITE_DATETIME_FORMAT
        ):
            return base

        to_naive_utc = self.process_bind_param

        def as_sqlite_text(value: datetime | None) -> str | None:
            if value is not None and value.tzinfo is UTC:  # the usual case: its text, without the offset
                return value.isoformat(" ", "microseconds")[:26]
            # Other zones converted, naive datetimes refused, as `process_bind_param` does for every database.
            naive = to_naive_utc(value, dialect)
            return None if naive is None else naive.isoformat(" ", "microseconds")

        return as_sqlite_text

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# SQLAlchemy's SQLite DATETIME storage format, its default (sqlalchemy/dialects/sqlite/base.py).
_SQLITE_DATETIME_FORMAT = "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"


class _JsonOrPostgres(TypeDecorator[Any]):
    """JSON, and on PostgreSQL the type `postgres_type` names there.

    What `JSON().with_variant(...)` declares, except that SQLAlchemy's PostgreSQL dialect is imported only
    when a PostgreSQL connection first needs the type: building the variant at import time loaded that
    dialect with every driver module it brings (2.3 MB of a daemon's resident memory) into every process,
    those on SQLite too. Python-side comparisons are JSON's, as they were for the variant."""

    impl = JSON
    cache_ok = True
    # JSON's own, which a decorator does not take from its impl: None is stored as JSON null, and
    # values (dicts, lists) are not hashed.
    should_evaluate_none = True
    hashable = False

    def __init__(self, postgres_type: str) -> None:
        super().__init__()
        self.postgres_type = postgres_type

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name != "postgresql":
            return dialect.type_descriptor(JSON())
        from sqlalchemy.dialects.postgresql import ARRAY, JSONB

        postgres: TypeEngine[Any] = JSONB() if self.postgres_type == "jsonb" else ARRAY(Double())
        return dialect.type_descriptor(postgres)


def json_type() -> Any:
    """JSON, stored as `jsonb` on PostgreSQL (indexable, compact) and as text on SQLite."""
    return _JsonOrPostgres("jsonb")


def float_list_type() -> Any:
    """A short list of floats (None allowed): `double precision[]` on PostgreSQL, JSON text on SQLite."""
    return _JsonOrPostgres("double precision[]")


class Microseconds(TypeDecorator[float]):
    """A duration in milliseconds (a float) in Python, a whole number of microseconds in the database.

    An `int4` on PostgreSQL (4 bytes against a `double`'s 8; up to `records.MAX_MICROSECONDS`) and an INTEGER on
    SQLite (which stores small integers in 3-4 bytes). Values are rounded to the microsecond before they
    are stored (`records.storable_sample`), so a sample read back equals the one the probe reported.
    A plain number compared with the column binds through it too (`ttft_ms > 800.0` is `ttft_us > 800000`
    in SQL); arithmetic on the column with a plain number would be scaled the same way, so queries do none.
    """

    impl = Integer
    cache_ok = True

    def process_bind_param(self, value: float | None, dialect: Dialect) -> int | None:
        return None if value is None else to_microseconds(value)

    def process_result_value(self, value: float | None, dialect: Dialect) -> float | None:
        # `percentile_cont` over the column returns a double of microseconds: divided the same way.
        return None if value is None else value / 1000
