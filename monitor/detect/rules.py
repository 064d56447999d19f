"""The detector's rules: every knob, its default and its bounds, defined once. The config's
`detection` section (monitor/config/models.py) takes its defaults and bounds from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from monitor.config.models import Detection

Kind = Literal["regression", "availability", "slo", "model_changed"]
Action = Literal["open", "update", "resolve", "info"]
Severity = Literal["page", "ticket", "info"]

# A trailing baseline needs at least this many runs to be trusted.
MIN_BASELINE_RUNS = 12


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
    threshold: float
    clip: float
    min_delta_ms: float = 20.0
    block_runs: int = 24  # runs per block when measuring how autocorrelated the noise is


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
    cusum: Cusum | None = Cusum(shift_ratio=1.15, threshold=16.0, clip=2.5)
    # The ticket window rule opens tickets beside the CUSUM (always, without one).
    window_tickets: bool = True
    clear_ratio: float = 1.08
    clear_runs: int = 6
    consecutive_failures: int = 3
    error_rate: float = 0.5
    error_window_runs: int = 12

    def __post_init__(self) -> None:
        counts = ("min_history_runs", "trailing_runs", "clear_runs", "consecutive_failures", "error_window_runs")
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.trailing_runs < MIN_BASELINE_RUNS:
            raise ValueError(
                f"trailing_runs must be at least {MIN_BASELINE_RUNS} (a baseline needs that many runs), "
                f"got {self.trailing_runs}"
            )
        if not (self.level_hours > 0 and self.seasonal_window_minutes > 0):
            raise ValueError("level_hours and seasonal_window_minutes must be above 0")
        for name, rule in (("page", self.page), ("ticket", self.ticket)):
            if rule.window_runs < 1 or rule.confirmations < 1 or rule.min_probes < 0:
                raise ValueError(
                    f"{name}.window_runs and {name}.confirmations must be at least 1, {name}.min_probes 0 or more"
                )
            if rule.ratio <= 1 or rule.z_threshold <= 0 or rule.min_delta_ms < 0:
                raise ValueError(f"{name}: ratio must be above 1, z_threshold above 0, min_delta_ms 0 or more")
        if self.clear_ratio >= min(self.page.ratio, self.ticket.ratio):
            raise ValueError(
                f"clear_ratio ({self.clear_ratio:g}) must be below page.ratio and ticket.ratio, or incidents "
                "would clear while still over their threshold"
            )
        if not 0 < self.error_rate <= 1:
            raise ValueError(f"error_rate must be within (0, 1], got {self.error_rate}")
        if self.cusum is not None and not (
            self.cusum.shift_ratio > 1 and self.cusum.threshold > 0 and self.cusum.clip > 0
        ):
            raise ValueError("cusum: shift_ratio must be above 1, threshold and clip above 0")

    @classmethod
    def from_config(cls, detection: Detection) -> Rules:
        """Rules from the config's `detection` section. Keys the config does not have yet keep the
        defaults here."""
        default = cls()

        def threshold(rule: Any, fallback: Threshold) -> Threshold:
            return Threshold(
                ratio=rule.ratio,
                min_delta_ms=rule.min_delta_ms,
                confirmations=rule.confirmations,
                window_runs=getattr(rule, "window_runs", fallback.window_runs),
                z_threshold=getattr(rule, "z_threshold", fallback.z_threshold),
                min_probes=getattr(rule, "min_probes", fallback.min_probes),
            )

        def cusum(rule: Any) -> Cusum | None:
            if rule is None:
                return default.cusum
            if not rule.enabled:
                return None
            return Cusum(
                shift_ratio=rule.shift_ratio,
                threshold=rule.threshold,
                clip=rule.clip,
                min_delta_ms=rule.min_delta_ms,
                block_runs=rule.block_runs,
            )

        return cls(
            min_history_runs=detection.min_history_runs,
            seasonal_days=detection.seasonal_days,
            seasonal_window_minutes=getattr(detection, "seasonal_window_minutes", default.seasonal_window_minutes),
            trailing_runs=detection.trailing_runs,
            level_hours=getattr(detection, "level_hours", default.level_hours),
            page=threshold(detection.page, default.page),
            ticket=threshold(detection.ticket, default.ticket),
            clear_ratio=detection.clear_ratio,
            clear_runs=getattr(detection, "clear_runs", default.clear_runs),
            cusum=cusum(getattr(detection, "cusum", None)),
            window_tickets=getattr(detection, "window_tickets", default.window_tickets),
            consecutive_failures=detection.availability.consecutive_failures,
            error_rate=detection.availability.error_rate,
            error_window_runs=detection.availability.window_runs,
        )

    @property
    def history_runs(self) -> int:
        """The most recent valid runs whose values the detector reads; the level and the seasonal
        baselines reach `_lookback_s` further back in time."""
        longest = max(self.page.longest_window, self.ticket.longest_window, self.clear_runs)
        return max(self.min_history_runs, self.trailing_runs + longest, self.error_window_runs)
