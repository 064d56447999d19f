"""The regression detector: one series' run medians in, incident events out. Pure code.

Everything happens in log space (a regression multiplies TTFT; lognormal noise becomes normal) with
medians and MADs, never means, on the median TTFT of each run:

* Baseline. The shape of the day comes from a seasonal baseline: per time slot, the median over the
  previous `seasonal_days` days of each day's median within `seasonal_window_minutes` of that time of
  day. A run's residual is its distance from its own slot's baseline, so windows that span a rising
  hour carry no lag. The height comes from the recent past: the median residual over the
  `level_hours` before the windows tested (and before an open regression began), so slow drift
  does not build up over the week the seasonal baseline spans, and a regression never becomes its
  own baseline. Until a slot has three days of history, a trailing window of `trailing_runs` raw
  runs stands in. No verdict before `min_history_runs` valid runs.
* Decision. A run confirms a severity when the median of that severity's last `window_runs` runs is
  `ratio` times and `min_delta_ms` above the baseline, and `z_threshold` standard errors above it
  (the window median's and the baseline's, from the MAD of the residuals). `confirmations`
  confirming runs in a row open an incident; a ticket becomes a page when the page rule confirms.
  Tickets (moderate shifts) need the seasonal baseline: against a trailing window the daily cycle
  alone looks like one.
* Clearing. An incident resolves once the median over max(`clear_runs`, its severity's window) is
  back under baseline x `clear_ratio`, below both open ratios (hysteresis), and the page rule no
  longer confirms. Tickets then wait for a window of fresh runs, so the same runs cannot reopen one.
* Availability: `consecutive_failures` runs in a row where every request failed open a page; a
  failed-request share of `error_rate` over `error_window_runs` runs opens a ticket. It resolves
  after `consecutive_failures` error-free runs, and once the rate is under its limit if it fired.
* SLO: the median over the ticket window above the target's `ttft_p50_ms` for `ticket.confirmations`
  runs opens a ticket; it resolves under ttft_p50_ms / clear_ratio.
* Model change: an `info` event when the model name the server reports changes, or its fingerprint
  (confirmed on two runs in a row; detect/identity.py); a new baseline epoch starts there: open latency
  incidents resolve and only the runs since count as history.

`Detector.evaluate` takes the history and the state and returns the new state with the events; a
`Replayer` feeds a long series through the same code incrementally, with the same results.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from monitor.alert.model import Severity
from monitor.detect.core import _Core, _lookback_s
from monitor.detect.noise import NoiseModel
from monitor.detect.rules import MIN_BASELINE_RUNS, Action, Cusum, Kind, Rules, Threshold
from monitor.detect.state import STATE_VERSION, Event, HistoryColumns, Incident, RunPoint, SeriesState, point_from_run

__all__ = [
    "MIN_BASELINE_RUNS",
    "STATE_VERSION",
    "Action",
    "Cusum",
    "Detector",
    "Event",
    "Incident",
    "Kind",
    "Replayer",
    "Rules",
    "RunPoint",
    "SeriesState",
    "Severity",
    "Threshold",
    "point_from_run",
]


class Detector:
    """Decides, run by run, whether one series has a regression, an availability or an SLO problem.

    Pure: `evaluate` reads the history and the state it is given and returns a new state with the
    events; nothing is kept between calls. Thread-safe for that reason.
    """

    def __init__(self, rules: Rules | None = None, slo_ms: float | None = None) -> None:
        self.rules = rules if rules is not None else Rules()
        if slo_ms is not None and not slo_ms > 0:
            raise ValueError(f"slo_ms must be positive, got {slo_ms!r}")
        self.slo_ms = slo_ms

    def history_since(self, at: datetime, *, interval: timedelta = timedelta(minutes=5)) -> datetime:
        """The oldest run start `evaluate` reads for a run at `at`, for runs every `interval`: pass the
        runs started since then. (Longer gaps in the history make it reach further back.)"""
        return at - interval * (self.rules.history_runs + 1) - timedelta(seconds=_lookback_s(self.rules))

    def evaluate(
        self, history: Sequence[RunPoint], state: SeriesState, run: RunPoint
    ) -> tuple[SeriesState, list[Event]]:
        """The series' new state and the events `run` causes. `history`: the runs before it, oldest first."""
        new_state, events, _baseline = self.evaluate_with_baseline(history, state, run)
        return new_state, events

    def evaluate_with_baseline(
        self, history: Sequence[RunPoint] | HistoryColumns, state: SeriesState, run: RunPoint
    ) -> tuple[SeriesState, list[Event], float | None]:
        """`evaluate`, plus the baseline (ms) `run` was compared with: None until the series has one.
        `history` as points, or as columns (the same runs, loaded faster: detect/history.py)."""
        core = _Core(self.rules, self.slo_ms)
        epoch = state.epoch_since
        loaded: HistoryColumns | None = None  # columns whose computed residuals are handed back
        if isinstance(history, HistoryColumns):
            if epoch is None or not history.moments or history.moments[0] >= epoch.timestamp():
                # The residuals it holds count only under the epoch they were computed in.
                core.load(history, residuals=history.residuals is not None and history.residual_epoch == epoch)
                loaded = history
            else:
                core.load(history.since(epoch.timestamp()))
        else:
            for point in history:
                if epoch is None or point.at >= epoch:  # a new model's runs are compared among themselves
                    core.append(point)
        new_state = state.copy()
        events = core.step(new_state, run)
        if loaded is not None:
            loaded.computed[:] = core.loaded_residuals()
            loaded.computed_epoch = epoch
        return new_state, events, core.baseline_ms

    def replayer(self, state: SeriesState | None = None, history: Iterable[RunPoint] = ()) -> Replayer:
        """An incremental evaluator for a long series, continuing from `state` after `history`."""
        return Replayer(self, state=state, history=history)


# Runs a replayer keeps to rebuild from when an epoch starts: more than identity.CONFIRM_RUNS.
EPOCH_LOOKBACK_RUNS = 8


class Replayer:
    """Feeds runs one by one through the same code as `Detector.evaluate`, keeping the history in a
    rolling structure instead of rebuilding it per run: a year of 5-minute runs takes seconds."""

    def __init__(
        self, detector: Detector, *, state: SeriesState | None = None, history: Iterable[RunPoint] = ()
    ) -> None:
        self._detector = detector
        self.state = state.copy() if state is not None else SeriesState()
        self._core = _Core(detector.rules, detector.slo_ms)
        epoch = self.state.epoch_since
        # The last runs, for a new epoch that begins a run or two back (a confirmed fingerprint).
        self._recent: deque[RunPoint] = deque(maxlen=EPOCH_LOOKBACK_RUNS)
        for point in history:
            if epoch is None or point.at >= epoch:
                self._core.append(point)
                self._recent.append(point)

    def feed(self, run: RunPoint) -> list[Event]:
        """Evaluate the next run (later than every run before it); the events it causes."""
        events = self._core.step(self.state, run)
        self._recent.append(run)
        since = self._core.epoch_started
        if since is not None:  # as `evaluate` would next time: only the epoch's runs are history
            core = _Core(self._detector.rules, self._detector.slo_ms)
            for point in self._recent:
                if point.at >= since:
                    core.append(point)
            self._core = core
        return events

    def noise(self) -> tuple[NoiseModel | None, bool]:
        """(the series' noise model, whether the rules use it): the detector's own with
        `detection.noise_model`, else one measured on the history for display (None under a day)."""
        if self.state.noise is not None:
            return self.state.noise, True
        return self._core.measured_noise(), False

    @property
    def baseline_ms(self) -> float | None:
        """The baseline (ms) the last fed run was compared with (as `evaluate_with_baseline` returns
        it); None until the series has one. The series view draws it (monitor/web/queries.py)."""
        return self._core.baseline_ms
