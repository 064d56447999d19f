"""Cron expressions to APScheduler triggers, with standard crontab meaning.

APScheduler 3's `CronTrigger` (and its `from_crontab`) counts weekdays from Monday = 0, while cron
counts from Sunday = 0, so `0 9 * * 1` would silently run on Tuesdays. We therefore parse the weekday
field ourselves and hand APScheduler weekday *names*, which both sides agree on.
"""

from __future__ import annotations

import copy
import difflib
import re
import zoneinfo
from datetime import datetime

from apscheduler.triggers.cron import CronTrigger

FIVE_FIELDS = ("minute", "hour", "day", "month", "day_of_week")
SIX_FIELDS = ("second", *FIVE_FIELDS)

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Index = cron weekday number (Sunday = 0).
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

_WEEKDAY_ITEM = re.compile(r"^(?P<range>\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(?P<step>\d+))?$")


def build_trigger(expr: str, timezone: str, jitter_s: float = 0) -> CronTrigger:
    """A trigger firing on cron expression `expr` in `timezone`, each fire delayed by up to `jitter_s`.

    `expr` is standard crontab (minute hour day month weekday, Sunday = 0 or 7), a 6-field form with
    seconds first, or a macro such as `@hourly`. Raises ValueError saying which part is wrong.
    """
    fields = split_cron_fields(expr)
    zone = resolve_timezone(timezone)
    if jitter_s < 0:
        raise ValueError(f"jitter must be >= 0 seconds, got {jitter_s}")
    if len(fields) == len(FIVE_FIELDS):
        fields = ["0", *fields]
    values = dict(zip(SIX_FIELDS, fields, strict=True))

    if not values["day"].startswith("*") and not values["day_of_week"].startswith("*"):
        # cron runs when *either* field matches; APScheduler only when both do. Refuse rather than
        # quietly run on far fewer days than the user expects.
        raise ValueError(
            f"'{expr}' restricts both day of month ({values['day']}) and weekday ({values['day_of_week']}); "
            "cron runs when either matches but this scheduler would need both, so use '*' for one of them "
            "(or split it into two jobs)"
        )
    values["day_of_week"] = weekday_field_for_apscheduler(values["day_of_week"])

    for name, value in values.items():
        try:
            CronTrigger(**{name: value}, timezone=zone)
        except ValueError as exc:
            raise ValueError(f"{field_label(name)} field '{value}' is invalid in '{expr}': {exc}") from exc
    trigger = CronTrigger(**values, timezone=zone, jitter=jitter_s or None)
    # Each field can be valid while their combination names no real date (30 February).
    if trigger.get_next_fire_time(None, datetime(2000, 1, 1, tzinfo=zone)) is None:
        raise ValueError(f"'{expr}' never fires: no date matches its day and month; check those fields")
    return trigger


def next_fire_times(trigger: CronTrigger, now: datetime, n: int) -> list[datetime]:
    """The next `n` nominal fire times at or after `now`, in the trigger's timezone.

    Jitter is left out: these are the times the schedule names, which is what people check.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware, e.g. datetime.now(UTC)")
    nominal = copy.copy(trigger)
    nominal.jitter = None
    times: list[datetime] = []
    previous: datetime | None = None
    for _ in range(n):
        fire_time = nominal.get_next_fire_time(previous, previous or now)
        if fire_time is None:
            break
        times.append(fire_time)
        previous = fire_time
    return times


def split_cron_fields(expr: str) -> list[str]:
    """The 5 or 6 fields of `expr` (macros expanded), or ValueError saying what shape is expected."""
    if not isinstance(expr, str):
        raise ValueError(f"a cron expression must be a string, got {type(expr).__name__}")
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise ValueError(f"unknown cron macro '{text}' (known: {', '.join(MACROS)})")
        text = MACROS[text.lower()]
    fields = text.split()
    if len(fields) not in (5, 6):
        raise ValueError(
            f"'{expr}' is not a cron expression "
            "(expected 5 fields: minute hour day month weekday, or 6 with seconds first)"
        )
    return fields


def weekday_field_for_apscheduler(field: str) -> str:
    """Translate a cron weekday field (Sunday = 0 or 7) into APScheduler weekday names."""
    if field in ("*", "?"):
        return "*"
    days: set[int] = set()
    for item in field.lower().split(","):
        match = _WEEKDAY_ITEM.match(item)
        if match is None:
            raise ValueError(f"weekday field '{field}' is invalid: cannot read '{item}'")
        step = int(match["step"]) if match["step"] else 1
        if step < 1:
            raise ValueError(f"weekday field '{field}' is invalid: a step must be at least 1")
        if match["range"] == "*":
            first, last = 0, 6
        elif "-" in match["range"]:
            low, high = match["range"].split("-")
            first, last = weekday_number(low, field), weekday_number(high, field)
            if first > last:
                raise ValueError(
                    f"weekday field '{field}' is invalid: range {match['range']} runs backwards "
                    "(0 = Sunday ... 6 = Saturday, 7 = Sunday)"
                )
        else:
            first = weekday_number(match["range"], field)
            last = first if not match["step"] else 6
        days.update(day % 7 for day in range(first, last + 1, step))
    if days == set(range(7)):
        return "*"
    return ",".join(WEEKDAY_NAMES[day] for day in sorted(days))


def weekday_number(token: str, field: str) -> int:
    """Cron weekday number for a digit 0-7 or a three-letter name."""
    if token in WEEKDAY_NAMES:
        return WEEKDAY_NAMES.index(token)
    if token.isdigit() and 0 <= int(token) <= 7:
        return int(token)
    raise ValueError(
        f"weekday field '{field}' is invalid: '{token}' is not a weekday "
        "(use 0-7 where 0 and 7 are Sunday, or sun, mon, tue, wed, thu, fri, sat)"
    )


def resolve_timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone called `name`, or ValueError suggesting the closest real names."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        close = difflib.get_close_matches(str(name), sorted(zoneinfo.available_timezones()), n=2)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"unknown timezone '{name}'; use an IANA name such as UTC, Europe/Berlin or Asia/Shanghai{hint}"
        ) from exc


def field_label(name: str) -> str:
    return {"day": "day of month", "day_of_week": "weekday"}.get(name, name)
