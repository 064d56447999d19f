"""What the alerting side is given, and what a receiver hands the transport. Pure data, no I/O.

The detector's incident events are mapped onto `Notification` by the daemon; everything in
`monitor.alert` works from it, so no receiver depends on the detector's own types.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypedDict
from urllib.parse import urlencode, urlsplit, urlunsplit

State = Literal["firing", "resolved", "info"]
# How a delivery attempt ended: only `transient` failures are worth retrying.
Outcome = Literal["ok", "transient", "permanent"]
STATES: tuple[State, ...] = ("firing", "resolved", "info")
# What the detector decides an incident is (monitor/detect/rules.py) and what routes select on.
Severity = Literal["page", "ticket", "info"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """One state change of one incident, with everything a person needs to act on it.

    `since` is when the incident opened; `resolved_at` is set for `resolved`. `baseline_ms` is the
    SLO objective for `slo` incidents. `repeat` is 0 for the first notice, n for the n-th reminder of
    an incident that stays open. `link` points at the series (see `series_link`).
    """

    incident_id: uuid.UUID
    state: State
    kind: str
    severity: str
    job: str
    target: str
    model: str
    provider: str
    prompt: str
    location: str
    since: datetime
    resolved_at: datetime | None = None
    baseline_ms: float | None = None
    observed_ms: float | None = None
    ratio: float | None = None
    error_class: str | None = None
    peak_ratio: float | None = None  # the highest ratio while the incident was open, and when
    peak_at: datetime | None = None
    # The baseline and observed TTFT when it opened (monitor.detect.figures): baseline_ms, observed_ms
    # and ratio are the latest, a resolve's those of the run that cleared it.
    opened_baseline_ms: float | None = None
    opened_observed_ms: float | None = None
    summary: str = ""
    link: str | None = None
    repeat: int = 0
    # Where the time went, from the server's own metrics (monitor.detect.attribution), when known.
    cause: str | None = None
    attribution: str = ""
    # Change markers (`ttft-monitor annotate`) shortly before the incident: "after annotation 'vLLM
    # upgraded' at 03:02 UTC". Filled in by the outbox when it enqueues.
    annotation: str = ""
    # One page per outage (monitor.detect.grouping): the group this notification speaks for, its
    # summary (`gateway-a: 3 targets, 6 series, median 2.1x since 03:10`) and members, when it has
    # more than one; the rest of the fields are its lead incident's.
    group_id: uuid.UUID | None = None
    group: str = ""
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {self.state!r}")
        for name in ("since", "resolved_at", "peak_at"):
            moment = getattr(self, name)
            if moment is not None and moment.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware (UTC), got {moment.isoformat()}")

    @property
    def series(self) -> str:
        """`target / prompt @ location`: how the series is named in every message."""
        return f"{self.target} / {self.prompt} @ {self.location}"

    @property
    def grouped(self) -> bool:
        """Whether this speaks for several series (an outage) rather than one."""
        return len(self.members) > 1

    def change_key(self) -> str:
        """Names this state change. Equal keys are the same change: enqueued once, whoever enqueues it.

        A severity change of an open incident is a new change; a repeat of the same event is not.
        """
        if self.state == "firing":
            base = f"{self.incident_id}/firing/{self.severity}"
            if len(self.members) > 1:  # a group that grew is a new change (same PagerDuty dedup key)
                base += f"/members/{len(self.members)}"
            return f"{base}/repeat/{self.repeat}" if self.repeat else base
        return f"{self.incident_id}/{self.state}"

    def message_id(self) -> str:
        """A stable id for this change, the same on every retry and from every daemon."""
        return "msg_" + hashlib.sha256(self.change_key().encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (stored in the outbox); `from_json` reads it back."""
        data = asdict(self)
        data["incident_id"] = str(self.incident_id)
        data["group_id"] = None if self.group_id is None else str(self.group_id)
        data["members"] = list(self.members)
        data["since"] = self.since.astimezone(UTC).isoformat()
        data["resolved_at"] = None if self.resolved_at is None else self.resolved_at.astimezone(UTC).isoformat()
        data["peak_at"] = None if self.peak_at is None else self.peak_at.astimezone(UTC).isoformat()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Notification:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["incident_id"] = uuid.UUID(str(values["incident_id"]))
        if values.get("group_id") is not None:
            values["group_id"] = uuid.UUID(str(values["group_id"]))
        values["members"] = tuple(values.get("members") or ())
        values["since"] = datetime.fromisoformat(values["since"])
        for name in ("resolved_at", "peak_at"):
            if values.get(name) is not None:
                values[name] = datetime.fromisoformat(values[name])
        return cls(**values)

    def with_changes(self, **changes: Any) -> Notification:
        return replace(self, **changes)


def series_link(
    base_url: str | None, *, target: str, prompt: str, location: str, job: str = "", at: datetime | None = None
) -> str | None:
    """The series' page under `alerts.base_url`, as Grafana-style variables; None without a base URL.

    `https://grafana.example.com/d/ttft` ->
    `https://grafana.example.com/d/ttft?var-target=qwen3-8b&var-prompt=short&var-location=fra-dc1`.
    `at` (the incident's time) opens the built-in series page (`http://host:9464/series`) there.
    """
    if not base_url:
        return None
    params = {"var-target": target, "var-prompt": prompt, "var-location": location}
    if job:
        params["var-job"] = job
    if at is not None:
        params["at"] = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    parts = urlsplit(base_url)
    query = f"{parts.query}&{urlencode(params)}" if parts.query else urlencode(params)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


class NamedSeries(Protocol):
    """What names a series: a store `SeriesKey`, or an incident read with its series' columns."""

    @property
    def target(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def prompt(self) -> str: ...
    @property
    def location(self) -> str: ...


class SeriesFields(TypedDict):
    """The `Notification` fields that say which series of which job it is about, and link to it."""

    job: str
    target: str
    model: str
    provider: str
    prompt: str
    location: str
    link: str | None


def series_fields(series: NamedSeries, *, job: str, opened_at: datetime, base_url: str | None) -> SeriesFields:
    """`Notification(**series_fields(...), ...)`: the series' names, and the link to its page at the time the
    incident opened (see `series_link`); every incident notification names its series this way."""
    return SeriesFields(
        job=job,
        target=series.target,
        model=series.model,
        provider=series.provider,
        prompt=series.prompt,
        location=series.location,
        link=series_link(
            base_url, target=series.target, prompt=series.prompt, location=series.location, job=job, at=opened_at
        ),
    )


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """What a receiver wants sent: built by a pure function, sent by the one shared transport."""

    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
