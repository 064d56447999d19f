"""SLO burn rates: how fast a target spends its TTFT error budget. Pure code.

A target with `slo.ttft_ms` and `slo.objective` promises that a share `objective` of its probes
succeed within `ttft_ms`; a probe that fails, times out or is slower is bad. The error budget is
1 - objective, and the burn rate over a window is the window's share of bad probes divided by the
budget: at 1x the budget lasts exactly the SLO period, at 14.4x a 30-day budget loses 2% an hour.

Multi-window, multi-burn-rate (Google's SRE workbook, "Alerting on SLOs"): a pair of windows fires
when the burn rate over both its long window (enough budget spent to matter) and its short window
(still being spent) reaches its factor. The incident takes the highest severity of the pairs that
fire, and resolves once none has fired for `keep_firing_s`.

`window_counts` and `evaluate` are the verdict for one moment; `advance` moves an incident along;
`BurnReplayer` feeds a long series of probes through both, as `replay` does. The daemon counts the
windows in SQL (monitor/detect/burn_service.py) and calls the same `evaluate` and `advance`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from monitor.detect.settings import SloBurn
    from monitor.probe.settings import Target

BurnSeverity = Literal["page", "ticket"]
Action = Literal["open", "update", "resolve"]
KIND = "slo_burn"
SEVERITY_RANK = {"ticket": 1, "page": 2}
# Burn rates are compared with a relative tolerance, so 18 bad probes of 125 (14.4%) against a 1%
# budget is 14.4x, not 14.399999999999999x.
TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Probe:
    """One measured probe of a target: when its run started, and whether it met the objective."""

    at: datetime
    good: bool


def is_good(ttft_ms: float | None, error: str | None, threshold_ms: float) -> bool:
    """A probe is good when it succeeded and its first token came within the threshold."""
    return error is None and ttft_ms is not None and ttft_ms <= threshold_ms


@dataclass(frozen=True, slots=True)
class BurnRule:
    """One pair of windows: fires when the burn rate over both reaches `factor`."""

    severity: BurnSeverity
    factor: float
    long_s: float
    short_s: float

    def __post_init__(self) -> None:
        if not (self.factor > 0 and 0 < self.short_s < self.long_s):
            raise ValueError(f"a burn rule needs factor > 0 and 0 < short < long window, got {self}")


DEFAULT_RULES = (
    BurnRule("page", 14.4, 3600.0, 300.0),
    BurnRule("page", 6.0, 6 * 3600.0, 1800.0),
    BurnRule("ticket", 1.0, 3 * 86400.0, 6 * 3600.0),
)


@dataclass(frozen=True, slots=True)
class BurnPolicy:
    """A target's objective and the rules that alert on it."""

    threshold_ms: float
    objective: float = 0.99
    rules: tuple[BurnRule, ...] = DEFAULT_RULES
    min_probes: int = 10
    keep_firing_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.threshold_ms > 0:
            raise ValueError(f"threshold_ms must be above 0, got {self.threshold_ms!r}")
        if not 0 < self.objective < 1:
            raise ValueError(f"objective must be within (0, 1), got {self.objective!r}")
        if not self.rules or self.min_probes < 1 or self.keep_firing_s < 0:
            raise ValueError("a burn policy needs rules, min_probes of at least 1 and keep_firing_s of 0 or more")

    @property
    def budget(self) -> float:
        return 1.0 - self.objective

    def windows(self) -> tuple[float, ...]:
        """Every window length the rules read, longest first."""
        return tuple(sorted({s for rule in self.rules for s in (rule.long_s, rule.short_s)}, reverse=True))

    @property
    def longest_s(self) -> float:
        return max(rule.long_s for rule in self.rules)


def policy_for(target: Target, burn: SloBurn) -> BurnPolicy | None:
    """The target's policy from the config; None when it has no `slo.ttft_ms` or burn rates are off."""
    if not burn.enabled or target.slo.ttft_ms is None:
        return None
    return BurnPolicy(
        threshold_ms=target.slo.ttft_ms,
        objective=target.slo.objective,
        rules=tuple(
            BurnRule(w.severity, w.burn_rate, w.long_window_minutes * 60.0, w.short_window_minutes * 60.0)
            for w in burn.windows
        ),
        min_probes=burn.min_probes,
        keep_firing_s=burn.keep_firing_minutes * 60.0,
    )


# ---------------------------------------------------------------- one moment


@dataclass(frozen=True, slots=True)
class WindowCount:
    """Probes (and bad ones among them) that started within the last `seconds`."""

    seconds: float
    total: int
    bad: int

    @property
    def bad_share(self) -> float | None:
        return self.bad / self.total if self.total else None

    def burn(self, budget: float) -> float | None:
        share = self.bad_share
        return None if share is None else share / budget


def window_counts(probes: Iterable[Probe], windows_s: Iterable[float], now: datetime) -> dict[float, WindowCount]:
    """Per window length w: the probes with now - w < at <= now. Probes after `now` are not counted."""
    lengths = list(windows_s)
    totals = dict.fromkeys(lengths, 0)
    bads = dict.fromkeys(lengths, 0)
    for probe in probes:
        age = (now - probe.at).total_seconds()
        if age < 0:
            continue
        for w in lengths:
            if age < w:
                totals[w] += 1
                bads[w] += not probe.good
    return {w: WindowCount(w, totals[w], bads[w]) for w in lengths}


@dataclass(frozen=True, slots=True)
class RuleResult:
    rule: BurnRule
    long: WindowCount
    short: WindowCount
    firing: bool
    long_burn: float | None
    short_burn: float | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Each rule's windows and whether it fires; `severity` is the highest firing one (None: all quiet)."""

    results: tuple[RuleResult, ...]

    @property
    def severity(self) -> BurnSeverity | None:
        worst = self.worst
        return worst.rule.severity if worst is not None else None

    @property
    def worst(self) -> RuleResult | None:
        """The firing rule to report: the highest severity, then the highest long-window burn rate."""
        return _worst(r for r in self.results if r.firing)

    def headline_result(self) -> RuleResult:
        """The rule to describe: the worst firing one, else the one with the shortest long window."""
        return self.worst or min(self.results, key=lambda r: r.rule.long_s)


def _reaches(burn: float | None, factor: float) -> bool:
    return burn is not None and burn >= factor * (1.0 - TOLERANCE)


def evaluate(counts: Mapping[float, WindowCount], policy: BurnPolicy) -> Verdict:
    """The verdict from each window's counts (as `window_counts` gives them).

    A rule fires when its long window holds at least `min_probes` probes, its short window at least
    one, and the burn rate over both is at least its factor.
    """
    results = []
    budget = policy.budget
    for rule in policy.rules:
        long, short = counts[rule.long_s], counts[rule.short_s]
        long_burn, short_burn = long.burn(budget), short.burn(budget)
        firing = (
            long.total >= policy.min_probes and _reaches(long_burn, rule.factor) and _reaches(short_burn, rule.factor)
        )
        results.append(RuleResult(rule, long, short, firing, long_burn, short_burn))
    return Verdict(tuple(results))


def verdict(probes: Iterable[Probe], policy: BurnPolicy, now: datetime) -> Verdict:
    """Whether the probes up to `now` burn the budget too fast."""
    return evaluate(window_counts(probes, policy.windows(), now), policy)


# ---------------------------------------------------------------- an incident over time


@dataclass(frozen=True, slots=True)
class BurnIncident:
    """An open burn incident as it is remembered between evaluations."""

    severity: BurnSeverity
    opened_at: datetime
    last_firing_at: datetime
    burn: float | None  # the long-window burn rate of the worst firing rule, when it last fired
    peak_burn: float | None
    peak_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "opened_at": self.opened_at.isoformat(),
            "last_firing_at": self.last_firing_at.isoformat(),
            "burn": self.burn,
            "peak_burn": self.peak_burn,
            "peak_at": None if self.peak_at is None else self.peak_at.isoformat(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BurnIncident:
        return cls(
            severity=data["severity"],
            opened_at=datetime.fromisoformat(data["opened_at"]),
            last_firing_at=datetime.fromisoformat(data["last_firing_at"]),
            burn=data.get("burn"),
            peak_burn=data.get("peak_burn"),
            peak_at=datetime.fromisoformat(data["peak_at"]) if data.get("peak_at") else None,
        )


def _worst(results: Iterable[RuleResult]) -> RuleResult | None:
    return max(
        results, key=lambda r: (SEVERITY_RANK[r.rule.severity], r.long_burn or 0.0, -r.rule.long_s), default=None
    )


def advance(
    incident: BurnIncident | None,
    found: Verdict,
    now: datetime,
    policy: BurnPolicy,
    *,
    last_resolved_at: datetime | None = None,
) -> tuple[BurnIncident | None, Action | None]:
    """The incident after the verdict at `now`, and what changed: `open`, `update` (it became a page),
    `resolve`, or None (nothing worth a notification; the peak may still have moved).

    An open incident is held by the pairs of its own severity or higher: a page resolves once no page
    pair has fired for `keep_firing_s`, even while the 6-hour ticket pair still sees the outage (its
    short window would keep the page open for hours after the endpoint recovered). After a resolve
    (`last_resolved_at`), a pair opens a new incident only once its short window holds only probes
    from after it, so the probes that made one incident cannot make the next (as tickets of the
    regression detector wait for a window of fresh runs).
    """
    firing = [r for r in found.results if r.firing]
    if incident is None:
        if last_resolved_at is not None:
            firing = [r for r in firing if (now - last_resolved_at).total_seconds() >= r.rule.short_s]
        worst = _worst(firing)
        if worst is None:
            return None, None
        burn = worst.long_burn
        return BurnIncident(worst.rule.severity, now, now, burn, burn, now), "open"
    holding = _worst(r for r in firing if SEVERITY_RANK[r.rule.severity] >= SEVERITY_RANK[incident.severity])
    if holding is None:
        if (now - incident.last_firing_at).total_seconds() >= policy.keep_firing_s:
            return incident, "resolve"
        return incident, None
    burn = holding.long_burn
    peak, peak_at = incident.peak_burn, incident.peak_at
    if burn is not None and (peak is None or burn > peak):
        peak, peak_at = burn, now
    raised = SEVERITY_RANK[holding.rule.severity] > SEVERITY_RANK[incident.severity]
    moved = replace(
        incident,
        severity=holding.rule.severity if raised else incident.severity,
        last_firing_at=now,
        burn=burn,
        peak_burn=peak,
        peak_at=peak_at,
    )
    return moved, ("update" if raised else None)


def reported(found: Verdict, incident: BurnIncident) -> RuleResult:
    """The pair to describe for `incident`: the worst firing one of its severity, else the headline."""
    same = _worst(r for r in found.results if r.firing and r.rule.severity == incident.severity)
    return same or found.headline_result()


# ---------------------------------------------------------------- wording


def fmt_window(seconds: float) -> str:
    """`5 min`, `1 h`, `6 h`, `3 d`, `90 min`."""
    if seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min"


def _last(seconds: float) -> str:
    return {3600.0: "the last hour", 86400.0: "the last day"}.get(seconds, f"the last {fmt_window(seconds)}")


def _percent(share: float) -> str:
    value = share * 100
    return f"{value:.0f}%" if value >= 10 or value == 0 else f"{value:.1f}%"


def _objective(objective: float) -> str:
    return f"{objective * 100:g}%"


def describe(target: str, result: RuleResult, policy: BurnPolicy) -> str:
    """`qwen3-8b: 18% of probes over 800 ms in the last hour (SLO 99%): burning 18x (page at 14.4x over
    1 h and 5 min; 100% in the last 5 min)`."""
    long, short, rule = result.long, result.short, result.rule
    if long.bad_share is None:
        slo = f"SLO {_objective(policy.objective)} under {policy.threshold_ms:g} ms"
        return f"{target}: no probes in {_last(rule.long_s)} ({slo})"
    burn = result.long_burn or 0.0
    text = (
        f"{target}: {_percent(long.bad_share)} of probes over {policy.threshold_ms:g} ms or failed in "
        f"{_last(rule.long_s)} (SLO {_objective(policy.objective)}): burning {burn:.3g}x "
        f"({rule.severity} at {rule.factor:g}x over {fmt_window(rule.long_s)} and {fmt_window(rule.short_s)}"
    )
    if short.bad_share is not None:
        text += f"; {_percent(short.bad_share)} in {_last(rule.short_s)}"
    return text + ")"


def describe_resolved(target: str, result: RuleResult, policy: BurnPolicy, incident: BurnIncident) -> str:
    """`qwen3-8b: back under every burn rate (0% of probes over 800 ms or failed in the last 5 min);
    peaked at 18x`."""
    short = result.short
    recent = (
        f"{_percent(short.bad_share)} of probes over {policy.threshold_ms:g} ms or failed in {_last(short.seconds)}"
        if short.bad_share is not None
        else f"no probes in {_last(short.seconds)}"
    )
    peak = f"; peaked at {incident.peak_burn:.3g}x" if incident.peak_burn is not None else ""
    return f"{target}: back under every burn rate ({recent}){peak}"


def details(result: RuleResult, policy: BurnPolicy) -> dict[str, Any]:
    """What the incident row and the notification keep about the windows (JSON-safe)."""
    return {
        "ttft_ms": policy.threshold_ms,
        "objective": policy.objective,
        "burn_rate": result.rule.factor,
        "long_window_s": result.rule.long_s,
        "short_window_s": result.rule.short_s,
        "long_probes": result.long.total,
        "long_bad": result.long.bad,
        "short_probes": result.short.total,
        "short_bad": result.short.bad,
        "long_burn": None if result.long_burn is None else round(result.long_burn, 3),
        "short_burn": None if result.short_burn is None else round(result.short_burn, 3),
    }


# ---------------------------------------------------------------- a long series


@dataclass(frozen=True, slots=True)
class BurnEvent:
    action: Action
    at: datetime
    incident: BurnIncident
    result: RuleResult


class BurnReplayer:
    """Feeds a target's probes, oldest first, through `evaluate` and `advance`, evaluating after each
    batch of probes that share a start time (one run, as the daemon does after storing it)."""

    def __init__(self, policy: BurnPolicy) -> None:
        self.policy = policy
        self.incident: BurnIncident | None = None
        self.last_resolved_at: datetime | None = None
        self._times: list[float] = []
        self._bad_prefix: list[int] = [0]

    def feed(self, at: datetime, goods: Sequence[bool]) -> list[BurnEvent]:
        """Add the probes of one run started at `at` (no earlier than the last one) and evaluate."""
        stamp = at.timestamp()
        if self._times and stamp < self._times[-1]:
            raise ValueError(f"runs must come oldest first; {at.isoformat()} is earlier than the one before")
        for good in goods:
            self._times.append(stamp)
            self._bad_prefix.append(self._bad_prefix[-1] + (not good))
        counts = {}
        end = len(self._times)
        for w in self.policy.windows():
            # Probes with stamp - w < t <= stamp: everything after the last one at or before stamp - w.
            start = bisect_right(self._times, stamp - w)
            counts[w] = WindowCount(w, end - start, self._bad_prefix[end] - self._bad_prefix[start])
        found = evaluate(counts, self.policy)
        previous = self.incident
        incident, action = advance(previous, found, at, self.policy, last_resolved_at=self.last_resolved_at)
        self.incident = None if action == "resolve" else incident
        if action == "resolve":
            self.last_resolved_at = at
        if action is None or incident is None:
            return []
        return [BurnEvent(action, at, incident, reported(found, incident))]


def replay_probes(probes: Iterable[Probe], policy: BurnPolicy) -> list[BurnEvent]:
    """Every burn event over a history of probes (in any order), evaluated at each run's start."""
    by_time: dict[datetime, list[bool]] = {}
    for probe in probes:
        by_time.setdefault(probe.at, []).append(probe.good)
    replayer = BurnReplayer(policy)
    events: list[BurnEvent] = []
    for at in sorted(by_time):
        events += replayer.feed(at, by_time[at])
    return events
