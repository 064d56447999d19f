"""Incidents keep what mattered: the numbers at opening, the peak and when, the duration."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from monitor.alert.model import Notification
from monitor.alert.text import facts, headline
from monitor.detect.detector import Detector, SeriesState
from tests.support.alert_fixtures import notification as alert_notification
from tests.support.series import Step, at_day, series


def test_a_resolve_carries_the_peak_and_the_numbers_at_opening() -> None:
    # Twice as slow for three hours, then three times as slow for one, then healthy again.
    steps = [Step(8.5, 3, 2.0), Step(8.5 + 3 / 24, 1, 3.0)]
    replayer = Detector().replayer()
    events = [event for point in series(9.2, sigma=0.1, seed=3, steps=steps) for event in replayer.feed(point)]
    regression = [e for e in events if e.kind == "regression"]
    opened, resolved = regression[0], regression[-1]
    assert (opened.action, resolved.action) == ("open", "resolve")
    assert resolved.ratio is not None and resolved.ratio < 1.1  # the ratio when it cleared
    assert resolved.peak_ratio is not None and 2.6 < resolved.peak_ratio < 3.4
    assert resolved.peak_at is not None and at_day(8.5 + 3 / 24) <= resolved.peak_at <= at_day(8.5 + 4 / 24)
    assert resolved.detail["opened_baseline_ms"] == opened.baseline_ms
    assert resolved.detail["opened_observed_ms"] == opened.observed_ms
    assert resolved.detail["duration_s"] == (resolved.at - opened.at).total_seconds()


def test_the_peak_survives_a_restart() -> None:
    points = series(9, sigma=0.1, seed=3, steps=[Step(8.5, 3, 2.0)])
    replayer = Detector().replayer()
    for point in points[: round(8.6 * 288)]:
        replayer.feed(point)
    incident = replayer.state.incidents["regression"]
    assert incident.peak_ratio is not None and incident.peak_at is not None
    loaded = SeriesState.from_json(json.loads(json.dumps(replayer.state.to_json())))
    assert loaded.incidents["regression"] == incident
    # An incident stored before peaks were kept still loads.
    old = replayer.state.to_json()
    for key in ("peak_ratio", "peak_at"):
        del old["incidents"]["regression"][key]
    assert SeriesState.from_json(old).incidents["regression"].peak_ratio is None


def test_a_resolve_notification_shows_the_peak_not_the_ratio_at_resolve() -> None:
    since = datetime(2025, 1, 6, 3, 10, tzinfo=UTC)
    notification = alert_notification(
        state="resolved",
        since=since,
        resolved_at=since + timedelta(hours=2),
        baseline_ms=400.0,
        observed_ms=420.0,
        ratio=1.05,
        peak_ratio=2.1,
        peak_at=since + timedelta(minutes=40),
    )
    assert headline(notification) == (
        "[RESOLVED] TTFT regression on qwen3-8b / short @ fra-dc1: peaked at 2.10x baseline, back to 1.05x"
    )
    assert ("Peak", "2.10x at 2025-01-06 03:50 UTC") in facts(notification, since + timedelta(hours=3))
    assert Notification.from_json(json.loads(json.dumps(notification.to_json()))) == notification
