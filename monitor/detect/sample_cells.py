"""The cells of a samples CSV (monitor.detect.replay describes the format) that both the replay and the
SLO-burn replay read, with the error that names the bad line."""

from __future__ import annotations

import math
from datetime import UTC, datetime


class ReplayError(Exception):
    """The CSV cannot be replayed; `str()` names the line and what to change."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


def parse_timestamp(text: str, line: int) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReplayError(
            f"timestamp {text!r} is not an ISO 8601 time; write it like 2025-01-31T09:00:00Z", line=line
        ) from None
    # The format says UTC; a time without an offset is read as UTC rather than refused.
    return moment.replace(tzinfo=UTC) if moment.utcoffset() is None else moment.astimezone(UTC)


def parse_ttft(text: str, line: int) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ReplayError(
            f"ttft_ms {text!r} is not a positive number of milliseconds (leave it empty for a failed request)",
            line=line,
        )
    return value
