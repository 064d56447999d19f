"""The detector's data: runs in, events out, and the per-series state kept between runs (with its
JSON form, the `detector_state.state` column)."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from monitor.alert.model import Severity
from monitor.detect.noise import NoiseModel
from monitor.detect.rules import Action, Kind

if TYPE_CHECKING:
    from monitor.store.records import RunRecord

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class RunPoint:
    """One run of a series: when it started, its median TTFT (None when every request failed), the
    dominant error class, the model name the server reported, and its request counts (by default
    one request: ok when `ttft_ms` is set, failed otherwise)."""

    at: datetime
    ttft_ms: float | None
    error: str | None = None
    served_model: str | None = None
    ok: int | None = None
    errors: int | None = None
    fingerprint: str | None = None  # OpenAI's system_fingerprint, the run's most common
    canary: str | None = None  # the hash of the target's canary answer after the run
    server_build: str | None = None  # what its self-hosted server says it runs (version, weights, cache)
    # False: the run says nothing about the series' latency (a warm probe that found no prompt cache:
    # the cache's incident); which model answered and availability are still judged on it.
    latency_evidence: bool = True
    # Median output tokens per measured probe (reasoning included), and the reasoning among them.
    output_tokens: float | None = None
    reasoning_tokens: float | None = None

    def __post_init__(self) -> None:
        if self.at.utcoffset() is None:
            raise ValueError(f"run time {self.at.isoformat()} has no time zone; give it one (UTC)")
        if self.ttft_ms is not None and not (self.ttft_ms > 0 and math.isfinite(self.ttft_ms)):
            raise ValueError(f"ttft_ms must be positive and finite, got {self.ttft_ms!r}")

    @property
    def failed(self) -> bool:
        return self.ttft_ms is None

    def counts(self) -> tuple[int, int]:
        """(successful, failed) measured requests."""
        ok = self.ok if self.ok is not None else (0 if self.ttft_ms is None else 1)
        errors = self.errors if self.errors is not None else (1 if self.ttft_ms is None else 0)
        return ok, errors


@dataclass(slots=True)
class HistoryColumns:
    """Runs as columns, oldest first, each the `RunPoint` it stands for with only what the detector reads of
    a run before the one it evaluates (`_Core.load`): its start (seconds since the epoch, as
    `datetime.timestamp` gives it), its median TTFT (nan: every request failed), its request counts and its
    dominant error class. Runs that are no latency evidence are not among them.

    `residuals`: each run's seasonal residual where an earlier evaluation computed it (None: not known),
    under the model epoch `residual_epoch` (the detector uses them only under that epoch). A residual
    depends only on the runs of the days before its run, so one computed from a history complete back to
    its reach is the same number read afresh. After an evaluation, `computed` holds (index, residual) of the
    runs whose residual its core computed from such a history, under `computed_epoch`."""

    moments: list[float]
    ttfts: list[float]
    oks: list[int]
    errors: list[int]
    error_classes: list[str | None]
    residuals: list[float | None] | None = None
    residual_epoch: datetime | None = None
    # The history the columns were cut from is complete from here (seconds): a residual whose reach
    # starts here or later was computed from every run it depends on.
    complete_from: float = math.inf
    computed: list[tuple[int, float]] = field(default_factory=list)
    computed_epoch: datetime | None = None
    # (generation, first index) of the kept history the columns were cut from, to hand residuals back.
    origin: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.moments)

    def since(self, moment: float) -> HistoryColumns:
        """The runs started at `moment` or later (without residuals)."""
        low = bisect_left(self.moments, moment)
        if not low:
            return self
        return HistoryColumns(
            self.moments[low:], self.ttfts[low:], self.oks[low:], self.errors[low:], self.error_classes[low:]
        )


def is_evidence(record: RunRecord) -> bool:
    """False for a run whose every measured sample was disturbed (the monitor's own delay): it says
    nothing about the server, and read as a point it would look like a run of failures."""
    return counts_as_evidence(record.rounds, record.ok, record.errors)


def counts_as_evidence(rounds: int, ok: int, errors: int) -> bool:
    """`is_evidence` of a run with these counts: it measured nothing, or not every sample was disturbed."""
    return rounds == 0 or ok + errors > 0


def point_from_run(record: RunRecord, *, served_model: str | None = None, fingerprint: str | None = None) -> RunPoint:
    """The detector's view of a stored run."""
    return RunPoint(
        at=record.started_at,
        ttft_ms=record.ttft_p50_ms,
        error=record.error.value if record.error is not None else None,
        served_model=served_model,
        ok=record.ok,
        errors=record.errors,
        fingerprint=fingerprint,
        canary=record.canary,
        server_build=record.server_build,
    )


@dataclass(frozen=True, slots=True)
class Event:
    """A change in a series' incidents. `at` is the run that caused it; `opened_at` the incident's
    opening (the run that confirmed it); `detail["since"]` the first run of its confirming streak."""

    kind: Kind
    action: Action
    severity: Severity
    at: datetime
    opened_at: datetime
    resolved_at: datetime | None = None
    baseline_ms: float | None = None
    observed_ms: float | None = None
    ratio: float | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    peak_ratio: float | None = None  # the highest ratio while the incident was open, and when
    peak_at: datetime | None = None


@dataclass(slots=True)
class Incident:
    """An open incident, as the state remembers it."""

    kind: Kind
    severity: Severity
    opened_at: datetime
    since: datetime
    baseline_ms: float | None = None
    observed_ms: float | None = None
    ratio: float | None = None
    error: str | None = None
    triggers: list[str] = field(default_factory=list)
    peak_ratio: float | None = None  # the highest ratio seen while open (a short window's median)
    peak_at: datetime | None = None

    def see(self, ratio: float, at: datetime) -> None:
        """Remember `ratio` if it is the highest yet."""
        if self.peak_ratio is None or ratio > self.peak_ratio:
            self.peak_ratio, self.peak_at = ratio, at

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "opened_at": self.opened_at.isoformat(),
            "since": self.since.isoformat(),
            "baseline_ms": self.baseline_ms,
            "observed_ms": self.observed_ms,
            "ratio": self.ratio,
            "error": self.error,
            "triggers": list(self.triggers),
            "peak_ratio": self.peak_ratio,
            "peak_at": self.peak_at.isoformat() if self.peak_at is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Incident:
        return cls(
            kind=data["kind"],
            severity=data["severity"],
            opened_at=datetime.fromisoformat(data["opened_at"]),
            since=datetime.fromisoformat(data["since"]),
            baseline_ms=data.get("baseline_ms"),
            observed_ms=data.get("observed_ms"),
            ratio=data.get("ratio"),
            error=data.get("error"),
            triggers=list(data.get("triggers", [])),
            peak_ratio=data.get("peak_ratio"),
            peak_at=datetime.fromisoformat(data["peak_at"]) if data.get("peak_at") else None,
        )

    def copy(self) -> Incident:
        return Incident(
            self.kind,
            self.severity,
            self.opened_at,
            self.since,
            self.baseline_ms,
            self.observed_ms,
            self.ratio,
            self.error,
            list(self.triggers),
            self.peak_ratio,
            self.peak_at,
        )


@dataclass(slots=True)
class SeriesState:
    """What the detector remembers about one series between runs: open incidents (at most one per
    kind), confirmation streaks and the last served model. Small; history comes from the runs table."""

    page_streak: int = 0
    page_since: datetime | None = None
    ticket_streak: int = 0
    ticket_since: datetime | None = None
    slo_streak: int = 0
    slo_since: datetime | None = None
    resolved_at: datetime | None = None  # of the last regression incident
    served_model: str | None = None
    incidents: dict[str, Incident] = field(default_factory=dict)
    cusum: float = 0.0  # the sequential rule's sum, in long-run sigmas
    cusum_since: datetime | None = None  # the first run of its current excursion above 0
    cusum_runs: int = 0  # runs in that excursion
    # How noisy and how autocorrelated the residuals are (monitor/detect/noise.py). None: not measured
    # yet (a new series, or a state stored before the model existed): the detector seeds it from the
    # history it is given.
    noise: NoiseModel | None = None
    # Which model answered (detect/identity.py): the fingerprint last confirmed, a different one seen
    # on the last runs (value, first run) and on how many in a row; and where the current baseline
    # epoch began (None: the series' whole history counts).
    fingerprint: str | None = None
    fingerprint_pending: tuple[str, datetime] | None = None
    fingerprint_pending_runs: int = 0
    epoch_since: datetime | None = None
    # The same for the canary's answer hash, with its last hashes (to tell an answer that varies on
    # every run, `canary_unstable`, from one that changed).
    canary: str | None = None
    canary_pending: tuple[str, datetime] | None = None
    canary_pending_runs: int = 0
    canary_recent: list[str] = field(default_factory=list)
    canary_unstable: bool = False
    # The last run's median output and reasoning tokens per probe (detect/identity.py `tokens_jump`).
    output_tokens: float | None = None
    reasoning_tokens: float | None = None
    # What the self-hosted server says it runs, confirmed like the fingerprint (detect/identity.py).
    server_build: str | None = None
    server_build_pending: tuple[str, datetime] | None = None
    server_build_pending_runs: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the `detector_state.state` column)."""

        def stamp(moment: datetime | None) -> str | None:
            return moment.isoformat() if moment is not None else None

        return (
            {
                "version": STATE_VERSION,
                "page_streak": self.page_streak,
                "page_since": stamp(self.page_since),
                "ticket_streak": self.ticket_streak,
                "ticket_since": stamp(self.ticket_since),
                "slo_streak": self.slo_streak,
                "slo_since": stamp(self.slo_since),
                "resolved_at": stamp(self.resolved_at),
                "served_model": self.served_model,
                "incidents": {kind: incident.to_json() for kind, incident in sorted(self.incidents.items())},
                "cusum": self.cusum,
                "cusum_since": stamp(self.cusum_since),
                "cusum_runs": self.cusum_runs,
            }
            | ({"noise": self.noise.to_json()} if self.noise is not None else {})
            | self._identity_json()
        )

    def _identity_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        if self.fingerprint_pending is not None:
            value, first = self.fingerprint_pending
            out["fingerprint_pending"] = [value, first.isoformat(), self.fingerprint_pending_runs]
        if self.epoch_since is not None:
            out["epoch_since"] = self.epoch_since.isoformat()
        if self.canary is not None or self.canary_recent:
            out["canary"] = self.canary
            out["canary_recent"] = list(self.canary_recent)
            out["canary_unstable"] = self.canary_unstable
        if self.canary_pending is not None:
            value, first = self.canary_pending
            out["canary_pending"] = [value, first.isoformat(), self.canary_pending_runs]
        if self.output_tokens is not None:
            out["output_tokens"], out["reasoning_tokens"] = self.output_tokens, self.reasoning_tokens
        if self.server_build is not None:
            out["server_build"] = self.server_build
        if self.server_build_pending is not None:
            value, first = self.server_build_pending
            out["server_build_pending"] = [value, first.isoformat(), self.server_build_pending_runs]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SeriesState:
        """The state `to_json` wrote. A newer version than this code knows is refused (ValueError)."""
        version = data.get("version", STATE_VERSION)
        if version != STATE_VERSION:
            raise ValueError(f"detector state version {version} is not supported (expected {STATE_VERSION})")

        def moment(key: str) -> datetime | None:
            value = data.get(key)
            return datetime.fromisoformat(value) if value is not None else None

        return cls(
            page_streak=int(data.get("page_streak", 0)),
            page_since=moment("page_since"),
            ticket_streak=int(data.get("ticket_streak", 0)),
            ticket_since=moment("ticket_since"),
            slo_streak=int(data.get("slo_streak", 0)),
            slo_since=moment("slo_since"),
            resolved_at=moment("resolved_at"),
            served_model=data.get("served_model"),
            incidents={kind: Incident.from_json(value) for kind, value in data.get("incidents", {}).items()},
            cusum=float(data.get("cusum", 0.0)),
            cusum_since=moment("cusum_since"),
            cusum_runs=int(data.get("cusum_runs", 0)),
            noise=NoiseModel.from_json(data["noise"]) if isinstance(data.get("noise"), dict) else None,
            fingerprint=data.get("fingerprint"),
            fingerprint_pending=_pending(data.get("fingerprint_pending")),
            fingerprint_pending_runs=_pending_runs(data.get("fingerprint_pending")),
            epoch_since=moment("epoch_since"),
            canary=data.get("canary"),
            canary_pending=_pending(data.get("canary_pending")),
            canary_pending_runs=_pending_runs(data.get("canary_pending")),
            canary_recent=[str(v) for v in data.get("canary_recent") or []],
            canary_unstable=bool(data.get("canary_unstable", False)),
            output_tokens=data.get("output_tokens"),
            reasoning_tokens=data.get("reasoning_tokens"),
            server_build=data.get("server_build"),
            server_build_pending=_pending(data.get("server_build_pending")),
            server_build_pending_runs=_pending_runs(data.get("server_build_pending")),
        )

    def copy(self) -> SeriesState:
        return SeriesState(
            self.page_streak,
            self.page_since,
            self.ticket_streak,
            self.ticket_since,
            self.slo_streak,
            self.slo_since,
            self.resolved_at,
            self.served_model,
            {k: v.copy() for k, v in self.incidents.items()},
            self.cusum,
            self.cusum_since,
            self.cusum_runs,
            self.noise.copy() if self.noise is not None else None,
            self.fingerprint,
            self.fingerprint_pending,
            self.fingerprint_pending_runs,
            self.epoch_since,
            self.canary,
            self.canary_pending,
            self.canary_pending_runs,
            list(self.canary_recent),
            self.canary_unstable,
            self.output_tokens,
            self.reasoning_tokens,
            self.server_build,
            self.server_build_pending,
            self.server_build_pending_runs,
        )


def _pending(stored: Any) -> tuple[str, datetime] | None:
    """A pending identity value as stored (`[value, first seen, runs]`); None when missing or unreadable
    (written by hand, or damaged): the confirmation then starts again, which costs one run."""
    if not isinstance(stored, list) or len(stored) != 3:
        return None
    try:
        return str(stored[0]), datetime.fromisoformat(str(stored[1]))
    except ValueError:
        return None


def _pending_runs(stored: Any) -> int:
    if _pending(stored) is None or not isinstance(stored[2], int) or isinstance(stored[2], bool):
        return 0
    return max(0, stored[2])
