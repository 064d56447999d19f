"""One page per outage: regression incidents of series behind one provider that open within minutes of
each other form a group, notified once as a whole. Pure: which group an incident joins, what the
group says, and when it is notified again. The service keeps groups in the database
(monitor/store/incidents.py); `replay` keeps them in memory; both decide here.

A group's notification is its lead incident's (the first member's), so its PagerDuty dedup key and its
Alertmanager labels stay the same from the first notice to the resolve. A group of one reads like any
single series' notification. A group whose members are all seen from one location, of a provider
that is also watched from other locations, is labelled as that location's path to the provider: the
provider is fine from elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from monitor.detect.stats import median

# Incidents of these kinds are grouped; others (SLO, model changes, availability) notify per series.
GROUPED_KINDS = frozenset({"regression"})
SEVERITY_RANK = {"info": 0, "ticket": 1, "page": 2}


def scope(kind: str, name: str, *, by: str = "provider", series: str | None = None) -> str:
    """The key a group is claimed under: per kind and provider (or location: `by`, `name` its value),
    or per series (`series`: grouping off)."""
    return f"{kind}/series/{series}" if series is not None else f"{kind}/{by}/{name}"


def joins(last_joined_at: datetime | None, now: datetime, window: timedelta) -> bool:
    """Whether an incident opening at `now` joins the scope's current group (last joined then)."""
    return last_joined_at is not None and last_joined_at >= now - window


@dataclass(frozen=True, slots=True)
class Member:
    """One member incident as the group sees it."""

    target: str
    prompt: str
    location: str
    severity: str
    since: datetime
    ratio: float | None
    open: bool
    peak_ratio: float | None = None  # the highest ratio while it was open


@dataclass(frozen=True, slots=True)
class Summary:
    """What a group's notification says: `gateway-a: 3 targets, 6 series, median 2.1x since 03:10`, or
    `qwen3-14b: 2 series, median 2.5x since 03:10` when they are one model's prompts."""

    label: str
    targets: int
    series: int
    ratio: float | None  # the median of the members' ratios
    peak_ratio: float | None  # the median of the members' peaks
    since: datetime
    severity: str
    names: tuple[str, ...]  # the members, `target / prompt @ location`

    def text(self, *, resolved: bool = False) -> str:
        """The one line; a resolved group's says how bad it got, not the ratios it cleared at."""
        if resolved and self.peak_ratio is not None:
            ratio = f", median peak {self.peak_ratio:.1f}x"
        else:
            ratio = f", median {self.ratio:.1f}x" if self.ratio is not None else ""
        count = f"{self.series} series" if self.targets == 1 else f"{self.targets} targets, {self.series} series"
        return f"{self.label}: {count}{ratio} since {self.since.strftime('%H:%M')}"


def summarise(
    provider: str, members: Sequence[Member], *, provider_locations: Iterable[str] = (), by: str = "provider"
) -> Summary:
    """The group's summary. `provider_locations`: every location the provider is watched from; when
    there are several and the members are all at one, the label is that location's path. Grouped by
    location (`by`), `provider` is the location: the label says what is slow from there."""
    locations = {m.location for m in members}
    targets = {m.target for m in members}
    watched = set(provider_locations) | locations
    # The narrowest name that covers every member: one model (its prompts), else the provider; seen
    # from one location of several, the path from there.
    label = next(iter(targets)) if len(targets) == 1 else provider
    if by == "location":
        label = f"{next(iter(targets))} from {provider}" if len(targets) == 1 else f"from {provider}"
    elif len(locations) == 1 and len(watched) > 1:
        label = f"{next(iter(locations))} -> {label}"
    ratios = [m.ratio for m in members if m.ratio is not None]
    peaks = [m.peak_ratio for m in members if m.peak_ratio is not None]
    return Summary(
        label=label,
        targets=len(targets),
        series=len(members),
        ratio=median(ratios) if ratios else None,
        peak_ratio=median(peaks) if peaks else None,
        since=min(m.since for m in members),
        severity=max((m.severity for m in members), key=lambda s: SEVERITY_RANK.get(s, 0)),
        names=tuple(sorted(f"{m.target} / {m.prompt} @ {m.location}" for m in members)),
    )


Decision = tuple[Literal["firing", "resolved"], int, str]  # the notification, members, severity


def decide(
    members: Sequence[Member],
    *,
    notified_members: int,
    notified_severity: str | None,
    resolved: bool,
    pending: int = 0,
    age: timedelta = timedelta(0),
    hold: timedelta = timedelta(0),
) -> Decision | None:
    """What the group's next notification is, or None: `firing` when it has grown or its severity rose
    since the last one, `resolved` once every member has resolved (after a firing one went out).

    The first notification waits while `pending` other series of the scope have begun a confirming
    streak (they are a run or two from joining), for at most `hold` after the group opened (`age`):
    an outage's series rarely confirm in the same run, and the first page should name them all. A
    regression of one series alone has no one to wait for and goes out at once.
    """
    if resolved or not members:
        return None
    if not any(m.open for m in members):
        return ("resolved", len(members), notified_severity or members[0].severity)
    severity = max((m.severity for m in members), key=lambda s: SEVERITY_RANK.get(s, 0))
    if notified_members == 0 and pending > 0 and age < hold:
        return None
    grown = len(members) > notified_members
    rose = notified_severity is None or SEVERITY_RANK.get(severity, 0) > SEVERITY_RANK.get(notified_severity, 0)
    return ("firing", len(members), severity) if grown or rose else None
