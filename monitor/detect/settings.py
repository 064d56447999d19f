"""The `detection` config section. Its defaults and bounds are the detector's own
(monitor/detect/rules.py), defined there once. The root `Config` (monitor/config/models.py) composes it."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field, model_validator

from monitor.config.fields import ConfigModel
from monitor.detect.rules import (
    CUSUM_BOUNDS,
    DEFAULT_RULES,
    FIXED_THRESHOLD,
    MIN_BASELINE_RUNS,
    RULES_BOUNDS,
    THRESHOLD_BOUNDS,
    Bound,
    Cusum,
    FieldBounds,
    Rules,
    hysteresis_problem,
)


def _rule(bounds: dict[str, Bound], name: str) -> FieldBounds:
    return bounds[name].field_bounds()


class SeverityRule(ConfigModel):
    ratio: float = Field(**_rule(THRESHOLD_BOUNDS, "ratio"), description="Fire when TTFT exceeds baseline x ratio ...")
    min_delta_ms: float = Field(
        **_rule(THRESHOLD_BOUNDS, "min_delta_ms"),
        description="... and exceeds baseline by at least this many milliseconds ...",
    )
    confirmations: int = Field(
        **_rule(THRESHOLD_BOUNDS, "confirmations"), description="... in this many consecutive runs ..."
    )
    window_runs: int = Field(
        **_rule(THRESHOLD_BOUNDS, "window_runs"),
        description="... comparing the median of this many recent runs (defaults assume 5-minute runs) ...",
    )
    z_threshold: float = Field(
        **_rule(THRESHOLD_BOUNDS, "z_threshold"),
        description="... which must also be this many standard errors (from MAD) above the baseline.",
    )
    min_probes: int = Field(
        0,
        **_rule(THRESHOLD_BOUNDS, "min_probes"),
        description="The window stretches back (to at most this many runs) until it holds this many measured "
        "requests, so jobs with few `rounds` decide on more runs; 0: never.",
    )


class Availability(ConfigModel):
    consecutive_failures: int = Field(
        DEFAULT_RULES.consecutive_failures,
        **_rule(RULES_BOUNDS, "consecutive_failures"),
        description="Runs in a row where every request failed before alerting.",
    )
    error_rate: float = Field(
        DEFAULT_RULES.error_rate,
        **_rule(RULES_BOUNDS, "error_rate"),
        description="Alert when the share of failed requests over `window_runs` reaches this.",
    )
    window_runs: int = Field(
        DEFAULT_RULES.error_window_runs,
        **_rule(RULES_BOUNDS, "error_window_runs"),
        description="Runs over which `error_rate` is measured.",
    )


_DEFAULT_CUSUM = DEFAULT_RULES.cusum or Cusum(shift_ratio=1.15, threshold=FIXED_THRESHOLD, clip=2.5)


class SequentialRule(ConfigModel):
    """The CUSUM that opens tickets for moderate shifts (docs/detection.md, "Adding up evidence")."""

    enabled: bool = Field(
        DEFAULT_RULES.cusum is not None,
        description="Add up evidence across runs; false leaves tickets to the window rule.",
    )
    shift_ratio: float = Field(
        _DEFAULT_CUSUM.shift_ratio,
        **_rule(CUSUM_BOUNDS, "shift_ratio"),
        description="The smallest shift worth a ticket: each run adds its residual minus half of log(shift_ratio).",
    )
    # None rather than FIXED_THRESHOLD: with `detection.noise_model` on, unset means "derive it".
    threshold: float | None = Field(
        None,
        **_rule(CUSUM_BOUNDS, "threshold"),
        description=f"A ticket opens when the sum reaches this (in the residuals' long-run sigmas); lower is sooner "
        f"and noisier. Unset (the default): derived per series from `detection.false_alerts_per_week` and the "
        f"series' measured noise, or {FIXED_THRESHOLD:g} with `detection.noise_model: false`.",
    )
    clip: float = Field(
        _DEFAULT_CUSUM.clip,
        **_rule(CUSUM_BOUNDS, "clip"),
        description="One run adds at most this many sigmas beyond the allowance, so spikes cannot push it.",
    )
    min_delta_ms: float = Field(
        _DEFAULT_CUSUM.min_delta_ms,
        **_rule(CUSUM_BOUNDS, "min_delta_ms"),
        description="The shift the sum estimates must also be at least this many milliseconds.",
    )
    block_runs: int = Field(
        _DEFAULT_CUSUM.block_runs,
        **_rule(CUSUM_BOUNDS, "block_runs"),
        description="Runs per block when measuring how autocorrelated the residuals are (not read with "
        "`detection.noise_model` on: the model measures that itself).",
    )


DEFAULT_SEVERITY_RULES: dict[str, dict[str, float]] = {
    "page": dataclasses.asdict(DEFAULT_RULES.page),
    "ticket": dataclasses.asdict(DEFAULT_RULES.ticket),
}


DEFAULT_BURN_WINDOWS: tuple[dict[str, Any], ...] = (
    # Google's SRE workbook, "Alerting on SLOs": 2% of a 30-day budget in an hour, 5% in 6 hours,
    # 10% in 3 days. deploy/prometheus/rules.yaml alerts on the same windows (a test keeps them equal).
    {"severity": "page", "burn_rate": 14.4, "long_window_minutes": 60, "short_window_minutes": 5},
    {"severity": "page", "burn_rate": 6.0, "long_window_minutes": 360, "short_window_minutes": 30},
    {"severity": "ticket", "burn_rate": 1.0, "long_window_minutes": 4320, "short_window_minutes": 360},
)


class BurnWindow(ConfigModel):
    severity: Literal["page", "ticket"] = Field(description="What the incident is when this pair fires.")
    burn_rate: float = Field(
        gt=0,
        description="Fires when the share of bad probes is at least this many times the error budget "
        "(1 - `slo.objective`) over both windows.",
    )
    long_window_minutes: float = Field(gt=0, description="The long window: how much budget has been spent.")
    short_window_minutes: float = Field(
        gt=0, description="The short window: whether it is still being spent (so the incident resolves soon after)."
    )

    @model_validator(mode="after")
    def _check_windows(self) -> BurnWindow:
        if self.short_window_minutes >= self.long_window_minutes:
            raise ValueError(
                f"short_window_minutes ({self.short_window_minutes:g}) must be shorter than long_window_minutes "
                f"({self.long_window_minutes:g}); the workbook's pairs use a twelfth, e.g. 60 and 5"
            )
        return self


class SloBurn(ConfigModel):
    """Multi-window, multi-burn-rate incidents on `targets.*.slo.ttft_ms` (docs/detection.md, "SLO burn rate")."""

    enabled: bool = Field(True, description="Open `slo_burn` incidents for targets with `slo.ttft_ms`.")
    windows: list[BurnWindow] = Field(
        default_factory=lambda: [BurnWindow.model_validate(w) for w in DEFAULT_BURN_WINDOWS],
        min_length=1,
        description="Window pairs: page at 14.4x over 1 h and 5 min or 6x over 6 h and 30 min, ticket at 1x over "
        "3 d and 6 h. A list given here replaces them all.",
    )
    min_probes: int = Field(
        10,
        ge=1,
        description="Probes a long window must hold before its pair can fire, so the first bad probe of a new "
        "target does not page.",
    )
    keep_firing_minutes: float = Field(
        10,
        ge=0,
        description="An incident resolves once no pair of its severity has fired for this long (Prometheus' "
        "`keep_firing_for`), so a burn that pauses for one run does not resolve and page again.",
    )

    def longest_window_minutes(self) -> float:
        return max(w.long_window_minutes for w in self.windows)


class Detection(ConfigModel):
    min_history_runs: int = Field(
        DEFAULT_RULES.min_history_runs,
        **_rule(RULES_BOUNDS, "min_history_runs"),
        description="Runs of history needed before a target can alert.",
    )
    seasonal_days: int = Field(
        DEFAULT_RULES.seasonal_days,
        **_rule(RULES_BOUNDS, "seasonal_days"),
        description="Days back to compare the same time of day against; tickets need 3 days of it (0 turns the "
        "seasonal baseline off, at about 6 false alerts a week).",
    )
    trailing_runs: int = Field(
        DEFAULT_RULES.trailing_runs,
        **_rule(RULES_BOUNDS, "trailing_runs"),
        description=f"Recent runs forming the trailing baseline, used until a seasonal baseline exists (at least "
        f"{MIN_BASELINE_RUNS}: a baseline needs that many runs).",
    )
    noise_model: bool = Field(
        DEFAULT_RULES.noise_model,
        description="Measure each series' noise (how much and how long its runs wander together) and scale the "
        "evidence by it, derive the CUSUM threshold from `false_alerts_per_week`, page on sudden jumps "
        "however far the series wanders, and have the window ticket rule wait 3 confirming runs more than "
        "`ticket.confirmations` (wander that passes in half an hour). Off: the rules without it (more false alerts "
        'and slower pages on series whose load wanders; docs/detection.md, "The noise model on by default").',
    )
    false_alerts_per_week: float = Field(
        DEFAULT_RULES.false_alerts_per_week,
        **_rule(RULES_BOUNDS, "false_alerts_per_week"),
        description="With `noise_model` on: the false alerts a healthy series may raise per week; the CUSUM's "
        "threshold is derived from it and each series' measured noise (lower is quieter and slower).",
    )
    history_memory_mb: float = Field(
        64.0,
        ge=0,
        le=65536,
        description="Memory for the runs each evaluation reads (a week and a day of a series' runs with the default "
        "seasonal baseline: about 40 bytes a run, 95 kB a series of 5-minute runs, so the default holds about 700 "
        "series), kept between evaluations so each reads only the runs stored since the last. Series beyond it are "
        "read afresh every run (about 4x the CPU at 5-minute runs); 0 reads every series afresh. What detection "
        "decides is the same either way.",
    )
    page: SeverityRule = Field(
        default_factory=lambda: SeverityRule.model_validate(DEFAULT_SEVERITY_RULES["page"]),
        description="Rule for `page` severity: large, confirmed regressions. Keys left out keep their defaults. With "
        "`detection.noise_model` on, a page also waits out a burst: 4 slow runs in a row, 5 once the series has "
        "shown a burst of 3, unless its window is too long for a burst to fill (10 runs, as `min_probes` stretches "
        "it with one probe a run); a page that must fire on one run needs the model off.",
    )
    ticket: SeverityRule = Field(
        default_factory=lambda: SeverityRule.model_validate(DEFAULT_SEVERITY_RULES["ticket"]),
        description="Rule for `ticket` severity: smaller, sustained regressions. Keys left out keep their defaults.",
    )
    seasonal_window_minutes: float = Field(
        DEFAULT_RULES.seasonal_window_minutes,
        **_rule(RULES_BOUNDS, "seasonal_window_minutes"),
        description="The seasonal baseline uses each past day's runs within this many minutes of the same time of day.",
    )
    level_hours: float = Field(
        DEFAULT_RULES.level_hours,
        **_rule(RULES_BOUNDS, "level_hours"),
        description="Hours of recent runs that set the baseline's current level, so slow drift is not a regression.",
    )
    clear_runs: int = Field(
        DEFAULT_RULES.clear_runs,
        **_rule(RULES_BOUNDS, "clear_runs"),
        description="An incident clears on the median of max(clear_runs, the severity's window_runs) runs.",
    )
    clear_ratio: float = Field(
        DEFAULT_RULES.clear_ratio,
        **_rule(RULES_BOUNDS, "clear_ratio"),
        description="An incident clears once TTFT is back below baseline x this (below `ticket.ratio`).",
    )
    cusum: SequentialRule = Field(
        default_factory=SequentialRule,
        description="The sequential rule (a one-sided CUSUM of the seasonal residuals) that opens tickets.",
    )
    window_tickets: bool = Field(
        DEFAULT_RULES.window_tickets,
        description="The `ticket` window rule opens tickets beside the CUSUM too (it always does when `cusum` is "
        "disabled).",
    )
    availability: Availability = Field(default_factory=Availability, description="Alerting on failed requests.")
    slo_burn: SloBurn = Field(
        default_factory=SloBurn, description="Error-budget burn-rate incidents on targets' `slo.ttft_ms`."
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_partial_rules(cls, data: Any) -> Any:
        # `page: {ratio: 2}` should mean "page, with ratio 2", not "page, missing two keys".
        if isinstance(data, dict):
            data = dict(data)
            for severity, defaults in DEFAULT_SEVERITY_RULES.items():
                if isinstance(data.get(severity), dict):
                    data[severity] = {**defaults, **data[severity]}
        return data

    @model_validator(mode="after")
    def _check_hysteresis(self) -> Detection:
        problem = hysteresis_problem(self.clear_ratio, page_ratio=self.page.ratio, ticket_ratio=self.ticket.ratio)
        if problem is not None:
            raise ValueError(problem)
        return self

    def rules(self) -> Rules:
        """The detector's rules for this section."""
        return Rules.from_config(self)
