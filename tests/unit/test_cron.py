from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.config.cron import build_trigger, next_fire_times

# A Friday, half a minute past nine.
NOW = datetime(2025, 1, 31, 9, 0, 30, tzinfo=UTC)


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, zone: str = "UTC") -> str:
    return datetime(year, month, day, hour, minute, second, tzinfo=ZoneInfo(zone)).isoformat()


@pytest.mark.parametrize(
    ("expr", "timezone", "expected"),
    [
        ("* * * * *", "UTC", [at(2025, 1, 31, 9, 1), at(2025, 1, 31, 9, 2), at(2025, 1, 31, 9, 3)]),
        ("*/15 * * * *", "UTC", [at(2025, 1, 31, 9, 15), at(2025, 1, 31, 9, 30), at(2025, 1, 31, 9, 45)]),
        ("@hourly", "UTC", [at(2025, 1, 31, 10), at(2025, 1, 31, 11), at(2025, 1, 31, 12)]),
        ("0 0 1 * *", "UTC", [at(2025, 2, 1), at(2025, 3, 1), at(2025, 4, 1)]),
        ("0 0 1 jan,jul *", "UTC", [at(2025, 7, 1), at(2026, 1, 1), at(2026, 7, 1)]),
        # Weekdays count from Sunday = 0, as in cron (APScheduler alone would read 1 as Tuesday).
        ("0 9 * * 1", "UTC", [at(2025, 2, 3, 9), at(2025, 2, 10, 9), at(2025, 2, 17, 9)]),
        ("0 9 * * 0", "UTC", [at(2025, 2, 2, 9), at(2025, 2, 9, 9), at(2025, 2, 16, 9)]),
        ("0 9 * * 7", "UTC", [at(2025, 2, 2, 9), at(2025, 2, 9, 9), at(2025, 2, 16, 9)]),
        ("0 9 * * SUN", "UTC", [at(2025, 2, 2, 9), at(2025, 2, 9, 9), at(2025, 2, 16, 9)]),
        ("30 8 * * 1-5", "UTC", [at(2025, 2, 3, 8, 30), at(2025, 2, 4, 8, 30), at(2025, 2, 5, 8, 30)]),
        ("0 12 * * 5-7", "UTC", [at(2025, 1, 31, 12), at(2025, 2, 1, 12), at(2025, 2, 2, 12)]),
        ("0 0 * * */2", "UTC", [at(2025, 2, 1), at(2025, 2, 2), at(2025, 2, 4)]),
        ("0 0 * * mon-fri/2", "UTC", [at(2025, 2, 3), at(2025, 2, 5), at(2025, 2, 7)]),
        (
            "0 9 * * *",
            "Asia/Shanghai",
            [
                at(2025, 2, 1, 9, zone="Asia/Shanghai"),
                at(2025, 2, 2, 9, zone="Asia/Shanghai"),
                at(2025, 2, 3, 9, zone="Asia/Shanghai"),
            ],
        ),
        # Six fields: seconds first.
        (
            "*/15 * * * * *",
            "UTC",
            [at(2025, 1, 31, 9, 0, 30), at(2025, 1, 31, 9, 0, 45), at(2025, 1, 31, 9, 1)],
        ),
        ("0 0 9 * * 1", "UTC", [at(2025, 2, 3, 9), at(2025, 2, 10, 9), at(2025, 2, 17, 9)]),
    ],
)
def test_it_computes_the_next_fire_times(expr: str, timezone: str, expected: list[str]) -> None:
    times = next_fire_times(build_trigger(expr, timezone), NOW, 3)
    assert [t.isoformat() for t in times] == expected


def test_a_time_exactly_on_the_schedule_counts_as_next() -> None:
    on_the_minute = datetime(2025, 1, 31, 9, 5, tzinfo=UTC)
    assert next_fire_times(build_trigger("*/5 * * * *", "UTC"), on_the_minute, 1) == [on_the_minute]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (
            "*/5 * *",
            "'*/5 * *' is not a cron expression "
            "(expected 5 fields: minute hour day month weekday, or 6 with seconds first)",
        ),
        (
            "",
            "'' is not a cron expression (expected 5 fields: minute hour day month weekday, or 6 with seconds first)",
        ),
        (
            "* * * * * * *",
            "'* * * * * * *' is not a cron expression "
            "(expected 5 fields: minute hour day month weekday, or 6 with seconds first)",
        ),
        (
            "@fortnightly",
            "unknown cron macro '@fortnightly' "
            "(known: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)",
        ),
        (
            "* * * * 8",
            "weekday field '8' is invalid: '8' is not a weekday "
            "(use 0-7 where 0 and 7 are Sunday, or sun, mon, tue, wed, thu, fri, sat)",
        ),
        (
            "* * * * 5-1",
            "weekday field '5-1' is invalid: range 5-1 runs backwards (0 = Sunday ... 6 = Saturday, 7 = Sunday)",
        ),
        ("0 0 30 2 *", "'0 0 30 2 *' never fires: no date matches its day and month; check those fields"),
        (
            "0 9 1 * 1",
            "'0 9 1 * 1' restricts both day of month (1) and weekday (1); cron runs when either "
            "matches but this scheduler would need both, so use '*' for one of them "
            "(or split it into two jobs)",
        ),
    ],
)
def test_it_explains_an_invalid_expression(expr: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        build_trigger(expr, "UTC")
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("expr", "start"),
    [
        ("61 * * * *", "minute field '61' is invalid in '61 * * * *': "),
        ("* 24 * * *", "hour field '24' is invalid in '* 24 * * *': "),
        ("* * 0 * *", "day of month field '0' is invalid in '* * 0 * *': "),
        ("* * * 13 *", "month field '13' is invalid in '* * * 13 *': "),
        ("x * * * *", "minute field 'x' is invalid in 'x * * * *': "),
        ("60 * * * * *", "second field '60' is invalid in '60 * * * * *': "),
    ],
)
def test_it_names_the_field_that_is_out_of_range(expr: str, start: str) -> None:
    with pytest.raises(ValueError, match="^" + start.replace("*", r"\*")):
        build_trigger(expr, "UTC")


def test_it_rejects_an_unknown_timezone_with_a_suggestion() -> None:
    with pytest.raises(ValueError) as caught:
        build_trigger("* * * * *", "Europe/Pariss")
    assert str(caught.value).startswith(
        "unknown timezone 'Europe/Pariss'; use an IANA name such as UTC, Europe/Berlin or Asia/Shanghai; "
        "did you mean 'Europe/Paris'"
    )


def test_it_rejects_negative_jitter() -> None:
    with pytest.raises(ValueError, match="jitter must be >= 0 seconds"):
        build_trigger("* * * * *", "UTC", -1)


def test_jitter_is_applied_by_the_trigger_but_left_out_of_the_listed_times() -> None:
    trigger = build_trigger("* * * * *", "UTC", 5)
    assert trigger.jitter == 5
    assert next_fire_times(trigger, NOW, 2) == [
        datetime(2025, 1, 31, 9, 1, tzinfo=UTC),
        datetime(2025, 1, 31, 9, 2, tzinfo=UTC),
    ]
    fired = trigger.get_next_fire_time(None, NOW)
    assert datetime(2025, 1, 31, 9, 1, tzinfo=UTC) <= fired <= datetime(2025, 1, 31, 9, 1, 5, tzinfo=UTC)


def test_it_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire_times(build_trigger("* * * * *", "UTC"), datetime(2025, 1, 31), 1)


@given(st.sets(st.integers(min_value=0, max_value=7), min_size=1))
def test_a_weekday_list_fires_on_exactly_those_days_of_the_week(days: set[int]) -> None:
    expr = "0 0 * * " + ",".join(str(day) for day in sorted(days))
    times = next_fire_times(build_trigger(expr, "UTC"), NOW, 14)
    fired_on = {t.isoweekday() % 7 for t in times}  # cron numbering: Sunday = 0
    assert fired_on == {day % 7 for day in days}
    assert all(later - earlier <= timedelta(days=7) for earlier, later in pairwise(times))
