"""The rolling core of the detector: valid runs' times, log TTFTs and seasonal residuals, and the
rules applied to each new run. Pure; `Detector` and `Replayer` (detector.py) are its public face."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right, insort
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from operator import sub
from typing import Any

from monitor.alert.model import Severity
from monitor.detect import identity
from monitor.detect import noise as noise_model
from monitor.detect.noise import NoiseModel
from monitor.detect.rules import (
    FIXED_THRESHOLD,
    MIN_BASELINE_RUNS,
    SEASONAL_SLOT_S,
    Action,
    Cusum,
    Rules,
    Threshold,
)
from monitor.detect.state import Event, HistoryColumns, Incident, RunPoint, SeriesState
from monitor.detect.stats import (
    MAD_TO_SIGMA,
    clipped_profile,
    mad_sigma_sorted,
    median,
    median_and_sigma,
    median_se_factor,
    pooled_factor,
)
from monitor.detect.window_sums import WindowSums, decide

DAY_S = 86400.0
# Seasonal baselines are computed per slot of this many seconds and cached; a run is compared with
# its slot's centre, at most 5 minutes off, which the daily cycle does not notice.
SLOT_S = SEASONAL_SLOT_S
SLOTS_PER_DAY = int(DAY_S // SLOT_S)
# A core forgets the runs nothing reads every this many runs appended (`_Core._trim`).
TRIM_EVERY_RUNS = 4096
# A slot needs runs on at least this many previous days for a seasonal baseline (a median of three
# days outvotes one day with an incident); until then the trailing window stands in.
SEASONAL_MIN_DAYS = 3
# A trailing baseline needs at least this many runs to be trusted.
# The sequential rule's reference is recomputed every this many seconds (a day's level hardly moves in
# three hours, and computing it per run would make a year's replay several times slower).
CUSUM_REFERENCE_S = 3 * 3600.0
# Floor on the baseline's sigma (log units), so a near-constant series cannot divide by zero.
SIGMA_FLOOR = 0.01
UNKNOWN_ERROR = "unknown"
# The sequential rule opens nothing on an excursion of fewer runs (an hour of 5-minute runs).
MIN_EXCURSION_RUNS = 12
# Against a trailing baseline (a series' first days) a window's variance is taken as this many times an
# independent one's: load that comes and goes cannot be measured yet (bench/detector.py, false pages
# under AR(1) noise opened in the first 3.5 days).
TRAILING_G = 2.0
# With the noise model on but not (yet) engaged, a page against a trailing baseline is widened by the long-run
# factor of trailing-sized windows pooled over this many runs before it (a day of 5-minute runs):
# `_Core._confirms_early_page`.
EARLY_PAGE_HISTORY_RUNS = 288
# How far above the baseline (a share of log(page.ratio)) a run must itself be to extend a page streak
# (`_Core._run_is_slow`; the noise model's jump test: above the window before the jump): a burst that is
# over breaks it.
PAGE_RUN_SHARE = 1.0
# The noise model learns from a run less the median of the runs at its time of day on up to this many days
# before it (`_Core._day_difference`): a step on one or two of those days is outvoted.
PARTNER_DAYS = 5
# The share of the reference's error (its variance, in per-run sigmas^2) the CUSUM's derived threshold is
# made for: part of the day's wander the level misses is already in the model's long-run variance (the whole
# of it cost +50% recall on AR(1) noise, bench/detector.py --quick: 97% -> 89%).
REFERENCE_SHARE = 0.5
# With the noise model engaged, the CUSUM's allowance grows by this many of the reference's own sds (the
# level's and the seasonal slot's error, in per-run sigmas): shifts no larger than what the reference may be
# off by for hours add nothing up (bench/detector.py --quick, model on: false alerts 0.49 -> 0.40 a week,
# +50% caught 97% -> 99%; 1.5 sds 0.37 and 96%, 2 sds 0.35 and 89%).
REFERENCE_ALLOWANCE_SDS = 1.0
# sqrt(1 + the variance of a median of k independent normal runs over one run's): the spread of such a
# difference in runs' spreads, for k = 1..PARTNER_DAYS.
_PARTNER_SCALE = {k: math.sqrt(1.0 + v) for k, v in ((1, 1.0), (2, 0.5), (3, 0.449), (4, 0.343), (5, 0.287))}
# Each of those days (0..) and how far back it is (days x DAY_S, exact).
_PARTNER_DAYS_S = tuple(enumerate(days * DAY_S for days in range(1, PARTNER_DAYS + 1)))
_UNCACHED = object()
# The variance of a median of independent runs is this over their count, in sigmas^2 (large samples).
_MEDIAN_VARIANCE = (math.pi / 2.0) ** 2
# The noise model seeded from a history (`_Core._seed_residuals`) takes out each day's level: a day of
# 5-minute runs, counted in runs with a seasonal residual.
SEED_DAY_RUNS = SLOTS_PER_DAY * 2


def _slot_variance(slot: _Slot, noise: NoiseModel | None) -> float:
    """The variance of a slot's seasonal baseline, in per-run sigmas^2: a median of `days` daily medians of
    `count / days` runs each, (pi / 2)^2 / count for independent runs. Each day's runs near the slot are
    neighbours: on a series whose load wanders for hours (the noise model engaged) a day's median varies
    g(count / days) times more, and so does the baseline, which every run of those hours shares."""
    variance = _MEDIAN_VARIANCE / max(slot.count, 1)
    if noise is None:
        return variance
    return variance * noise.g(slot.count / max(slot.days, 1))


@dataclass(slots=True)  # not frozen: one is made every other run, and a frozen one's __init__ costs 3x as much
class _Slot:
    """The seasonal baseline of one time slot: the median log TTFT at that time of day (never changed)."""

    center: float
    count: int
    days: int = 1  # days whose medians it is the median of (count / days runs each)


class _Baseline:
    """What the windows are compared with: `center` (log ms) and the per-run spread around it, the
    MAD of `reference` (sorted), computed only when a window is large enough to need a z-score."""

    __slots__ = ("_near", "_sigma", "center", "end", "extra", "level", "reference", "seasonal")

    def __init__(
        self,
        center: float,
        level: float,
        reference: list[float],
        seasonal: bool,
        extra: float,
        end: int = 0,
        near: list[int] | None = None,
    ) -> None:
        self.end = end  # the reference's runs end before this index
        self.center = center
        self.level = level  # median of `reference`; windows' distances are measured from it
        self.reference = reference
        self.seasonal = seasonal
        self.extra = extra  # the seasonal slot's own variance, in units of sigma^2
        self._sigma: float | None = None
        self._near = near  # where the MAD's selection ended for the baseline before (`stats.mad_sigma_sorted`)

    @property
    def sigma(self) -> float:
        if self._sigma is None:
            # `reference` is sorted: a selection, not a sort of its deviations (stats.mad_sigma_sorted).
            sigma = mad_sigma_sorted(self.reference, center=self.level, near=self._near)
            self._sigma = SIGMA_FLOOR if sigma < SIGMA_FLOOR else sigma  # max(sigma, SIGMA_FLOOR)
        return self._sigma

    def z(self, distance: float, window: int, noise: NoiseModel | None = None) -> float:
        """`distance` of a median of `window` runs, in standard errors of (window median - baseline).
        With a noise model, each median varies g(n) times more than one of n independent runs would: on a
        series whose load comes and goes, a window must be further out before it counts."""
        return distance / (self.sigma * math.sqrt(self._variance(window, noise)))

    def _variance(self, window: int, noise: NoiseModel | None) -> float:
        """(window median - baseline)'s variance in per-run sigmas^2 (`z`)."""
        runs = len(self.reference)
        g_window = noise.g(window) if noise is not None else 1.0
        g_reference = noise.g(runs) if noise is not None else 1.0
        return median_se_factor(window) ** 2 * g_window + math.pi / (2.0 * runs) * g_reference + self.extra

    def z_below(self, distance: float, window: int, limit: float, noise: NoiseModel | None = None) -> bool:
        """Whether `z(distance, window, noise)` is below `limit` (positive), mostly told without the MAD: most
        windows asked about are far from it, and the MAD is a selection from the reference (300 bytecodes).

        z is below the limit when sigma is above distance / (limit x sd), so when the MAD is at least that
        over MAD_TO_SIGMA: when no more than (runs - 1) // 2 of the reference's runs lie closer to its level
        than that (the MAD is then the deviation of one at least as far, or the mean of two such). Those are
        counted by two searches of the sorted reference, over a reach widened by 1e-6 (far above the rounding
        of the deviations and of z, some 1e-16 of them) and a bound raised by 1e-9: a window this cannot tell
        about is left to z itself."""
        variance = self._variance(window, noise)
        if self._sigma is None and distance > 0:
            bound = distance / (limit * math.sqrt(variance)) * (1.0 + 1e-9)  # a sigma above this: z below limit
            if bound <= SIGMA_FLOOR:
                return True
            reach = bound / MAD_TO_SIGMA * (1.0 + 1e-6)
            reference, level = self.reference, self.level
            closer = bisect_left(reference, level + reach) - bisect_right(reference, level - reach)
            if closer <= (len(reference) - 1) // 2:
                return True
        return distance / (self.sigma * math.sqrt(variance)) < limit


@dataclass(frozen=True, slots=True)
class _CusumReference:
    """What the sequential rule measures from: the median residual and its MAD-sigma, the allowance and
    clip bound in those sigmas, the clipped mean (in sigmas from the median) and the long-run factor."""

    level: float
    sigma: float
    allowance: float
    bound: float
    mean: float
    factor: float
    runs: int  # residuals the level is the median of


@dataclass(slots=True)
class _Verdict:
    """Log distances from the baseline of the medians over each window (`_Core._verdict`; every run reads the
    same fields as a tuple, `_Core._verdict_parts`: an object's __init__ is a call)."""

    baseline: _Baseline
    page: float
    ticket: float | None  # None: too little history, or no seasonal baseline yet
    recent: list[float]  # the last runs' log TTFTs or residuals; minus baseline.level, distances
    adapted: bool  # an open incident outlived the history before it: its level is the new normal
    page_window: int  # runs in each window (stretched to hold their rule's min_probes)
    ticket_window: int

    def clear(self, window: int) -> float:
        """Distance of the median over the last `window` runs (only needed while an incident is open)."""
        return median(self.recent[-window:]) - self.baseline.level


# `_Verdict`'s fields in its order, as `_Core._verdict_parts` gives them.
_VerdictParts = tuple[_Baseline, float, float | None, list[float], bool, int, int]


class _Core:
    """Valid runs' times, log TTFTs and seasonal residuals, plus the recent runs' request counts.
    `step` appends a run and evaluates it. Results depend only on the data, never on what happens to
    be cached, so a core loaded with history and one fed run by run agree."""

    # Slots: with more than 30 attributes (CPython 3.11 shares an instance's keys up to 30) an instance keeps them
    # in a dictionary of its own, and every read and write of one, a few hundred a run, is a lookup in it.
    __slots__ = (
        "_appended_since_trim",
        "_clean_streak",
        "_cusum_per_week",
        "_cusum_period",
        "_cusum_references",
        "_cusum_scales",
        "_cusum_start",
        "_derived",
        "_eager_from",
        "_failed_streak",
        "_half_window_s",
        "_interval",
        "_interval_runs",
        "_jump_cache",
        "_keep",
        "_level_low",
        "_level_s",
        "_loaded",
        "_log_clear_ratio",
        "_log_page_ratio",
        "_log_ticket_ratio",
        "_lookback_s",
        "_mad_near",
        "_nan_from",
        "_partner_gaps",
        "_profile_cache",
        "_recent",
        "_reference_range",
        "_reference_sorted",
        "_residuals",
        "_resolved_s",
        "_run_slot",
        "_seed_days",
        "_slot_days",
        "_slot_span",
        "_slots",
        "_spread_kept",
        "_steps",
        "_sums",
        "_threshold_now",
        "_threshold_pending",
        "_thresholds",
        "_ticket_confirmations",
        "_ticket_sorted",
        "_window_failed",
        "_window_held",
        "_window_medians",
        "_window_requests",
        "allowance",
        "baseline_ms",
        "epoch_started",
        "logs",
        "noise",
        "probes",
        "rules",
        "slo_ms",
        "times",
    )

    def __init__(self, rules: Rules, slo_ms: float | None) -> None:
        self.rules = rules
        self.slo_ms = slo_ms
        self.times: list[float] = []
        self.logs: list[float] = []
        self.probes: list[int] = []  # measured requests of each valid run
        # Log distance of each run from its slot's seasonal baseline; nan: none; None: not computed yet.
        self._residuals: list[float | None] = []
        self._slots: dict[int, _Slot | None] = {}
        # By time of day (slot % SLOTS_PER_DAY), the last slot `_slot` worked out there: (its number, the window
        # median of each day it reads, the day before first, the medians found in order, their runs).
        self._slot_days: dict[int, tuple[int, list[tuple[float, int] | None], list[float], int]] = {}
        self._window_medians: dict[int, tuple[float, int] | None] = {}
        self._reference_range = (0, 0)
        self._reference_sorted: list[float] = []
        self._eager_from = 1 << 62  # from this index on, every residual is computed
        self._nan_from = -1  # the last of those that is nan (-1: none), so a window after it has none
        self._recent: deque[tuple[int, int, str | None]] = deque(
            maxlen=max(rules.error_window_runs, rules.consecutive_failures)
        )
        self._window_requests = self._window_failed = 0  # over the last error_window_runs runs
        self._failed_streak = 0  # runs in a row where every request failed
        self._clean_streak = 0  # runs in a row without a failed request
        self._half_window_s = rules.seasonal_window_minutes * 60.0
        self._keep = rules.history_runs
        self._log_page_ratio = math.log(rules.page.ratio)
        self._log_ticket_ratio = math.log(rules.ticket.ratio)
        self._log_clear_ratio = math.log(rules.clear_ratio)
        self._lookback_s = _lookback_s(rules)
        self._level_s = rules.level_hours * 3600.0
        self._level_low = 0  # where `_seasonal` found the level's first run last time
        self._mad_near = [0]  # where the seasonal baselines' MAD selection ended last time (`_Baseline.sigma`)
        # (window_runs, count, probes held by runs count - window_runs .. count - 1) as `_window` last summed them.
        self._window_held: tuple[int, int, int] | None = None
        # (count, window, seasonal, its runs sorted) as `_verdict_parts` last took the ticket window's median.
        self._ticket_sorted: tuple[int, int, bool, list[float]] | None = None
        self._appended_since_trim = 0
        self.baseline_ms: float | None = None  # what the last stepped run was compared with
        self._cusum_references: dict[int, _CusumReference | None] = {}
        self._profile_cache: tuple[tuple[int, float, int], tuple[float, float]] | None = None
        # The CUSUM's threshold for the last stepped run (`threshold`): the value, or the `_cusum_scales` entry it is
        # to be derived from when first read (`_cusum` needs it only while the sum is above 0).
        self._threshold_now: float | None = None
        self._threshold_pending: tuple[tuple[tuple[Any, ...], float, float, float, list[Any]], float] | None = None
        self.allowance: float | None = None  # the CUSUM's (in per-run sigmas), for the last stepped run
        self._thresholds: dict[tuple[float, float, int, float], float] = {}
        self._derived: float | None = None  # the CUSUM threshold derived last: where the next search starts
        # The CUSUM's share of the false alerts a week: what its threshold is measured against (`_cusum`).
        self._cusum_per_week = noise_model.CUSUM_SHARE * rules.false_alerts_per_week
        # The window ticket rule's confirming runs: with the model, wander that passes in half an hour waited out.
        self._ticket_confirmations = rules.ticket.confirmations + (
            noise_model.TICKET_EXTRA_CONFIRMATIONS if rules.noise_model else 0
        )
        # The last run's CUSUM inputs with the model engaged: (what they came from, allowance, scale, the least
        # threshold they can derive, [the reference's variance share, the threshold, None until asked for]).
        self._cusum_scales: tuple[tuple[Any, ...], float, float, float, list[Any]] | None = None
        # The CUSUM excursion's first run (the state's `cusum_since`, the very object) and its index, and the
        # last resolve (`resolved_at`) in seconds: asked after every run while they stand, and a datetime's
        # timestamp() is a call into its time zone. The index moves only at a trim, which forgets it.
        self._cusum_start: tuple[datetime, int] | None = None
        self._resolved_s: tuple[datetime, float] | None = None
        # `interval_s` and the count of runs it was worked out for (-1: none): between trims, which forget it, the
        # runs are only ever appended to, so their count tells them.
        self._interval = 300.0
        self._interval_runs = -1
        # Per day before, how many runs before the last run `_day_difference` was asked about it found its partner
        # (the first run not earlier than its time less the tolerance): the next run's is mostly as many back.
        self._partner_gaps = [0] * PARTNER_DAYS
        self.noise: NoiseModel | None = None  # the model the last stepped run was judged with
        self.epoch_started: datetime | None = None  # set when the last stepped run began an epoch
        # The kept jump-test medians, by window and source (residuals or log TTFTs): (the first window's first
        # run's index, the median of each window from there on, in order).
        self._jump_cache: dict[tuple[int, bool], tuple[int, array[float]]] = {}
        # The jump test's last jumps: (the first window's first run, window, after, seasonal, the jumps in time
        # order, the same sorted), for `_jump_spread` to carry on from.
        self._spread_kept: tuple[int, int, int, bool, list[float], list[float]] | None = None
        self._run_slot: _Slot | None = None  # the seasonal slot of the run being stepped (None: none yet)
        # The last run's slot and the first second of it and of the next: the runs until then have the same (every
        # run's slot was int(moment // SLOT_S), a float division's remainder and a conversion, and two look-ups).
        # Exact: a slot's first second is an integer times SLOT_S, and moment // SLOT_S the floor of the quotient.
        self._slot_span: tuple[float, float, _Slot | None] = (1.0, 0.0, None)  # (none yet: no moment is in it)
        # The same for the CUSUM's three-hour periods and the reference of the last one asked for (`_cusum`).
        self._cusum_period: tuple[float, float, _CusumReference | None] = (1.0, 0.0, None)
        self._steps = 0  # runs stepped: a core stepped through many keeps running sums (window_sums.py)
        self._sums: WindowSums | None = None
        # (whole days of seed residuals fed, the model after them): `_seed_noise` goes on from there.
        self._seed_days: tuple[int, NoiseModel] | None = None
        # `load`'s runs with a TTFT (their indexes in its history), and from when their residuals are whole.
        self._loaded: tuple[list[int], float] | None = None

    # ------------------------------------------------ data

    def append(self, run: RunPoint) -> bool:
        """Add `run`; whether it joined the valid runs (it has a TTFT and is latency evidence)."""
        ttft = run.ttft_ms
        # run.counts(), without the call and its tuple: once a run.
        ok, errors = run.ok, run.errors
        if ok is None:
            ok = 0 if ttft is None else 1
        if errors is None:
            errors = 1 if ttft is None else 0
        window = self.rules.error_window_runs
        recent = self._recent
        if len(recent) >= window:
            old_ok, old_errors, _ = recent[-window]
            self._window_requests -= old_ok + old_errors
            self._window_failed -= old_errors
        recent.append((ok, errors, run.error))
        self._window_requests += ok + errors
        self._window_failed += errors
        self._failed_streak = 0 if ok else self._failed_streak + 1
        self._clean_streak = 0 if errors else self._clean_streak + 1
        # A run that is no latency evidence (a warm probe that found no prompt cache) stays out of the
        # history the baselines are drawn from too: an outage of the cache would otherwise become the
        # warm series' baseline and hide a later regression of the warm path.
        if ttft is None or not run.latency_evidence:
            return False
        moment = run.at.timestamp()
        times = self.times
        if times and moment < times[-1]:
            raise ValueError(f"runs must come in time order; {run.at.isoformat()} is older than the last one")
        times.append(moment)
        self.logs.append(math.log(ttft))
        self.probes.append(ok if ok > 1 else 1)  # max(ok, 1)
        self._residuals.append(None)
        self._appended_since_trim += 1
        if self._appended_since_trim >= TRIM_EVERY_RUNS:
            self._trim()
        return True

    def load(self, history: HistoryColumns, *, residuals: bool = False) -> None:
        """Append `history`'s runs to an empty core: the same data as `append` of each run it stands for,
        built a column at a time (evaluating a run loads a week of history: 2,400 appends took 4 ms).
        `residuals`: take the residuals `history` holds instead of computing them (they are the same
        numbers: `HistoryColumns`); `loaded_residuals` then says which this core computed."""
        if self._recent or self.times:
            raise ValueError("load fills an empty core")
        self._loaded = None
        count = len(history)
        if not count:
            return
        oks, errors = history.oks, history.errors
        recent = self._recent
        for index in range(max(0, count - (recent.maxlen or count)), count):
            recent.append((oks[index], errors[index], history.error_classes[index]))
        window = list(recent)[-self.rules.error_window_runs :]
        self._window_requests = sum(ok + failed for ok, failed, _ in window)
        self._window_failed = sum(failed for _ok, failed, _ in window)
        self._failed_streak = _trailing(oks)
        self._clean_streak = _trailing(errors)
        ttfts = history.ttfts
        valid = [index for index in range(count) if ttfts[index] == ttfts[index]]
        moments = history.moments
        times = [moments[index] for index in valid]
        if any(later < earlier for earlier, later in pairwise(times)):
            raise ValueError("runs must come in time order")
        # `append` trims every TRIM_EVERY_RUNS runs, each time from the last run appended then: the same
        # cuts here (a history of that many runs, e.g. a week of 1-minute runs), or the first runs kept, and
        # so every residual and noise model read from them, would differ.
        dropped = 0
        for boundary in range(TRIM_EVERY_RUNS, len(valid) + 1, TRIM_EVERY_RUNS):
            if boundary - dropped > self._keep:
                cut = times[boundary - self._keep] - self._lookback_s
                dropped = max(dropped, bisect_left(times, cut, dropped, boundary))
        valid = valid[dropped:]
        self.times = times = times[dropped:]
        self.logs = [math.log(ttfts[index]) for index in valid]
        self.probes = [max(oks[index], 1) for index in valid]
        self._residuals = [None] * len(valid)
        complete_after = history.complete_from + residual_reach_s(self.rules)
        known = history.residuals if residuals and self.rules.seasonal_days else None
        if known is not None:
            # Only where this core's own reading would be whole too: a residual reaching back past the
            # history's start is computed from what the history holds, and so must it be here.
            for k in range(bisect_left(times, complete_after), len(valid)):
                self._residuals[k] = known[valid[k]]
        self._appended_since_trim = (len(valid) + dropped) % TRIM_EVERY_RUNS
        self._loaded = (valid, complete_after)

    def loaded_residuals(self) -> list[tuple[int, float]]:
        """(index in the loaded history, residual) of the loaded runs whose residual is known now and was
        computed from every run it depends on (the history complete back to its reach)."""
        if self._loaded is None or not self.rules.seasonal_days:
            return []
        valid, complete_after = self._loaded
        times, residuals = self.times, self._residuals
        start = bisect_left(times, complete_after, 0, len(valid))
        return [(valid[k], value) for k in range(start, len(valid)) if (value := residuals[k]) is not None]

    def _trim(self) -> None:
        """Forget runs older than anything the detector reads, keeping memory flat over long replays."""
        self._appended_since_trim = 0
        self._loaded = None  # the loaded runs' indexes are about to move
        self._slot_span = self._cusum_period = (1.0, 0.0, None)  # the caches they mirror may be trimmed below
        if len(self.times) <= self._keep:
            return
        drop = bisect_left(self.times, self.times[-self._keep] - self._lookback_s)
        if drop > 0:
            self._profile_cache = None
            self._sums = None  # rebuilt from the runs kept, when next asked
            self._seed_days = None  # its days began at the first run kept
            self._jump_cache = {}  # keyed by index
            self._spread_kept = None  # so is it
            self._interval_runs = -1  # `interval_s` carries it from one run to the next only
            self._cusum_start = None
            self._window_held = None
            self._ticket_sorted = None
            self._level_low = 0
            del self.times[:drop], self.logs[:drop], self.probes[:drop], self._residuals[:drop]
            self._eager_from = max(0, self._eager_from - drop)
            self._nan_from = max(-1, self._nan_from - drop)
            low, high = self._reference_range
            if low >= drop:
                self._reference_range = (low - drop, high - drop)
            else:
                self._reference_range, self._reference_sorted = (0, 0), []
        for cache, keep in (
            (self._slots, SLOTS_PER_DAY),
            (self._window_medians, (self.rules.seasonal_days + 1) * SLOTS_PER_DAY),
        ):
            if len(cache) > 2 * keep:
                newest = max(cache)
                for slot in [s for s in cache if s < newest - keep]:
                    del cache[slot]

    # ------------------------------------------------ baselines

    def _slot(self, slot: int) -> _Slot | None:
        """The seasonal baseline of `slot`: the median over the previous days of each day's median near
        the slot's time of day. Per-day medians first, so one day with an incident cannot drag it."""
        cached = self._slots.get(slot, _UNCACHED)
        if cached is not _UNCACHED:
            return cached  # type: ignore[return-value]
        before = self._slot_days.get(slot % SLOTS_PER_DAY)
        if before is not None and before[0] == slot - SLOTS_PER_DAY:
            # The slot a day earlier read the same days but the day before, and one more at the far end (a past
            # window's median never changes): that day's median out, the day before's in.
            _, found_days, days, count = before
            found = self._window_median(slot - SLOTS_PER_DAY)
            oldest = found_days.pop()
            found_days.insert(0, found)
            if oldest is not None:
                del days[bisect_left(days, oldest[0])]
                count -= oldest[1]
            if found is not None:
                insort(days, found[0])
                count += found[1]
        else:
            found_days = []
            days = []
            count = 0
            known = self._window_medians.get
            for key in range(
                slot - SLOTS_PER_DAY, slot - (self.rules.seasonal_days + 1) * SLOTS_PER_DAY, -SLOTS_PER_DAY
            ):
                # All but the day before are known (each served the slot a day earlier): looked up here, once.
                window = known(key, _UNCACHED)
                if window is _UNCACHED:
                    window = self._window_median(key)
                found_days.append(window)  # type: ignore[arg-type]
                if window is not None:
                    days.append(window[0])  # type: ignore[index]
                    count += window[1]  # type: ignore[index]
            days.sort()
        self._slot_days[slot % SLOTS_PER_DAY] = (slot, found_days, days, count)
        result = None
        if len(days) >= SEASONAL_MIN_DAYS:
            half = len(days) // 2  # median(days), without the call: every other run
            result = _Slot(days[half] if len(days) % 2 else (days[half - 1] + days[half]) / 2.0, count, len(days))
        self._slots[slot] = result
        return result

    def _window_median(self, slot: int) -> tuple[float, int] | None:
        """(median, count) of the runs within seasonal_window_minutes of `slot`'s centre; each past slot
        serves the next seasonal_days days, so it is computed once."""
        cached = self._window_medians.get(slot, _UNCACHED)
        if cached is not _UNCACHED:
            return cached  # type: ignore[return-value]
        centre = (slot + 0.5) * SLOT_S
        times = self.times
        low = bisect_left(times, centre - self._half_window_s)
        high = bisect_left(times, centre + self._half_window_s, low)
        result = None
        if high > low:
            values = self.logs[low:high]
            values.sort()  # median(values), without the call: every other run
            half = len(values) // 2
            result = (values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2.0), high - low
        self._window_medians[slot] = result
        return result

    def _residual(self, index: int) -> float:
        slot = self._slot(int(self.times[index] // SLOT_S))
        return self.logs[index] - slot.center if slot is not None else math.nan

    def _residuals_between(self, low: int, high: int) -> list[float]:
        """Residuals of valid runs low..high-1 (nan where their slot has no seasonal baseline). Runs
        loaded as history get theirs when first asked for; runs stepped through, when appended."""
        residuals = self._residuals
        if low < self._eager_from:  # else every one is computed: a plain slice (asked several times a run)
            for index in range(low, min(high, self._eager_from)):
                if residuals[index] is None:
                    residuals[index] = self._residual(index)
        return residuals[low:high]  # type: ignore[return-value]

    def _reference(self, low: int, high: int) -> list[float]:
        """The residuals of valid runs low..high-1 that have one, sorted. The range mostly slides by one
        run per call, so the sorted list is kept and updated rather than sorted again."""
        cached_low, cached_high = self._reference_range
        if not (cached_low <= low <= cached_high and cached_low <= high and high - cached_high <= 64):
            values = self._residuals_between(low, high)
            self._reference_sorted = sorted(r for r in values if r == r)
            self._reference_range = (low, high)
            return self._reference_sorted
        data = self._reference_sorted
        # The cached range's residuals were computed when they were added: plain slices on this once-a-run
        # path, after computing those of runs loaded as history that come in now.
        eager = self._eager_from
        if cached_high < (eager if eager < high else high):  # min(high, eager), once a run
            self._residuals_between(cached_high, high)
        residuals: list[float] = self._residuals  # type: ignore[assignment]  # none is None in these ranges
        if high > cached_high:
            for value in residuals[cached_high:high]:
                if value == value:
                    insort(data, value)
        elif high < cached_high:
            for value in residuals[high:cached_high]:
                if value == value:
                    del data[bisect_left(data, value)]
        for value in residuals[cached_low:low]:
            if value == value:
                del data[bisect_left(data, value)]
        self._reference_range = (low, high)
        return data

    def _seasonal(self, slot: _Slot, end: int) -> _Baseline | None:
        """The current level from the seasonally adjusted runs of the `level_hours` before run `end`: the
        seasonal baseline gives the shape of the day, recent runs its height, so slow drift does not
        build up. None until half that time is covered by runs with a seasonal baseline."""
        if end <= 0:
            return None
        times, level_s = self.times, self._level_s
        end_s = times[end if end < len(times) else -1]
        # bisect_left(times, end_s - level_s): mostly the run after the one found last time (the end moves a run
        # on), or that one again; searched for otherwise.
        start_s = end_s - level_s
        low = self._level_low + 1
        if not (low < len(times) and times[low - 1] < start_s <= times[low]):
            low -= 1
            if not (low < len(times) and (low == 0 or times[low - 1] < start_s) and start_s <= times[low]):
                low = bisect_left(times, start_s)
        self._level_low = low
        if low >= end or times[low] > end_s - level_s / 2:
            return None
        cached_low, cached_high = self._reference_range
        if low == cached_low + 1 and end == cached_high + 1 and cached_high >= self._eager_from:
            # `_reference(low, end)` where the range slides by a run (most runs), without the call: the run that
            # joins in, the one that leaves out.
            reference = self._reference_sorted
            residuals: list[float] = self._residuals  # type: ignore[assignment]  # none is None from `_eager_from` on
            value = residuals[cached_high]
            if value == value:
                insort(reference, value)
            value = residuals[cached_low]
            if value == value:
                del reference[bisect_left(reference, value)]
            self._reference_range = (low, end)
        else:
            reference = self._reference(low, end)
        # Mostly runs with a seasonal baseline: a few would let the start of a regression set the level.
        runs = len(reference)
        if runs < MIN_BASELINE_RUNS or runs < (end - low) // 2:
            return None
        half = runs // 2  # median(reference, presorted=True), without the call: once a run
        level = reference[half] if runs % 2 else (reference[half - 1] + reference[half]) / 2.0
        # In the parameters' order, not by keyword: a keyword call costs twice as much, and this is once a run.
        center = slot.center + level
        extra = _MEDIAN_VARIANCE / slot.count  # a median of per-day medians
        return _Baseline(center, level, reference, True, extra, end, self._mad_near)

    def _trailing(self, end: int) -> _Baseline | None:
        reference = sorted(self.logs[max(0, end - self.rules.trailing_runs) : end])
        if len(reference) < MIN_BASELINE_RUNS:
            return None
        level = median(reference, presorted=True)
        return _Baseline(center=level, level=level, reference=reference, seasonal=False, extra=0.0, end=end)

    # ------------------------------------------------ one run

    def step(self, state: SeriesState, run: RunPoint) -> list[Event]:
        """Append `run`, evaluate it, update `state` in place; the events it caused."""
        self.epoch_started = None
        self._steps += 1
        valid = self.append(run)
        # The run's seasonal slot, looked up once: the verdict and the sequential rule compare with it too.
        slot = None
        if valid and self.rules.seasonal_days:
            times = self.times
            index = len(times) - 1
            if index < self._eager_from:
                self._eager_from = index
            moment = times[index]
            span = self._slot_span
            if span[0] <= moment < span[1]:  # two runs a slot at 5-minute runs
                slot = span[2]
            else:
                number = int(moment // SLOT_S)
                known = self._slots  # `_slot`'s cache, read here
                slot = known[number] if number in known else self._slot(number)
                self._slot_span = (number * SLOT_S, (number + 1) * SLOT_S, slot)
            if slot is not None:
                self._residuals[-1] = self.logs[index] - slot.center
            else:
                self._residuals[-1] = math.nan
                self._nan_from = index
        self._run_slot = slot
        events: list[Event] = []
        # Each of the next three asked only when it can have something to do: most runs fail no request, report no
        # tokens, and name the model named before (or none) with nothing else about it; a call each costs more.
        if self._window_failed or self._failed_streak or "availability" in state.incidents:
            self._availability(state, run, events)
        if run.output_tokens is not None:
            jumped = identity.tokens_jump(state, run)
            if jumped is not None:
                events.append(jumped)
        served = run.served_model
        if (
            (served is None or served == state.served_model)
            and run.fingerprint is None
            and run.canary is None
            and run.server_build is None
        ):
            change = None  # identity.observe has nothing to do: the model named before, or none
        else:
            change = identity.observe(state, run)
        if change is not None:
            # Another model answers now: what it does is compared with a baseline of its own, from here.
            events.append(change.event(run.at))
            self._start_epoch(state, change.since, run.at, events)
        elif valid:
            self._regression(state, run, events)
            if self.slo_ms is not None:
                self._slo(state, run, events)
        return events

    def _start_epoch(self, state: SeriesState, since: datetime, at: datetime, events: list[Event]) -> None:
        """A new baseline epoch from `since`: open latency incidents resolve (they measured the model
        before), the confirmation streaks and the sequential sum start again, and the noise model is
        learnt anew. The caller drops the runs before `since` from the history (`epoch_since`)."""
        for kind in ("regression", "slo"):
            incident = state.incidents.pop(kind, None)
            if incident is not None:
                events.append(_event(incident, "resolve", at, {"reason": "model_changed"}, resolved=True))
        state.page_streak = state.ticket_streak = state.slo_streak = 0
        state.page_since = state.ticket_since = state.slo_since = None
        state.cusum, state.cusum_since, state.cusum_runs = 0.0, None, 0
        state.noise = None
        state.resolved_at = at
        state.epoch_since = since
        self.epoch_started = since

    # ------------------------------------------------ availability

    def _availability(self, state: SeriesState, run: RunPoint, events: list[Event]) -> None:
        rules = self.rules
        consecutive = self._failed_streak
        full = len(self._recent) >= rules.error_window_runs
        rate = self._window_failed / self._window_requests if full and self._window_requests else 0.0
        down = consecutive >= rules.consecutive_failures
        flaky = rate >= rules.error_rate
        incident = state.incidents.get("availability")
        if incident is None and not (down or flaky):
            return
        recent = list(self._recent)
        detail = {"consecutive_failures": consecutive, "error_rate": round(rate, 4)}
        if incident is None:
            incident = Incident(
                kind="availability",
                severity="page" if down else "ticket",
                opened_at=run.at,
                since=run.at,
                error=_dominant_error(recent[-consecutive:] if down else recent[-rules.error_window_runs :]),
                triggers=(["consecutive"] if down else []) + (["error_rate"] if flaky else []),
            )
            state.incidents["availability"] = incident
            events.append(_event(incident, "open", run.at, detail))
            return
        if flaky and "error_rate" not in incident.triggers:
            incident.triggers.append("error_rate")
        if down and incident.severity != "page":
            incident.severity = "page"
            incident.triggers.append("consecutive")
            incident.error = _dominant_error(recent[-consecutive:])
            events.append(_event(incident, "update", run.at, detail))
            return
        # Hysteresis: error-free runs in a row, and the rate back under its limit if it ever fired.
        recovered = self._clean_streak >= rules.consecutive_failures
        if recovered and ("error_rate" not in incident.triggers or not flaky):
            del state.incidents["availability"]
            events.append(_event(incident, "resolve", run.at, detail, resolved=True))

    # ------------------------------------------------ regression

    def _regression(self, state: SeriesState, run: RunPoint, events: list[Event]) -> None:
        rules = self.rules
        incident = state.incidents.get("regression")
        count = len(self.logs)  # valid runs, this one included
        verdict = self._verdict_parts(incident, count, state.page_since) if count > rules.min_history_runs else None
        if verdict is None:
            state.page_streak = state.ticket_streak = 0
            state.page_since = state.ticket_since = None
            return
        baseline, page, ticket, recent, adapted, page_window, ticket_window = verdict
        baseline_ms = self.baseline_ms = math.exp(baseline.center)
        # The noise model is on by default (`detection.noise_model`): without it every rule runs as it did before
        # the model existed (noise None: no widening, no extra confirmations, the fixed CUSUM threshold).
        noise = self.noise = (state.noise or self._noise_model(state, count)) if rules.noise_model else None
        if noise is None:
            state.noise = None  # a model left from when it was on is stale by the time it is turned on again
        # The evidence rules scale by the model only where it measured runs clearly more correlated than
        # independent ones: below that, its estimate is mostly its own sampling error and what regressions
        # left in it, and the rules' own long-run factor does better (noise_model.engaged).
        # noise_model.engaged(noise), without the call: once a run.
        scaled = noise if noise is not None and noise.vario_ratio >= noise_model.ENGAGE_VARIO else None
        confirms = self._confirms
        # Below a rule's ratio nothing confirms (`_confirms`, `_jumps`): most runs stop at that comparison.
        if page >= self._log_page_ratio and (
            (
                confirms(page, rules.page, self._log_page_ratio, baseline, baseline_ms, page_window, scaled)
                and self._run_is_slow(recent, baseline)
            )
            or (
                noise is not None
                and self._jumps(baseline, page, page_window, recent, baseline_ms, count, state.page_since)
            )
        ):
            state.page_streak += 1
            state.page_since = state.page_since or run.at
        else:
            state.page_streak, state.page_since = 0, None
        # After a resolve, tickets wait for a window of fresh runs: the ticket window outlasts the
        # others, and resolving into a new ticket on the same runs would flap.
        ticket_w = rules.ticket.window_runs
        resolved_at = state.resolved_at
        if resolved_at is None:
            fresh = True
        else:
            resolved = self._resolved_s
            if resolved is None or resolved[0] is not resolved_at:
                resolved = self._resolved_s = (resolved_at, resolved_at.timestamp())
            fresh = count >= ticket_w and self.times[count - ticket_w] > resolved[1]
        # The ticket window opens tickets beside the sequential rule unless window_tickets is off; then it
        # only times clearing and the SLO rule.
        if (
            (rules.cusum is None or rules.window_tickets)
            and fresh
            and ticket is not None
            and ticket >= self._log_ticket_ratio
            and confirms(ticket, rules.ticket, self._log_ticket_ratio, baseline, baseline_ms, ticket_window, scaled)
        ):
            state.ticket_streak += 1
            state.ticket_since = state.ticket_since or run.at
        else:
            state.ticket_streak, state.ticket_since = 0, None

        paging = state.page_streak >= rules.page.confirmations
        if noise is not None:
            distance = recent[-1] - baseline.level
            noise_model.observe(noise, slow=distance >= self._log_page_ratio, calm=distance < self._log_clear_ratio)
            # A burst of up to 3 slow runs holds a 5-run median up for 3 runs, and fills the jump test's
            # short window: pages need more slow runs in a row than the longest burst, from a series' first
            # burst on. Slow against the baseline, or each a run of the page streak (slow against the window
            # before the jump, where slow wander has taken the series under its baseline).
            # Slow runs in a row as the data has them, too: `noise.run` counts the runs evaluated, and a batch
            # cut by its budget leaves runs unevaluated (a series evaluated every other run would otherwise
            # need twice the slow runs to page).
            if paging:
                persistence = noise_model.page_persistence(noise, window=page_window)
                paging = (
                    max(noise.run, state.page_streak, self._slow_runs(recent, baseline, persistence)) >= persistence
                )
        ticketing = state.ticket_streak >= self._ticket_confirmations
        # The run interval, read once for the sequential rule and the model's learning (a call each, every run).
        interval = self.interval_s() if noise is not None else 0.0
        sequential = (
            self._cusum(state, run, incident, count, fresh, scaled, interval) if not (paging or ticketing) else None
        )
        # The noise model learns this run's difference from the same time on the days before (`_day_difference`),
        # unless a regression may be in it: not while an incident is open or a page is being confirmed. Freezing
        # it whenever a rule gathers any evidence would leave out exactly the wander the model is for (the CUSUM
        # climbs on it too), so only while a ticket is being confirmed or the CUSUM is past half its threshold: a
        # step that has not opened anything yet is the likeliest regression to slip in (on independent runs with
        # steps, the model then read them as correlated and made every rule slower). The model's growth cap
        # (noise.py) bounds what a step that slips past every rule can add.
        if (
            noise is not None
            and incident is None
            and not (state.page_streak or state.ticket_streak)
            # The sum is at 0 after most runs: below half of any threshold (every one is above 0), told without one.
            and not (state.cusum > 0.0 and self._cusum_past_half(state.cusum))
        ):
            difference = self._day_difference(count - 1, interval / 2.0)
            if difference is not None:
                noise_model.update(noise, difference)
        if incident is None and sequential is None and not (paging or ticketing):
            return  # most runs: nothing opens, and nothing is open to update or resolve
        detail: dict[str, Any] = {"baseline": "seasonal" if baseline.seasonal else "trailing"}
        if adapted:
            detail["baseline"] += ", adapted to the incident's level"
        if incident is None and sequential is not None:
            cusum_baseline_ms, ratio, since, total, threshold, raised = sequential
            incident = Incident(
                kind="regression",
                severity="ticket",
                opened_at=run.at,
                since=since,
                baseline_ms=cusum_baseline_ms,
                observed_ms=cusum_baseline_ms * ratio,
                ratio=ratio,
                triggers=["cusum"],
            )
            incident.see(ratio, run.at)
            state.incidents["regression"] = incident
            detail.update(rule="cusum", cusum=round(total, 2))
            if noise is not None:  # (the rules without the model give what they always gave)
                detail["cusum_threshold"] = round(threshold, 2)
            if raised > 1.0:
                # Raised because this series' own sum climbs further than its noise was derived to let it.
                detail["cusum_threshold_raised"] = round(raised, 2)
            detail.update(self._evidence(noise, ratio, self._runs_since(since, count), scaled=scaled is not None))
            events.append(_event(incident, "open", run.at, detail))
        elif incident is None and (paging or ticketing):
            severity: Severity = "page" if paging else "ticket"
            distance = page if paging or ticket is None else ticket
            ratio = math.exp(distance)
            incident = Incident(
                kind="regression",
                severity=severity,
                opened_at=run.at,
                since=(state.page_since if paging else state.ticket_since) or run.at,
                baseline_ms=baseline_ms,
                observed_ms=baseline_ms * ratio,
                ratio=ratio,
            )
            incident.see(ratio, run.at)
            state.incidents["regression"] = incident
            state.cusum, state.cusum_since, state.cusum_runs = 0.0, None, 0
            window = page_window if severity == "page" else ticket_window
            detail["z"] = round(baseline.z(distance, min(window, getattr(rules, severity).window_runs), noise), 2)
            detail.update(self._evidence(noise, ratio, window, scaled=scaled is not None))
            events.append(_event(incident, "open", run.at, detail))
        elif incident is not None and paging and incident.severity == "ticket":
            ratio = math.exp(page)
            incident.see(ratio, run.at)
            incident.severity = "page"
            incident.baseline_ms, incident.observed_ms, incident.ratio = baseline_ms, baseline_ms * ratio, ratio
            detail["z"] = round(baseline.z(page, min(page_window, rules.page.window_runs), noise), 2)
            detail.update(self._evidence(noise, ratio, page_window, scaled=scaled is not None))
            events.append(_event(incident, "update", run.at, detail))
        elif incident is not None:
            incident.see(math.exp(page), run.at)
            window = max(rules.clear_runs, getattr(rules, incident.severity).window_runs)
            ratio = math.exp(_Verdict(*verdict).clear(window))
            if ratio >= rules.clear_ratio or state.page_streak:
                return
            del state.incidents["regression"]
            state.page_streak = state.ticket_streak = 0
            state.page_since = state.ticket_since = None
            state.resolved_at = run.at
            # A CUSUM ticket that cleared soon was wander the sum climbed on: counted in its tail where it fired
            # (at the multiplier then, which stood while the sum slept), so the threshold rises until such
            # tickets come at the CUSUM's share (`noise_model.tail_multiplier`). A longer one was a regression.
            if (
                noise is not None
                and incident.triggers == ["cusum"]
                and incident.severity == "ticket"
                and (run.at - incident.opened_at).total_seconds() < noise_model.TAIL_WANDER_S
                and rules.cusum is not None
                and rules.cusum.threshold is None
            ):
                noise_model.tail_end(noise, self._cusum_per_week, fired_at=noise.tail[6])
            detail["opened_baseline_ms"] = incident.baseline_ms
            detail["opened_observed_ms"] = incident.observed_ms
            detail["duration_s"] = (run.at - incident.opened_at).total_seconds()
            incident.baseline_ms, incident.observed_ms, incident.ratio = baseline_ms, baseline_ms * ratio, ratio
            events.append(_event(incident, "resolve", run.at, detail, resolved=True))

    def _cusum(
        self,
        state: SeriesState,
        run: RunPoint,
        incident: Incident | None,
        count: int,
        fresh: bool,
        noise: NoiseModel | None,
        interval: float,
    ) -> tuple[float, float, datetime, float, float, float] | None:
        """Add this run's evidence to the sequential rule; (baseline ms, ratio, since, sum, threshold, how much
        the threshold was raised by the series' own sum) when it fires.
        `interval`: `interval_s()`, read by the caller (only with `noise`).

        The level it is measured from is frozen where the current excursion began, so a shift that is
        building up evidence never becomes its own baseline. It sleeps while a regression is open and,
        after one resolved, until the ticket window holds only newer runs (`fresh`)."""
        rule = self.rules.cusum
        residual = self._residuals[count - 1] if rule is not None else None
        # The noise model, engaged or not: it keeps how this series' sum has behaved (`noise_model.tail_*`).
        model = self.noise
        if rule is None or incident is not None or not fresh or residual is None or residual != residual:
            state.cusum, state.cusum_since, state.cusum_runs = 0.0, None, 0
            if model is not None:
                model.tail[4] = 0.0  # an excursion cut short by anything but its own end is not counted
            return None
        since = state.cusum_since
        if since is None:
            start = count - 1
        else:
            started = self._cusum_start
            if started is None or started[0] is not since:
                started = self._cusum_start = (since, bisect_left(self.times, since.timestamp()))
            start = started[1]
        slot = self._run_slot
        if slot is None:
            state.cusum, state.cusum_since, state.cusum_runs = 0.0, None, 0
            if model is not None:
                model.tail[4] = 0.0
            return None
        moment = self.times[start]
        span = self._cusum_period  # as `_slot_span`: the reference of the period the excursion's first run is in
        if span[0] <= moment < span[1]:
            reference = span[2]
        else:
            period = int(moment // CUSUM_REFERENCE_S)
            known = self._cusum_references  # `_cusum_reference`'s cache, read here
            reference = known[period] if period in known else self._cusum_reference(period, rule)
            self._cusum_period = (period * CUSUM_REFERENCE_S, (period + 1) * CUSUM_REFERENCE_S, reference)
        if reference is None:
            state.cusum, state.cusum_since, state.cusum_runs = 0.0, None, 0
            if model is not None:
                model.tail[4] = 0.0
            return None
        allowance, bound, factor = reference.allowance, reference.bound, reference.factor
        value = (residual - reference.level) / reference.sigma
        value = value if value < bound else bound  # max(-bound, min(bound, value)), once a run
        value = value if value > -bound else -bound
        # With the noise model on, the threshold is also measured against how this series' own sum has
        # climbed (`noise_model.tail_multiplier`): where the noise is not what the threshold was derived for
        # (long memory, bursts, heavy tails, a reference off by more), the sum passes half of it more often
        # than it should, and the threshold rises until it would be reached at the CUSUM's share of the rate.
        # Without the model, or with `cusum.threshold` set, the threshold is the derived or configured one.
        multiplier = 1.0
        if model is not None and rule.threshold is None:
            tail = model.tail
            tail[5] += interval / noise_model.WEEK_S  # noise_model.tail_watch, without the call: every run
            multiplier = tail[6]
        # In units of g x sigma (g: the long-run variance over the per-run one): for the same false-alert
        # rate, a CUSUM's threshold grows with the noise's long-run variance, not its sigma (the sum
        # drifts down as fast, but wanders further). Without the noise model, g is the reference's
        # block estimate (factor^2) and the threshold the configured one; with it, the larger of the two
        # (the model leaves out a drift the level follows, which the reference day shows) and the threshold
        # derived from the false-alert rate.
        if noise is not None:
            # What the sum measures from is itself estimated (a day's median level, a slot's median of daily
            # medians), and on a series whose runs wander that estimate is off by as much as the wander for
            # hours: the threshold is derived for a reference off by that much (in per-run sigmas^2). The
            # model learns from day-over-day differences, so g holds none of this error itself.
            # The slot's share is widened by g over a day's runs near it (`_slot_variance`), and the allowance
            # grows by the reference's sd: a shift must stand out of what the reference may be off by before
            # it adds up (the threshold derived for that allowance is lower, so large shifts show sooner).
            # All of it depends on the reference (a new one every 3 hours), the fit (every 36 runs learnt),
            # the slot's counts and the run interval: worked out again only when one of them moves.
            # A derived threshold is worked out only when a run needs it (`_threshold_pending`, `threshold`): the
            # sum is at 0 after most runs, and below half the least threshold the inputs can derive (its floor
            # for MIN_SPIKES, `_threshold`) on many others, where each comparison below goes the same way for any
            # threshold. The inputs move every few runs: derived for each, the bench's year took 7,350 derivations
            # of about 24 us (8% of it), now 2,100. A threshold depends only on its inputs (`_threshold`): the
            # same whenever derived.
            key = (reference, noise.share, noise.phi, slot.count, slot.days, interval)
            kept = self._cusum_scales
            if kept is None or kept[0] != key:
                scale = max(noise.long_run, factor * factor)
                runs = max(reference.runs, 1)
                variance = noise.g(runs) * math.pi / (2.0 * runs) + _slot_variance(slot, noise)
                allowance += REFERENCE_ALLOWANCE_SDS * math.sqrt(variance)
                if rule.threshold is None:  # derived, at least the floor `_threshold` puts under it
                    floor = noise_model.MIN_SPIKES * rule.clip / max(scale, 1.0)
                    kept = (key, allowance, scale, floor, [REFERENCE_SHARE * variance, None])
                else:  # the configured one
                    kept = (key, allowance, scale, 0.0, [0.0, rule.threshold])
                self._cusum_scales = kept
            allowance, scale, floor = kept[1], kept[2], kept[3]
            base = kept[4][1]
            if base is None:  # derived when a run needs it (below), or `threshold` is read
                self._threshold_pending = (kept, multiplier)
        else:
            floor = 0.0
            scale = factor * factor
            base = self._fixed_threshold(rule)
        if base is not None:
            self._threshold_now = base if multiplier == 1.0 else base * multiplier
            self._threshold_pending = None
        self.allowance = allowance
        # cusum_step(state.cusum, (value - mean) / scale, allowance=allowance / scale), without the call
        total = state.cusum + (value - reference.mean) / scale - allowance / scale
        if not total > 0.0:  # max(0.0, total) is 0.0
            state.cusum, state.cusum_since, state.cusum_runs = 0.0, None, 0
            if model is not None and model.tail[4]:
                noise_model.tail_end(model, self._cusum_per_week)
            return None
        since = since or run.at
        runs = state.cusum_runs + 1
        if base is None:
            # The derived threshold is at least `floor` (so base x multiplier at least floor x multiplier, a product
            # being monotonic): below half of that, the sum is under the cap and the threshold, and below the peak
            # kept so far in units of the threshold (tail[4] x base) where that is asked (from MIN_EXCURSION_RUNS on).
            least = floor * multiplier
            peak = model.tail[4] if model is not None else 0.0  # the model is the engaged one here
            if total < least / 2.0 and (runs < MIN_EXCURSION_RUNS or total <= peak * floor):
                state.cusum, state.cusum_since, state.cusum_runs = total, since, runs
                return None
            base = self._derive_pending()
        threshold = base if multiplier == 1.0 else base * multiplier
        # Over an excursion's first MIN_EXCURSION_RUNS runs the sum holds at most half the threshold: a
        # burst, however far it went, leaves the rest to be shown by runs after it (fast jumps are the
        # page rule's; a few slow runs that recover are not a moderate shift).
        if noise is not None and runs < MIN_EXCURSION_RUNS:
            half = threshold / 2.0
            total = half if half < total else total  # min(total, half)
        elif model is not None and total > model.tail[4] * base:
            model.tail[4] = total / base  # the excursion's peak, where no cap holds it
        if total < threshold:
            state.cusum, state.cusum_since, state.cusum_runs = total, since, runs
            return None
        # The shift's estimate: the median residual over the excursion (clipped values understate it).
        excursion = [r for r in self._residuals_between(start, count) if r == r]
        ratio = math.exp(median(excursion) - reference.level)
        baseline_ms = math.exp(slot.center + reference.level)
        if baseline_ms * (ratio - 1.0) < rule.min_delta_ms:  # significant, but too small to matter
            state.cusum, state.cusum_since, state.cusum_runs = threshold, since, runs
            return None
        state.cusum, state.cusum_since, state.cusum_runs = 0.0, None, 0
        raised = threshold / base
        if model is not None:
            model.tail[4] = 0.0  # counted when its incident clears, if soon (`_regression`, TAIL_WANDER_S)
        return baseline_ms, ratio, since, total, threshold, raised

    def _runs_since(self, since: datetime, count: int) -> int:
        return max(1, count - bisect_left(self.times, since.timestamp()))

    def _evidence(self, noise: NoiseModel | None, ratio: float, runs: int, *, scaled: bool = False) -> dict[str, Any]:
        """The evidence in words and figures: "+38% over 14 runs (noise: sd 0.21, runs correlate for about
        45 min; equivalent to 4 independent runs)". Without the noise model (or with one that has measured
        too little yet: it learns from a series' second day on) the noise is still measured, for the words
        only, on the seasonal residuals before these runs; a series with under a day of them says so instead
        (not "sd 0.00, runs look independent")."""
        shift = f"{(ratio - 1.0) * 100:+.0f}% over {runs} runs"
        in_rules = noise is not None and scaled  # the model on and engaged (noise_model.engaged)
        if noise is None or noise.runs < noise_model.MIN_RUNS:
            noise = self._seed_noise(max(0, len(self.times) - runs))
        if noise is None:
            return {"evidence": f"{shift} (noise not measured yet: under a day of seasonal history)"}
        interval = self.interval_s()
        words = noise_model.describe(noise, interval_s=interval, runs=runs)
        return {
            "evidence": f"{shift} ({words})",
            "noise": {
                "sd": round(noise.sd, 4),
                "correlation_minutes": round(noise.correlation_minutes(interval), 1),
                "long_run": round(noise.long_run, 2),
                "effective_runs": round(noise.effective_runs(runs), 1),
                # False: measured for the words; the rules did not scale their evidence by it.
                "in_rules": in_rules,
            },
        }

    def _cusum_past_half(self, cusum: float) -> bool:
        """Whether the sum `cusum` (the last run's, above 0: the caller tells 0, most runs' sum, without the call)
        is at least half the last run's threshold (False: none yet)."""
        pending = self._threshold_pending
        if pending is not None and cusum < pending[0][3] * pending[1] / 2.0:
            return False  # below half the least threshold its inputs can derive (`_cusum`): none derived for it
        threshold = self.threshold
        return threshold is not None and cusum >= threshold / 2.0

    @property
    def threshold(self) -> float | None:
        """The CUSUM's threshold for the last stepped run that reached it (None: none has)."""
        if self._threshold_pending is not None:
            self._derive_pending()
        return self._threshold_now

    def _derive_pending(self) -> float:
        """The derived threshold `_cusum` left to be worked out (`_threshold_pending`), kept with its inputs for the
        runs after; the last run's threshold is that times the multiplier it had (`noise_model.tail_multiplier`)."""
        pending = self._threshold_pending
        rule = self.rules.cusum
        assert pending is not None and rule is not None  # pending only where `_cusum` ran with its rule
        (key, allowance, scale, _floor, derived), multiplier = pending
        base = derived[1] = self._threshold(allowance, scale, rule, derived[0], interval=key[5])
        self._threshold_now = base if multiplier == 1.0 else base * multiplier
        return base

    def _fixed_threshold(self, rule: Cusum) -> float:
        """The CUSUM's threshold without the noise model: the configured one (FIXED_THRESHOLD unset)."""
        threshold = self._threshold_now = rule.threshold if rule.threshold is not None else FIXED_THRESHOLD
        self._threshold_pending = None
        return threshold

    def _threshold(
        self,
        allowance: float,
        long_run: float,
        rule: Cusum,
        reference_variance: float = 0.0,
        *,
        interval: float | None = None,
    ) -> float:
        """The CUSUM's threshold for this series: the configured one, or the one that raises its share of
        `false_alerts_per_week` at this allowance (in per-run sigmas), long-run variance and run interval
        (`interval`, default `interval_s()`)."""
        self._threshold_pending = None
        if rule.threshold is not None:
            self._threshold_now = rule.threshold
            return rule.threshold
        # Its inputs move slowly (the reference every 3 hours, the fit every 3 hours of runs): computed once
        # per distinct set, as a search per run would double a year's replay. Computed from the rounded
        # inputs the set is known by, so the value does not depend on which run met the set first: a replay
        # (one core for the whole history, its cache warm) and the daemon (a core per evaluation, its cache
        # empty) derive the same threshold.
        key = (
            round(allowance, 3),
            round(math.log(long_run), 2),
            round(self.interval_s() if interval is None else interval),
            round(reference_variance, 3),
        )
        derived = self._thresholds.get(key)
        if derived is None:
            derived = noise_model.cusum_threshold(
                false_alerts_per_week=self.rules.false_alerts_per_week,
                allowance=key[0],
                long_run=math.exp(key[1]),
                interval_s=key[2],
                reference_variance=key[3],
                near=self._derived,
            )
            self._derived = derived
            if len(self._thresholds) > 256:
                self._thresholds.clear()
            self._thresholds[key] = derived
        # Each run adds at most `clip` / g: MIN_SPIKES slow runs in a row cannot reach it.
        threshold = self._threshold_now = max(derived, noise_model.MIN_SPIKES * rule.clip / max(long_run, 1.0))
        return threshold

    def interval_s(self) -> float:
        """The series' run interval: the median spacing of its last valid runs (5 minutes before two)."""
        # Asked twice after every run with the noise model on: kept for the runs it was worked out from.
        times = self.times
        count = len(times)
        kept = self._interval_runs
        if kept == count:
            return self._interval
        # One run later, with the spacing it adds the one that leaves the last 12 (runs every 5 minutes to the
        # float): the same spacings, so the same median.
        if count == kept + 1 and count >= 14 and times[-1] - times[-2] == times[-13] - times[-14]:
            self._interval_runs = count
            return self._interval
        last = times[-13:]
        spacings = sorted(map(sub, last[1:], last[:-1]))
        value = self._interval = max(1.0, median(spacings, presorted=True)) if spacings else 300.0
        self._interval_runs = count
        return value

    def _noise_model(self, state: SeriesState, count: int) -> NoiseModel:
        """The series' noise model; one the state does not have yet is measured on the history given."""
        if state.noise is None:
            tolerance = self.interval_s() / 2.0
            differences = (self._day_difference(index, tolerance) for index in range(count - 1))
            state.noise = noise_model.estimate(d for d in differences if d is not None)
        return state.noise

    def _day_difference(self, index: int, tolerance: float) -> float | None:
        """Run `index`'s log TTFT less the median of the runs at the same time of day (within `tolerance`
        seconds) on up to PARTNER_DAYS days before it, scaled to one run's spread: what the noise model
        learns from. The daily cycle and the drift cancel, and no estimated baseline shared by neighbouring
        runs is in it, so independent runs read as independent (a seasonal residual carries its slot's and
        level's errors, shared for hours, which read as correlation; the rules account for the baseline's
        error on their own). A median of several days, so that yesterday's incident is outvoted, not learnt
        as today's noise. From a series' second day on; None: no run a day before."""
        times, logs, gaps = self.times, self.logs, self._partner_gaps
        at = times[index]
        partners: list[float] = []
        for day, day_s in _PARTNER_DAYS_S:  # once a run: no attribute or generator in the loop
            then = at - day_s
            # The partner is the first run from `then` less the tolerance (bisect_left(times, then - tolerance, 0,
            # index)), if it is within the tolerance after `then` too: mostly as many runs back as the last run asked
            # about found it, which it is when the run before it is earlier and it is not; searched otherwise.
            before = index - gaps[day]
            if 0 < before < index and times[before - 1] < then - tolerance <= times[before] <= then + tolerance:
                partners.append(logs[before])
                continue
            before = bisect_left(times, then - tolerance, 0, index)
            gaps[day] = index - before
            if before < index and times[before] <= then + tolerance:
                partners.append(logs[before])
        count = len(partners)
        if not count:
            return None
        partners.sort()  # median(partners), without the call
        half = count // 2
        middle = partners[half] if count % 2 else (partners[half - 1] + partners[half]) / 2.0
        return (logs[index] - middle) / _PARTNER_SCALE[count]

    def measured_noise(self) -> NoiseModel | None:
        """The noise of the history as a model would measure it, for words and pages (not the rules):
        None with under a day of seasonal residuals."""
        return self._seed_noise(len(self.times))

    def _seed_residuals(self, end: int) -> list[float]:
        """Residuals of the valid runs before `end` for a first noise model: seasonal residuals where the
        history has them, each day's minus that day's median (the level moves; the model must not
        mistake a week's drift for noise)."""
        values = self._seed_values(end)
        if len(values) < SEED_DAY_RUNS:
            return []
        seeded: list[float] = []
        for low in range(0, len(values), SEED_DAY_RUNS):
            seeded.extend(_less_median(values[low : low + SEED_DAY_RUNS]))
        return seeded

    def _seed_values(self, end: int) -> list[float]:
        return [r for r in self._residuals_between(0, end) if r == r] if self.rules.seasonal_days else []

    def _seed_noise(self, end: int) -> NoiseModel | None:
        """`noise_model.estimate(self._seed_residuals(end))`, None where those are none. The whole days
        fed for an earlier `end` are the same days now (a run's residual never changes, and the first
        run only moves at a trim), so the model goes on from them: the same updates in the same order.
        Every regression notice asks for this on a history of two weeks."""
        values = self._seed_values(end)
        if len(values) < SEED_DAY_RUNS:
            return None
        days = len(values) // SEED_DAY_RUNS
        kept = self._seed_days
        if kept is not None and kept[0] <= days:
            done, model = kept[0], kept[1].copy()
        else:
            done, model = 0, NoiseModel()
        whole_days: list[float] = []
        for day in range(done, days):
            whole_days += _less_median(values[day * SEED_DAY_RUNS : (day + 1) * SEED_DAY_RUNS])
        noise_model.extend(model, whole_days)
        self._seed_days = (days, model.copy())
        noise_model.extend(model, _less_median(values[days * SEED_DAY_RUNS :]))
        return model

    def _cusum_reference(self, period: int, rule: Cusum) -> _CusumReference | None:
        """The sequential rule's reference: the seasonal residuals of the `level_hours` before three-hour
        period number `period` (the one in which the excursion's first run falls). Computed once a period (or
        once per excursion), from the data alone. None until half that time is covered by runs with a seasonal
        baseline."""
        cached = self._cusum_references.get(period, _UNCACHED)
        if cached is not _UNCACHED:
            return cached  # type: ignore[return-value]
        end_s = period * CUSUM_REFERENCE_S
        low = bisect_left(self.times, end_s - self._level_s)
        high = bisect_left(self.times, end_s)
        result = None
        if high > low and self.times[low] <= end_s - self._level_s / 2:
            values = _valid(self._residuals_between(low, high))
            if len(values) >= max(MIN_BASELINE_RUNS, (high - low) // 2):
                level, sigma = median_and_sigma(values)
                sigma = max(sigma, SIGMA_FLOOR)
                # Per-run units: the allowance is half the smallest shift that matters; a run counts at
                # most `clip` sigmas beyond it either way, so a spike adds little.
                allowance = math.log(rule.shift_ratio) / 2.0 / sigma
                bound = allowance + rule.clip
                mean, factor = clipped_profile(values, center=level, sigma=sigma, bound=bound, block=rule.block_runs)
                result = _CusumReference(level, sigma, allowance, bound, mean, factor, len(values))
        self._cusum_references[period] = result
        if len(self._cusum_references) > 64:
            for old in sorted(self._cusum_references)[:-48]:
                del self._cusum_references[old]
        return result

    def _profile(self, end: int, baseline: _Baseline, bound: float, block: int) -> tuple[float, float]:
        """The clipped mean and the long-run factor of the reference runs' residuals before run `end`
        (the window rules' widening without the noise model)."""
        key = (end, bound, block)
        cached = self._profile_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        end_s = self.times[min(end, len(self.times) - 1)]
        low = bisect_left(self.times, end_s - self._level_s)
        values = _valid(self._residuals_between(low, end))
        profile = clipped_profile(values, center=baseline.level, sigma=baseline.sigma, bound=bound, block=block)
        self._profile_cache = (key, profile)
        return profile

    def _profile_decides(self, baseline: _Baseline, bound: float, block: int, limit: float) -> bool | None:
        """Whether `_profile`'s factor is at most `limit`, from running sums (window_sums.py) on a core
        stepped through a long series; None: `_profile` must tell (or the core is an `evaluate`'s)."""
        end = baseline.end
        if self._steps < 64 or self._reference_range[1] != end or baseline.reference is not self._reference_sorted:
            return None
        low, _high = self._reference_range
        sums = self._sums
        if sums is None or sums.block != block:
            sums = self._sums = WindowSums(block, low)
        if sums.end < end:
            sums.extend(self._residuals_between(sums.end, end))
        reference, sigma, center = baseline.reference, baseline.sigma, baseline.level
        low_clip, high_clip = center - bound * sigma, center + bound * sigma
        below, above = bisect_right(reference, low_clip), bisect_left(reference, high_clip)
        if len(reference) != end - low:
            return None
        factor_squared = sums.factor_squared(
            low, end, low_clip=low_clip, high_clip=high_clip, below=reference[:below], above=reference[above:]
        )
        return decide(factor_squared, limit)

    def _window(self, rule: Threshold, count: int) -> int:
        """Runs in `rule`'s window ending at valid run `count` - 1: `window_runs`, stretched back until
        it holds `min_probes` measured requests (at most `longest_window` runs)."""
        runs = rule.window_runs
        if rule.min_probes <= 0 or runs > count:
            return runs
        probes = self.probes
        # sum(probes[count - runs : count]): a run later, the one that joins added and the one that leaves taken off.
        kept = self._window_held
        if kept is not None and kept[0] == runs and kept[1] == count - 1:
            held = kept[2] + probes[count - 1] - probes[count - 1 - runs]
        elif kept is not None and kept[0] == runs and kept[1] == count:
            held = kept[2]
        else:
            held = sum(probes[count - runs : count])
        self._window_held = (runs, count, held)
        if held >= rule.min_probes:  # the usual case: no stretching, so no limit to work out
            return runs
        limit = min(rule.longest_window, count)
        while held < rule.min_probes and runs < limit:
            runs += 1
            held += probes[count - runs]
        return runs

    def _confirms(
        self,
        distance: float | None,
        rule: Threshold,
        log_ratio: float,
        baseline: _Baseline,
        baseline_ms: float,
        window: int,
        noise: NoiseModel | None,
    ) -> bool:
        # Cheapest test first: the spread (a MAD) is computed only for windows that are far enough out.
        if distance is None or distance < log_ratio:
            return False
        if baseline_ms * (math.exp(distance) - 1.0) < rule.min_delta_ms:
            return False
        # A window stretched to hold `min_probes` requests makes its median robust to single-probe noise,
        # but is judged as significant as `window_runs` runs only: load that comes and goes does not
        # average out over the extra runs (bench, AR(1) noise, 1 probe per run: z on the stretched
        # window measured 0.53 false pages a week, on `window_runs` 0.20).
        if noise is None:
            if self.rules.noise_model and rule is self.rules.page and not baseline.seasonal:
                return self._confirms_early_page(distance, rule, baseline, window)
            return self._confirms_without_model(distance, rule, baseline, window)
        # Autocorrelated noise (load that comes and goes) moves a window's median more than independent
        # noise would: the series' noise model widens the standard error by sqrt(g(window)).
        if baseline.seasonal:
            z_ok = not baseline.z_below(distance, _smaller(window, rule.window_runs), rule.z_threshold, noise)
            # A ticket's window must also be as far out as the rules without the model ask: over two hours the
            # model can measure less wander than the reference day's own long-run factor shows (its estimate
            # lags, and a drift the level follows is left out). Pages have the jump test beside this one.
            return z_ok and (
                rule is not self.rules.ticket or self._confirms_without_model(distance, rule, baseline, window)
            )
        # Against a trailing baseline (the first days), residuals carry the daily cycle, which the model
        # must not learn as noise: widen by the long-run factor of the trailing window's own runs, in
        # blocks of a sixth of them (when that is at least 6 runs: shorter blocks cannot tell load that
        # comes and goes from noise).
        if baseline.z_below(distance, _smaller(window, rule.window_runs), rule.z_threshold):
            return False
        z = baseline.z(distance, _smaller(window, rule.window_runs))
        if z < rule.z_threshold or self.rules.trailing_runs < 36:
            return z >= rule.z_threshold
        # Until then the series' noise is not known: assume it wanders (TRAILING_G).
        z /= math.sqrt(TRAILING_G)
        end = baseline.end
        _mean, factor = clipped_profile(
            self.logs[max(0, end - self.rules.trailing_runs) : end],
            center=baseline.level,
            sigma=baseline.sigma,
            bound=self.rules.cusum.clip if self.rules.cusum is not None else 2.5,
            block=self.rules.trailing_runs // 6,
        )
        return z / factor >= rule.z_threshold

    def _confirms_early_page(self, distance: float, rule: Threshold, baseline: _Baseline, window: int) -> bool:
        """The page window's z test against a trailing baseline (a series' first days), noise model on but
        not engaged (it learns from a series' second day on, and is engaged once it has measured wander).

        Without the model the window is widened by the long-run factor of the trailing window's own 36
        runs, in blocks of 6: on so few runs it often reads 1 where load comes and goes (bench/detector.py,
        AR(1) rows: most false pages in the first 3.5 days opened so, on day 1, with z 4.5-7). Here it is
        widened by the larger of that and the same factor pooled over the consecutive trailing-sized
        windows of the day before (`stats.pooled_factor`: each window less its own median, so the daily
        cycle between windows is not read as wander)."""
        if baseline.z_below(distance, _smaller(window, rule.window_runs), rule.z_threshold):
            return False
        z = baseline.z(distance, _smaller(window, rule.window_runs))
        span = self.rules.trailing_runs
        if z < rule.z_threshold or span < 36:
            return z >= rule.z_threshold
        bound = self.rules.cusum.clip if self.rules.cusum is not None else 2.5
        end = baseline.end
        own = self._trailing_factor(baseline, bound)
        pooled = pooled_factor(
            self.logs[max(0, end - EARLY_PAGE_HISTORY_RUNS) : end],
            span=span,
            sigma=baseline.sigma,
            bound=bound,
            block=span // 6,
        )
        return z / max(own, pooled) >= rule.z_threshold

    def _run_is_slow(self, recent: list[float], baseline: _Baseline) -> bool:
        """Whether the run itself is at least halfway (in log) to the page ratio above the baseline.

        A page window's median stays high for as many runs as the window is long after a burst of slow
        runs ends (a window of 5 holding a burst of 3), so the window alone confirms a burst as often as
        a regression; a run that is itself back near the baseline breaks the streak. A step keeps its
        runs slow: doublings page as fast as before (bench/detector.py `bursts`, docs/detection.md)."""
        return recent[-1] - baseline.level >= PAGE_RUN_SHARE * self._log_page_ratio

    def _slow_runs(self, recent: list[float], baseline: _Baseline, most: int) -> int:
        """How many of the `recent` runs in a row are slow against this run's baseline (as `noise_model.observe`
        judges a run: at least the page ratio above its level), counting up to `most`."""
        floor = baseline.level + self._log_page_ratio
        count = 0
        for index in range(len(recent) - 1, max(-1, len(recent) - 1 - most), -1):
            if recent[index] < floor:
                break
            count += 1
        return count

    def _streak_end(self, count: int, streak_since: datetime | None) -> int:
        """Where the runs tested ended for a page streak's first run (`count`, the runs so far, without one)."""
        return count if streak_since is None else min(count, bisect_left(self.times, streak_since.timestamp()) + 1)

    def _jumps(
        self,
        baseline: _Baseline,
        distance: float,
        window: int,
        recent: list[float],
        baseline_ms: float,
        count: int,
        streak_since: datetime | None,
    ) -> bool:
        """The page rule's jump test (noise model on): the median of the last runs (a majority of the page
        window: window // 2 + 1 runs) less that of the page window before them, against how much such neighbours
        of the three days before differ (their MAD-sigma). Load that wanders slowly moves neighbours alike, so a
        doubling stands out within a few runs however far the series wanders from its baseline, and however
        young its noise model is; the page window must still be `page.ratio` and `min_delta_ms` above the
        baseline. While a streak builds, the window before and the day stay where they were for its first
        run, so the runs after the jump fill the short window and its confirmations follow at once. `distance`,
        `window` and `recent`: the verdict's page distance, page window and last runs (`_Verdict`)."""
        rule = self.rules.page
        if distance < self._log_page_ratio or baseline_ms * (math.exp(distance) - 1.0) < rule.min_delta_ms:
            return False
        end = self._streak_end(count, streak_since) - window
        if end <= 0:
            return False
        after = window // 2 + 1
        # Seasonal residuals where the windows have them (the daily cycle left out), else log TTFTs.
        seasonal = baseline.seasonal
        low = max(0, end - noise_model.JUMP_HISTORY_RUNS)
        history = None
        first = end - window if end > window else 0
        if not seasonal:
            before = self.logs[first:end]
        elif low >= self._eager_from:  # every residual computed: the window before alone (most runs stop at it)
            before = self._residuals[first:end]  # type: ignore[assignment]  # none is None from here
        else:
            history = self._residuals_between(low, end)
            before = history[-window:]
        if any(math.isnan(value) for value in before):
            return False
        level_before = median(before)
        # The run itself must have jumped too, from the window before (not from a baseline that slow wander
        # may be far from): a burst that is over breaks the streak, as the window test's run test does.
        if recent[-1] - level_before < PAGE_RUN_SHARE * self._log_page_ratio:
            return False
        if history is None:
            history = self._residuals_between(low, end) if seasonal else self.logs[low:end]
        spread = self._jump_spread(history, low, window, after, seasonal)
        if spread is None:
            return False
        jump = median(recent[-after:]) - level_before
        return jump / max(spread, SIGMA_FLOOR) >= rule.z_threshold

    def _jump_spread(self, history: list[float], low: int, window: int, after: int, seasonal: bool) -> float | None:
        """noise_model.jump_spread(history, window, after=after) for `history`, runs low.. of the residuals (or the
        log TTFTs, not `seasonal`). The jump test asks for it on slow runs in a row, the day before shifted by a
        run or a few: the jumps of the last call are kept in time order and sorted, and where no run in the
        history lacks a value, those that leave are taken out of the sorted ones and those that join put in,
        rather than all sorted again (their median and MAD-sigma depend only on which they are)."""
        medians = self._jump_medians(history, low, window, seasonal)
        after_medians = self._jump_medians(history, low, after, seasonal)
        # No nan in the history: log TTFTs, or residuals past the last nan stepped (`_nan_from`).
        clean = not seasonal or (low >= self._eager_from and self._nan_from < low)
        if not clean:
            self._spread_kept = None
            return noise_model.jump_spread(history, window, medians, after=after, after_medians=after_medians)
        pairs = max(0, len(history) - window - after + 1)  # the jumps of windows starting at low .. low + pairs - 1
        kept = self._spread_kept
        if (
            kept is not None
            and kept[1:4] == (window, after, seasonal)
            and kept[0] <= low
            and kept[0] + len(kept[4]) <= low + pairs
            and (low - kept[0]) + (low + pairs - kept[0] - len(kept[4])) <= 64
        ):
            kept_low, _window, _after, _seasonal, in_order, data = kept
            for value in in_order[: low - kept_low]:
                del data[bisect_left(data, value)]
            joining = range(kept_low + len(in_order) - low, pairs)
            joined = [after_medians[start + window] - medians[start] for start in joining]
            for value in joined:
                insort(data, value)
            in_order = in_order[low - kept_low :] + joined
        else:
            in_order = list(map(sub, after_medians[window : window + pairs], medians[:pairs]))
            data = sorted(in_order)
        self._spread_kept = (low, window, after, seasonal, in_order, data)
        if len(data) < noise_model.JUMP_PAIRS_PER_RUN * window:
            return None
        # median_and_sigma(jumps)[1]: the MAD-sigma about their median, from the sorted jumps.
        return mad_sigma_sorted(data, center=median(data, presorted=True))

    def _jump_medians(self, history: list[float], low: int, window: int, seasonal: bool) -> array[float]:
        """noise.window_medians of `history` (runs low.. of the residuals, or of the log TTFTs). The jump
        test asks for them on every slow run, the day before shifted by a run or so: the medians of the last
        call are kept with the index of their first window's first run (the data at an index never changes
        until a trim moves them), and those still asked for are reused as one slice. Kept as doubles: an even
        window's median is a new float (32 bytes in a list, 8 here; an odd one's is a run's own, 8 either way),
        and three days of them are kept for each series that had a slow run: when every series slows at once,
        every series (a one-probe job's windows of 10 and 6: 29 -> 16 kB a series, tracemalloc)."""
        wanted = max(0, len(history) - window + 1)  # windows whose first run is low .. low + wanted - 1
        kept = self._jump_cache.get((window, seasonal))
        if kept is not None and kept[0] <= low <= kept[0] + len(kept[1]):
            skip = low - kept[0]
            out = kept[1][skip : skip + wanted]
        else:
            out = array("d")
        if len(out) < wanted:
            out.extend(noise_model.window_medians(history[len(out) :], window))
        self._jump_cache[(window, seasonal)] = (low, out)
        return out

    def _confirms_without_model(self, distance: float, rule: Threshold, baseline: _Baseline, window: int) -> bool:
        """The z test without the noise model (`detection.noise_model: false`)."""
        if baseline.z_below(distance, _smaller(window, rule.window_runs), rule.z_threshold):
            return False
        z = baseline.z(distance, _smaller(window, rule.window_runs))
        cusum = self.rules.cusum
        if z < rule.z_threshold or cusum is None:
            return z >= rule.z_threshold
        # Autocorrelated noise (load that comes and goes) moves a window's median more than independent
        # noise would: widen the standard error by the long-run factor of the reference's residuals.
        # Against a trailing baseline, of its own runs, in blocks of a sixth of them (when that is at
        # least 6 runs: shorter blocks cannot tell load that comes and goes from noise).
        if baseline.seasonal:
            decided = self._profile_decides(baseline, cusum.clip, cusum.block_runs, z / rule.z_threshold)
            if decided is not None:
                return decided
            _mean, factor = self._profile(baseline.end, baseline, cusum.clip, cusum.block_runs)
        elif self.rules.trailing_runs < 36:
            factor = 1.0
        else:
            factor = self._trailing_factor(baseline, cusum.clip)
        return z / factor >= rule.z_threshold

    def _trailing_factor(self, baseline: _Baseline, bound: float) -> float:
        """The long-run factor of a trailing baseline's own runs, in blocks of a sixth of them."""
        span = self.rules.trailing_runs
        end = baseline.end
        _mean, factor = clipped_profile(
            self.logs[max(0, end - span) : end],
            center=baseline.level,
            sigma=baseline.sigma,
            bound=bound,
            block=span // 6,
        )
        return factor

    def _verdict(self, incident: Incident | None, count: int, streak_since: datetime | None) -> _Verdict | None:
        """The baseline and each window's distance from it; None: no verdict (`_verdict_parts`)."""
        parts = self._verdict_parts(incident, count, streak_since)
        return None if parts is None else _Verdict(*parts)

    def _verdict_parts(
        self, incident: Incident | None, count: int, streak_since: datetime | None
    ) -> _VerdictParts | None:
        """The baseline and each window's distance from it, `_Verdict`'s fields in its order; None: no verdict.

        While a page streak builds (`streak_since`: its first confirming run), the reference stays where
        it was for that first run: the runs confirming a regression must not enter the baseline they
        are tested against, or a slowdown early in a series' history (a trailing baseline of a few
        runs) becomes its own baseline before it is confirmed often enough to page. Ticket streaks are
        left alone: their seasonal reference is days long, and freezing it for them measured 15% more
        false alerts (bench/detector.py, sigma 0.3) for no gain in pages.
        """
        rules = self.rules
        page, ticket_rule = rules.page, rules.ticket
        # `_window`'s answer without the call when no stretching is asked for (the ticket rule by default).
        page_w = page.window_runs if page.min_probes <= 0 else self._window(page, count)
        ticket_w = ticket_rule.window_runs if ticket_rule.min_probes <= 0 else self._window(ticket_rule, count)
        # max(page_w, ticket_w, rules.clear_runs), at most `count`, and the max() and min() below spelt out (the
        # same comparisons): each of those calls costs more than the rest of its line, once a run.
        longest = ticket_w if ticket_w > page_w else page_w
        if rules.clear_runs > longest:
            longest = rules.clear_runs
        if longest > count:
            longest = count
        onset = bisect_left(self.times, incident.since.timestamp()) if incident is not None else count
        # The reference ends as it did for the streak's first run (`at` runs counted then), at the latest.
        at = count if streak_since is None else self._streak_end(count, streak_since)
        baseline = None
        adapted = False
        slot = self._run_slot
        if slot is not None:
            low = count - longest
            if low >= self._eager_from:
                # `_residuals_between` without the call where every residual is computed (a stepped core's runs),
                # and no nan in them when the last nan stepped is before them (a sum of them, once a run, is not).
                residuals: list[float] = self._residuals  # type: ignore[assignment]  # none is None from `_eager_from` on
                recent = residuals[low:count]
                whole = self._nan_from < low
            else:
                recent = self._residuals_between(low, count)
                total = sum(recent)
                whole = total == total
            if whole:  # no nan: every run in the windows has a seasonal baseline
                # The reference ends before the windows tested, and before an open regression began,
                # so a regression never becomes its own baseline.
                end = at - longest if at - longest > 0 else 0
                baseline = self._seasonal(slot, onset if onset < end else end)
                if baseline is None and onset < end:
                    baseline, adapted = self._seasonal(slot, end), True
        if baseline is None:
            # The reference ends before the windows tested: the ticket window too when it gives a verdict
            # (seasonal baseline off, enough runs), else the page window; never before the first run.
            tested = ticket_w if rules.seasonal_days == 0 and count >= ticket_w else page_w
            end = max(0, at - tested)
            baseline = self._trailing(min(end, onset))
            if baseline is None and onset < end:
                baseline, adapted = self._trailing(end), True
            if baseline is None:
                return None
            recent = self.logs[count - longest :]
        level = baseline.level
        # Against a trailing window the daily cycle alone looks like a moderate shift: tickets need the
        # seasonal baseline, unless it is switched off.
        ticket = None
        if count >= ticket_w and (baseline.seasonal or rules.seasonal_days == 0):
            # median(recent[-ticket_w:]), without the call. A run later the window is the one before less its first
            # run and with this one: kept sorted, the one out and the one in. The same instructions as a sort of 24
            # values, but a sort's comparisons branch at random: 0.4 to 0.6 us a run less (a 20 us run). Its runs
            # are residuals against a seasonal baseline, else log TTFTs (never nan: a seasonal baseline's windows
            # hold none), and the value at an index never changes (a trim, which moves them, forgets it).
            seasonal = baseline.seasonal
            kept = self._ticket_sorted
            if kept is not None and kept[0] == count - 1 and kept[1] == ticket_w and kept[2] is seasonal:
                window = kept[3]
                runs: list[float] = self._residuals if seasonal else self.logs  # type: ignore[assignment]
                del window[bisect_left(window, runs[count - 1 - ticket_w])]
                insort(window, runs[count - 1])
            else:
                window = sorted(recent if len(recent) == ticket_w else recent[-ticket_w:])
            self._ticket_sorted = (count, ticket_w, seasonal, window)
            half = len(window) // 2
            ticket = (window[half] if len(window) % 2 else (window[half - 1] + window[half]) / 2.0) - level
        window = sorted(recent[-page_w:])
        half = len(window) // 2
        distance = (window[half] if len(window) % 2 else (window[half - 1] + window[half]) / 2.0) - level
        return baseline, distance, ticket, recent, adapted, page_w, ticket_w

    # ------------------------------------------------ SLO

    def _slo(self, state: SeriesState, run: RunPoint, events: list[Event]) -> None:
        if self.slo_ms is None:
            return
        rules = self.rules
        window = rules.ticket.window_runs
        if len(self.logs) < window:
            return
        observed = math.exp(median(self.logs[-window:]))
        ratio = observed / self.slo_ms
        detail = {"slo_ms": self.slo_ms, "window_runs": window}
        incident = state.incidents.get("slo")
        if incident is None:
            if observed > self.slo_ms:
                state.slo_streak += 1
                state.slo_since = state.slo_since or run.at
            else:
                state.slo_streak, state.slo_since = 0, None
            if state.slo_streak >= rules.ticket.confirmations:
                incident = Incident(
                    kind="slo",
                    severity="ticket",
                    opened_at=run.at,
                    since=state.slo_since or run.at,
                    baseline_ms=self.slo_ms,
                    observed_ms=observed,
                    ratio=ratio,
                )
                incident.see(ratio, run.at)
                state.incidents["slo"] = incident
                events.append(_event(incident, "open", run.at, detail))
            return
        incident.see(ratio, run.at)
        if observed < self.slo_ms / rules.clear_ratio:
            del state.incidents["slo"]
            state.slo_streak, state.slo_since = 0, None
            resolved = Incident(
                kind="slo",
                severity=incident.severity,
                opened_at=incident.opened_at,
                since=incident.since,
                baseline_ms=self.slo_ms,
                observed_ms=observed,
                ratio=ratio,
                peak_ratio=incident.peak_ratio,
                peak_at=incident.peak_at,
            )
            detail["duration_s"] = (run.at - incident.opened_at).total_seconds()
            events.append(_event(resolved, "resolve", run.at, detail, resolved=True))


def _smaller(first: int, second: int) -> int:
    """min(first, second), spelt out: min() parses its arguments as keywords, at several times the cost."""
    return second if second < first else first


def residual_reach_s(rules: Rules) -> float:
    """How far before its run a run's seasonal residual reaches (at most): the windows of its slot on each
    of the `seasonal_days` days before (`_Core._slot`), a slot's width of rounding and the half window."""
    return rules.seasonal_days * DAY_S + rules.seasonal_window_minutes * 60.0 + SLOT_S


def _trailing(counts: list[int]) -> int:
    """How many of the last counts are zero in a row (a streak of runs without a success, or an error)."""
    streak = 0
    for value in reversed(counts):
        if value:
            break
        streak += 1
    return streak


def _lookback_s(rules: Rules) -> float:
    """How much further back than the `history_runs`-th last run the level and seasonal baselines read."""
    if not rules.seasonal_days:
        return 0.0
    return rules.level_hours * 3600.0 + rules.seasonal_days * DAY_S + rules.seasonal_window_minutes * 60.0 + 2 * SLOT_S


def _valid(residuals: list[float]) -> list[float]:
    """The residuals that are not nan (runs whose slot has a seasonal baseline). Nearly always all of a
    day's: a sum (in C) finds that out in a fifth of the time a filtering comprehension takes."""
    total = sum(residuals)
    return residuals if total == total else [r for r in residuals if r == r]


def _less_median(values: list[float]) -> list[float]:
    """Each value less the median of them all (none of none)."""
    if not values:
        return []
    level = median(values)
    return [v - level for v in values]


def _dominant_error(runs: Iterable[tuple[int, int, str | None]]) -> str:
    counts: Counter[str] = Counter()
    for _ok, errors, error in runs:
        if errors:
            counts[error or UNKNOWN_ERROR] += errors
    return counts.most_common(1)[0][0] if counts else UNKNOWN_ERROR


def _event(
    incident: Incident, action: Action, at: datetime, detail: dict[str, Any], *, resolved: bool = False
) -> Event:
    return Event(
        kind=incident.kind,
        action=action,
        severity=incident.severity,
        at=at,
        opened_at=incident.opened_at,
        resolved_at=at if resolved else None,
        baseline_ms=incident.baseline_ms,
        observed_ms=incident.observed_ms,
        ratio=incident.ratio,
        error=incident.error,
        detail={"since": incident.since.isoformat(), **detail},
        peak_ratio=incident.peak_ratio,
        peak_at=incident.peak_at,
    )
