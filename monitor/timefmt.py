"""Times as text, one way: RFC 3339 in UTC with a `Z`, for receivers' payloads, the JSON API and the
commands' JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload


@overload
def iso(moment: datetime, *, whole_seconds: bool = False) -> str: ...
@overload
def iso(moment: None, *, whole_seconds: bool = False) -> None: ...
@overload
def iso(moment: datetime | None, *, whole_seconds: bool = False) -> str | None: ...
def iso(moment: datetime | None, *, whole_seconds: bool = False) -> str | None:
    """`2026-01-05T03:04:05.250000Z`; None stays None. `whole_seconds` drops the fraction
    (`2026-01-05T03:04:05Z`): what every receiver API accepts."""
    if moment is None:
        return None
    utc = moment.astimezone(UTC)
    return (utc.replace(microsecond=0) if whole_seconds else utc).isoformat().replace("+00:00", "Z")
