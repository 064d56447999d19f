"""Which receivers a notification goes to, and whether a silence holds it back. Pure functions.

Routes: a receiver gets a notification when any route naming it takes the notification's severity
and job. Without any route, every receiver takes `page` and `ticket` (the default of a route), so a
config with one receiver and no routes just works.

Silences: a one-off window [start, end), or a recurring one starting at each `cron` fire time and
lasting `duration_s`; for the listed targets, or for everything when none are listed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from monitor.alert.model import Notification
from monitor.alert.settings import Receiver, Route, Silence
from monitor.config.cron import build_trigger

DEFAULT_SEVERITIES = ("page", "ticket")


def route(notification: Notification, routes: Sequence[Route], receivers: Mapping[str, Receiver]) -> list[str]:
    """Receiver names for `notification`, in config order, each once."""
    if not routes:
        return list(receivers) if notification.severity in DEFAULT_SEVERITIES else []
    chosen: list[str] = []
    for item in routes:
        if notification.severity not in item.severities:
            continue
        if item.jobs and notification.job not in item.jobs:
            continue
        chosen += [name for name in item.receivers if name in receivers and name not in chosen]
    return chosen


def silence_window(silence: Silence, now: datetime) -> tuple[datetime, datetime] | None:
    """The window of `silence` that contains `now`, or None."""
    if silence.start is not None and silence.end is not None:
        return (silence.start, silence.end) if silence.start <= now < silence.end else None
    if silence.cron is None or silence.duration_s is None:
        return None
    duration = timedelta(seconds=silence.duration_s)
    trigger = copy.copy(build_trigger(silence.cron, silence.timezone))
    trigger.jitter = None
    # The first window start after (now - duration) is the only one that can still be open.
    start = trigger.get_next_fire_time(None, now - duration)
    if start is None or start > now:
        return None
    end = start + duration
    return (start, end) if now < end else None


def active_silence(
    notification: Notification, silences: Sequence[Silence], now: datetime
) -> tuple[int, Silence] | None:
    """The first silence (index, silence) covering the notification's target at `now`, or None."""
    for index, silence in enumerate(silences):
        if silence.targets and notification.target not in silence.targets:
            continue
        if silence_window(silence, now) is not None:
            return index, silence
    return None


def describe_silence(index: int, silence: Silence) -> str:
    """`silenced by alerts.silences[0] (database maintenance)`."""
    text = f"silenced by alerts.silences[{index}]"
    return f"{text} ({silence.comment})" if silence.comment else text
