"""The regression alert rate per series-week beside the labels (`incidents stats`): pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from monitor.triage.stats import Judged, alert_rate, format_alert_rate


def test_the_alert_rate_is_per_series_week_and_the_labels_say_how_much_is_false() -> None:
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    # Three series watched 14, 14 and 7 days: 5 series-weeks.
    watched = [(t0, t0 + timedelta(days=14)), (t0, t0 + timedelta(days=14)), (t0, t0 + timedelta(days=7))]
    judged = [
        Judged(1, "regression", "page", "true-positive"),
        Judged(2, "regression", "ticket", "false-positive"),
        Judged(3, "regression", "ticket", "false-positive"),
        Judged(4, "regression", "ticket", None),
        Judged(5, "availability", "page", "false-positive"),  # not a regression alert
    ]
    rate = alert_rate(judged, watched, target=0.5)
    assert (rate.alerts, rate.true_positive, rate.false_positive) == (4, 1, 2)
    assert rate.series_weeks == 5.0 and rate.per_week == 0.8
    assert rate.false_per_week is not None and abs(rate.false_per_week - 0.8 * 2 / 3) < 1e-9
    assert format_alert_rate(rate) == (
        "regression alerts: 4 over 5.0 series-weeks = 0.80 a series-week; 2 of 3 labelled false, so about 0.53 "
        "false a series-week against detection.false_alerts_per_week 0.5 (over it)\n"
    )
    unlabelled = alert_rate([Judged(1, "regression", "page", None)], watched, target=0.5)
    assert format_alert_rate(unlabelled).endswith("= 0.20 a series-week; label them to see how many were false\n")
    young = alert_rate(judged, [(t0, t0 + timedelta(days=2))], target=0.5)
    assert "too little for a weekly rate" in format_alert_rate(young)
