"""The detector's rules: every knob, its default and its bounds, defined once. The config's
`detection` section (monitor/detect/settings.py) takes its defaults and bounds from here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

# The width of the seasonal baselines' slots (detect/core.py SLOT_S, which is this).
SEASONAL_SLOT_S = 600.0

if TYPE_CHECKING:
    from monitor.detect.settings import Detection, SeverityRule

Kind = Literal["regression", "availability", "slo", "model_changed", "tokens_jump"]
Action = Literal["open", "update", "resolve", "info"]

# A trailing baseline needs at least this many runs to be trusted.
MIN_BASELINE_RUNS = 12
# The CUSUM's threshold (in the residuals' long-run sigmas) when none is configured and the noise model is
# off: measured on independent noise at about 0.5 false tickets a week (docs/detection.md).
FIXED_THRESHOLD = 16.0


class FieldBounds(TypedDict, total=False):
    ge: float
    gt: float
    le: float


@dataclass(frozen=True, slots=True)
class Bound:
    """The allowed range of one knob. The detector checks it here; the config's field carries the same
    bound (`field_bounds`), so a bad value is refused at load with its key path."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def check(self, name: str, value: float) -> None:
        if self.ge is not None and value < self.ge:
            raise ValueError(f"{name} must be at least {self.ge:g}, got {value}")
        if self.gt is not None and not value > self.gt:
            raise ValueError(f"{name} must be above {self.gt:g}, got {value}")
        if self.le is not None and value > self.le:
            raise ValueError(f"{name} must be at most {self.le:g}, got {value}")

    def field_bounds(self) -> FieldBounds:
        """Keyword arguments for a pydantic `Field` (ge, gt, le)."""
        found = FieldBounds()
        if self.ge is not None:
            found["ge"] = self.ge
        if self.gt is not None:
            found["gt"] = self.gt
        if self.le is not None:
            found["le"] = self.le
        return found


_COUNT = Bound(ge=1)
# Per field of `Threshold` (the config's `detection.page` and `detection.ticket`).
THRESHOLD_BOUNDS: dict[str, Bound] = {
    "ratio": Bound(gt=1),
    "min_delta_ms": Bound(ge=0),
    "confirmations": _COUNT,
    "window_runs": _COUNT,
    "z_threshold": Bound(gt=0),
    "min_probes": Bound(ge=0),
}
# Per field of `Cusum` (the config's `detection.cusum`, beside `enabled`).
CUSUM_BOUNDS: dict[str, Bound] = {
    "shift_ratio": Bound(gt=1),
    "threshold": Bound(gt=0),
    "clip": Bound(gt=0),
    "min_delta_ms": Bound(ge=0),
    "block_runs": Bound(ge=2),
}
# Per plain field of `Rules`; the config names the last three `availability.*`.
RULES_BOUNDS: dict[str, Bound] = {
    "min_history_runs": _COUNT,
    "seasonal_days": Bound(ge=0),
    "seasonal_window_minutes": Bound(gt=0, le=720),
    "trailing_runs": Bound(ge=MIN_BASELINE_RUNS),
    "level_hours": Bound(gt=0),
    "false_alerts_per_week": Bound(gt=0, le=100),
    "clear_ratio": Bound(ge=1),
    "clear_runs": _COUNT,
    "consecutive_failures": _COUNT,
    "error_rate": Bound(gt=0, le=1),
    "error_window_runs": _COUNT,
}


def hysteresis_problem(clear_ratio: float, *, page_ratio: float, ticket_ratio: float) -> str | None:
    """Why these ratios cannot work together, or None."""
    if clear_ratio < min(page_ratio, ticket_ratio):
        return None
    return (
        f"clear_ratio ({clear_ratio:g}) must be below ticket.ratio ({ticket_ratio:g}) and page.ratio "
        f"({page_ratio:g}), or incidents would clear while still over their threshold"
    )


@dataclass(frozen=True, slots=True)
class Threshold:
    """When a run confirms a severity: the median of the last `window_runs` runs is at least `ratio`
    times, `min_delta_ms` and `z_threshold` standard errors above the baseline; `confirmations`
    confirming runs in a row open it. The window stretches back until it holds `min_probes` measured
    requests (at most `min_probes` runs), so runs of one probe each need a longer window than runs of 5."""

    ratio: float
    min_delta_ms: float
    confirmations: int
    window_runs: int
    z_threshold: float
    min_probes: int = 0

    @property
    def longest_window(self) -> int:
        """The most runs the window can stretch to."""
        return max(self.window_runs, self.min_probes)


@dataclass(frozen=True, slots=True)
class Cusum:
    """The sequential rule for moderate shifts: a one-sided CUSUM of each run's seasonal residual minus
    the level, in units of the residuals' long-run sigma (their MAD-sigma, widened when the noise is
    autocorrelated). Each run adds its standardised residual minus half of log(`shift_ratio`) (the
    smallest shift worth a ticket), clipped so one run adds at most `clip`; a ticket opens when the sum
    reaches `threshold` and the shift it estimates is at least `min_delta_ms`, and the sum restarts
    from 0."""

    shift_ratio: float
    # A number fixes it for every series. None: FIXED_THRESHOLD, or with `Rules.noise_model` derived per
    # series from `Rules.false_alerts_per_week` and its noise (monitor/detect/noise.py).
    threshold: float | None
    clip: float
    min_delta_ms: float = 20.0
    # Runs per block when measuring how autocorrelated the noise is (without `Rules.noise_model`, which
    # measures it itself).
    block_runs: int = 24


@dataclass(frozen=True, slots=True)
class Rules:
    """Every knob of the detector. Defaults are the measured ones (see docs/detection.md)."""

    min_history_runs: int = 24
    seasonal_days: int = 7
    seasonal_window_minutes: float = 60.0
    trailing_runs: int = 36
    level_hours: float = 24.0
    page: Threshold = Threshold(
        ratio=1.5, min_delta_ms=100.0, confirmations=2, window_runs=5, z_threshold=4.0, min_probes=10
    )
    ticket: Threshold = Threshold(ratio=1.12, min_delta_ms=30.0, confirmations=6, window_runs=24, z_threshold=2.5)
    # threshold None: derived per series with the noise model, FIXED_THRESHOLD without it.
    cusum: Cusum | None = Cusum(shift_ratio=1.15, threshold=None, clip=2.5)
    # The per-series noise model (monitor/detect/noise.py): it widens the window rules' standard errors by
    # its g(n), makes pages wait out bursts, adds the jump test to pages and (with `cusum.threshold` None)
    # derives the CUSUM's threshold. On by default: measured side by side with the rules without it on
    # every noise model of bench/detector.py, it meets more of the targets on every count but moderate
    # shifts' recall on correlated noise (docs/detection.md, "The noise model on by default"). Off,
    # detection is exactly what it was before the model.
    noise_model: bool = True
    # What the CUSUM's threshold is derived from with the noise model, per series (its noise and run interval).
    false_alerts_per_week: float = 0.5
    # The ticket window rule opens tickets beside the CUSUM (always, without one).
    window_tickets: bool = True
    clear_ratio: float = 1.08
    clear_runs: int = 6
    consecutive_failures: int = 3
    error_rate: float = 0.5
    error_window_runs: int = 12

    def __post_init__(self) -> None:
        for name, bound in RULES_BOUNDS.items():
            bound.check(name, getattr(self, name))
        for prefix, rule, bounds in (
            ("page", self.page, THRESHOLD_BOUNDS),
            ("ticket", self.ticket, THRESHOLD_BOUNDS),
            ("cusum", self.cusum, CUSUM_BOUNDS),
        ):
            for name, bound in bounds.items() if rule is not None else ():
                if getattr(rule, name) is not None:
                    bound.check(f"{prefix}.{name}", getattr(rule, name))
        problem = hysteresis_problem(self.clear_ratio, page_ratio=self.page.ratio, ticket_ratio=self.ticket.ratio)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def from_config(cls, detection: Detection) -> Rules:
        """Rules from the config's `detection` section (whose defaults and bounds come from here)."""

        def threshold(rule: SeverityRule) -> Threshold:
            return Threshold(**{name: getattr(rule, name) for name in THRESHOLD_BOUNDS})

        sequential = detection.cusum
        cusum = Cusum(**{name: getattr(sequential, name) for name in CUSUM_BOUNDS}) if sequential.enabled else None
        if cusum is not None and cusum.threshold is None and not detection.noise_model:
            cusum = dataclasses.replace(cusum, threshold=FIXED_THRESHOLD)
        availability = detection.availability
        return cls(
            min_history_runs=detection.min_history_runs,
            seasonal_days=detection.seasonal_days,
            seasonal_window_minutes=detection.seasonal_window_minutes,
            trailing_runs=detection.trailing_runs,
            level_hours=detection.level_hours,
            noise_model=detection.noise_model,
            false_alerts_per_week=detection.false_alerts_per_week,
            page=threshold(detection.page),
            ticket=threshold(detection.ticket),
            clear_ratio=detection.clear_ratio,
            clear_runs=detection.clear_runs,
            cusum=cusum,
            window_tickets=detection.window_tickets,
            consecutive_failures=availability.consecutive_failures,
            error_rate=availability.error_rate,
            error_window_runs=availability.window_runs,
        )

    @property
    def history_runs(self) -> int:
        """The most recent valid runs whose values the detector reads; the level and the seasonal
        baselines reach `_lookback_s` further back in time."""
        longest = max(self.page.longest_window, self.ticket.longest_window, self.clear_runs)
        return max(self.min_history_runs, self.trailing_runs + longest, self.error_window_runs)

    def history_reach_s(self, interval_s: float) -> float:
        """How far before a run the detector reads the runs before it, for runs every `interval_s` seconds
        (`Detector.history_since`: `history_runs` runs, and the level and seasonal baselines' lookback; a test
        keeps the two equal): what an evaluation that keeps no history reads (bench/cold.py times it)."""
        lookback = 0.0
        if self.seasonal_days:
            lookback = self.level_hours * 3600.0 + self.seasonal_days * 86400.0 + self.seasonal_window_minutes * 60.0
            lookback += 2 * SEASONAL_SLOT_S
        return interval_s * (self.history_runs + 1) + lookback


DEFAULT_RULES = Rules()
