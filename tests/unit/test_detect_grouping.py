"""The pure grouping rules (monitor.detect.grouping): who joins, what a group says, when it notifies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from monitor.detect.grouping import Member, decide, joins, scope, summarise

T0 = datetime(2025, 1, 6, 3, 10, tzinfo=UTC)
WINDOW = timedelta(minutes=15)


def member(target: str = "a1", prompt: str = "short", location: str = "lab", **changes: object) -> Member:
    values: dict[str, object] = {"severity": "page", "since": T0, "ratio": 2.0, "open": True}
    values.update(changes)
    return Member(target=target, prompt=prompt, location=location, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("last_joined", "now", "expected"),
    [(None, T0, False), (T0, T0 + WINDOW, True), (T0, T0 + WINDOW + timedelta(seconds=1), False)],
)
def test_an_incident_joins_the_group_whose_last_member_opened_within_the_window(
    last_joined: datetime | None, now: datetime, expected: bool
) -> None:
    assert joins(last_joined, now, WINDOW) is expected


def test_scopes_are_per_provider_or_per_series_when_grouping_is_off() -> None:
    assert scope("regression", "gateway-a") == "regression/provider/gateway-a"
    assert scope("regression", "gateway-a", series="7") == "regression/series/7"


@pytest.mark.parametrize(
    ("members", "locations", "text"),
    [
        (
            [
                member("a1", ratio=2.0),
                member("a1", "long", ratio=2.2),
                member("a2", ratio=1.9),
                member("a2", "long", ratio=2.4),
                member("a3", ratio=2.1),
                member("a3", "long", ratio=2.1),
            ],
            ["lab"],
            "gateway-a: 3 targets, 6 series, median 2.1x since 03:10",
        ),
        ([member("a1"), member("a1", "long")], ["lab"], "a1: 2 series, median 2.0x since 03:10"),
        (
            [member("a1"), member("a2")],
            ["lab", "iad"],
            "lab -> gateway-a: 2 targets, 2 series, median 2.0x since 03:10",
        ),
        (
            [member("a1", location="lab"), member("a2", location="iad")],
            ["lab", "iad"],
            "gateway-a: 2 targets, 2 series, median 2.0x since 03:10",
        ),
    ],
)
def test_a_group_is_named_by_the_narrowest_scope_covering_its_members(
    members: list[Member], locations: list[str], text: str
) -> None:
    assert summarise("gateway-a", members, provider_locations=locations).text() == text


def test_a_resolved_group_says_how_bad_it_got() -> None:
    members = [member(ratio=1.0, peak_ratio=3.0, open=False), member("a2", ratio=1.1, peak_ratio=2.0, open=False)]
    assert "median peak 2.5x" in summarise("gateway-a", members).text(resolved=True)


@pytest.mark.parametrize(
    ("members", "notified", "severity", "pending", "age", "expected"),
    [
        ([member()], 0, None, 0, timedelta(0), ("firing", 1, "page")),  # alone: at once
        ([member()], 0, None, 2, timedelta(minutes=5), None),  # others mid-streak: wait
        ([member()], 0, None, 2, timedelta(minutes=10), ("firing", 1, "page")),  # not longer than the hold
        ([member(), member("a2")], 1, "page", 0, timedelta(0), ("firing", 2, "page")),  # grew
        ([member(), member("a2")], 2, "page", 0, timedelta(0), None),  # nothing new
        ([member(severity="ticket")], 1, "ticket", 0, timedelta(0), None),
        ([member(severity="page")], 1, "ticket", 0, timedelta(0), ("firing", 1, "page")),  # rose
        ([member(open=False), member("a2")], 2, "page", 0, timedelta(0), None),  # one still open
        ([member(open=False), member("a2", open=False)], 2, "page", 0, timedelta(0), ("resolved", 2, "page")),
    ],
)
def test_a_group_notifies_when_it_opens_grows_rises_or_resolves(
    members: list[Member],
    notified: int,
    severity: str | None,
    pending: int,
    age: timedelta,
    expected: tuple[str, int, str] | None,
) -> None:
    decision = decide(
        members,
        notified_members=notified,
        notified_severity=severity,
        resolved=False,
        pending=pending,
        age=age,
        hold=timedelta(minutes=10),
    )
    assert decision == expected


def test_a_group_keeps_one_pagerduty_dedup_key_and_one_alertmanager_alert_as_it_grows() -> None:
    import uuid

    from monitor.alert.receivers import alertmanager, pagerduty
    from tests.support.alert_fixtures import notification

    group = uuid.uuid4()
    alone = notification(group_id=group)
    grown = notification(group_id=group, group="gateway-a: 3 targets, 6 series", members=tuple("abcdef"))
    resolved = grown.with_changes(state="resolved", resolved_at=T0 + timedelta(hours=1))
    assert pagerduty.dedup_key(alone) == pagerduty.dedup_key(grown) == pagerduty.dedup_key(resolved)
    labels = alertmanager.alert_labels(alone)
    assert labels == alertmanager.alert_labels(grown) == alertmanager.alert_labels(resolved)
    assert labels["group_id"] == str(group)
    # Growing is a new change to deliver (the group's new members), the same incident to the receiver.
    assert alone.change_key() != grown.change_key()
    assert grown.with_changes(members=tuple("abcdefg")).change_key() != grown.change_key()
    assert grown.to_json()["members"] == list("abcdef")
    assert type(grown).from_json(grown.to_json()) == grown


@pytest.mark.parametrize(
    ("grouping", "key"),
    [({"window_minutes": 0}, "window_minutes"), ({"hold_minutes": -1}, "hold_minutes"), ({"wait": 1}, "wait")],
)
def test_bad_grouping_settings_are_refused_naming_the_key(grouping: dict[str, object], key: str) -> None:
    from pydantic import ValidationError

    from monitor.config.models import Config

    with pytest.raises(ValidationError) as caught:
        Config.model_validate({"alerts": {"grouping": grouping}})
    assert key in str(caught.value) and "grouping" in str(caught.value)


def test_a_group_by_location_is_named_by_where_it_is_seen_from() -> None:
    members = [member("a1"), member("b1", location="lab")]
    assert summarise("lab", members, by="location").text().startswith("from lab: 2 targets, 2 series")
    assert summarise("lab", [member("a1")], by="location").text().startswith("a1 from lab: 1 series")
    assert scope("regression", "lab", by="location") == "regression/location/lab"
