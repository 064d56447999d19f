"""The series view's points from hourly rollups (`queries.hourly_points`): what the figure-by-figure code
gave, read in one call a point (the 30-day view spent a third of its time there)."""

from __future__ import annotations

import math
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.quantile import quantile
from monitor.store.records import HourlyStats
from monitor.web.queries import PHASES, SERVER_FIELDS, hourly_points

START = datetime(2026, 11, 1, 0, 17, tzinfo=UTC)  # not on the hour: a bucket's time is the later of the two


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


def by_name(hours: list[HourlyStats], *, start: datetime, width_s: int) -> list[dict[str, Any]]:
    """The code before (2026-12-07), each figure asked for by name: the reference."""
    rollup_of = {"ttft_ms": "ttft_p50_ms"}
    buckets: dict[int, list[HourlyStats]] = {}
    origin = start.timestamp()
    for item in hours:
        buckets.setdefault(int((item.hour.timestamp() - origin) // width_s), []).append(item)
    out = []
    for index in sorted(buckets):
        members = buckets[index]

        def median_of(name: str, members: list[HourlyStats] = members) -> float | None:
            if len(members) == 1:
                return getattr(members[0], name)  # type: ignore[no-any-return]
            values = [value for m in members if (value := getattr(m, name)) is not None]
            return quantile(values, 0.5) if values else None

        errors = sum(m.errors for m in members)
        moment = max(datetime.fromtimestamp(origin + index * width_s, UTC), members[0].hour)
        out.append(
            {
                "t": moment.isoformat().replace("+00:00", "Z"),
                "n": sum(m.samples for m in members),
                "errors": errors,
                "ttft_p10_ms": _round(median_of("ttft_p10_ms")),
                "ttft_p50_ms": _round(median_of("ttft_p50_ms")),
                "ttft_p90_ms": _round(median_of("ttft_p90_ms")),
                **{name: _round(median_of(rollup_of.get(name, f"{name}_p50"))) for name in PHASES},
                "decode_tps": _round(median_of("decode_tps_p50")),
                "prompt_tokens": _round(median_of("prompt_tokens_p50"), 0),
                "cached_tokens": _round(median_of("cached_tokens_p50"), 0),
                **{name: _round(median_of(f"{name}_p50"), 4) for name in SERVER_FIELDS},
                "error_counts": {"error": errors} if errors else {},
            }
        )
    return out


FIGURE_FIELDS = [f.name for f in fields(HourlyStats) if f.name not in ("hour", "samples", "errors")]
figure = st.one_of(
    st.none(),
    st.just(math.nan),
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
)


@st.composite
def hours_of_a_series(draw: st.DrawFn) -> list[HourlyStats]:
    offsets = sorted(draw(st.sets(st.integers(min_value=0, max_value=24 * 30), min_size=0, max_size=40)))
    base = START.replace(minute=0) + timedelta(hours=1)
    out = []
    for offset in offsets:
        samples = draw(st.integers(min_value=0, max_value=60))
        values = {name: draw(figure) for name in FIGURE_FIELDS}
        errors = draw(st.integers(min_value=0, max_value=samples))
        out.append(HourlyStats(hour=base + timedelta(hours=offset), samples=samples, errors=errors, **values))
    return out


@settings(max_examples=200, deadline=None)
@given(hours=hours_of_a_series(), hours_a_point=st.sampled_from([1, 1, 2, 3, 24]))
def test_hourly_points_are_what_asking_for_each_figure_by_name_gave(
    hours: list[HourlyStats], hours_a_point: int
) -> None:
    width = 3600 * hours_a_point
    assert hourly_points(hours, start=START, width_s=width) == by_name(hours, start=START, width_s=width)


def test_a_point_carries_every_figure_of_its_hour_rounded_and_nan_as_none() -> None:
    hour = START.replace(minute=0) + timedelta(hours=1)
    stats = HourlyStats(
        hour=hour,
        samples=10,
        errors=2,
        ttft_p50_ms=123.456,
        ttft_p90_ms=math.nan,
        ttft_p99_ms=None,
        ttft_min_ms=1.0,
        ttft_max_ms=2.0,
        decode_tps_p50=55.5551,
        prompt_tokens_p50=1000.4,
        server_kv_cache_usage_p50=0.123456,
    )
    (point,) = hourly_points([stats], start=START, width_s=3600)
    assert point["t"] == "2026-11-01T01:00:00Z"
    assert (point["n"], point["errors"], point["error_counts"]) == (10, 2, {"error": 2})
    assert (point["ttft_p50_ms"], point["ttft_ms"], point["ttft_p90_ms"]) == (123.46, 123.46, None)
    assert (point["decode_tps"], point["prompt_tokens"], point["server_kv_cache_usage"]) == (55.56, 1000.0, 0.1235)
    assert point["ttft_p10_ms"] is None and point["dns_ms"] is None
