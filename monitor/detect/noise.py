"""A per-series noise model: how far a series' residuals wander, and for how long. Pure.

The runs of a healthy series are not independent: load comes and goes. A sum of n residuals then varies
g(n) times more than n independent ones would, and every rule must ask for g(n) times more evidence
(in variance) before it believes a shift. What the model is fed (`core.py`, `_Core._day_difference`):
each run's log TTFT less the median of the runs at its time of day on the days before, scaled to one
run's spread. No estimated baseline is in it (a baseline is off by the same amount for hours, which
would read as correlation on independent runs; the rules account for the baseline's error on their
own), and the daily cycle cancels. The rules scale their evidence by the model only when it is
`engaged`: runs measured clearly more alike than independent ones on its variogram (residuals 3 hours
apart differ more than neighbours do), which an undetected step hardly moves; elsewhere they run as
without the model.

The model keeps, online and in a few numbers of the stored state, exponentially weighted estimates
of the per-run variance and of the variance of block means over `BLOCKS` (6 and 36 runs: half an hour
and three hours at 5-minute runs), from residuals winsorised against the model's own scale. From
the two ratios g(6) and g(36) it fits "white noise plus an AR(1) process" (share `w` of the
variance, coefficient `phi`), which gives g(n) for any n, the long-run variance g(inf) and a
correlation time to say in words.

Bounded against a regression feeding itself: the caller stops updating while an incident is open, a
page or ticket streak builds or the CUSUM is past half its threshold (`core.py`), and each update can
raise a variance by at most a factor 1 + alpha (WINSOR^2 - 1) (alpha: the update's weight; after the
first week 1/2016 per run and 36/2016 per 3-hour block): a 12-hour step that slips past every rule
raises g(36) by at most (1 + 36/2016 * 5.25)^4 = 1.45x, and g is never above G_MAX.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat, starmap
from math import inf, sqrt
from operator import add, itemgetter, sub, truediv
from typing import Any

from monitor.detect.stats import median, median_and_sigma

BLOCKS = (6, 36)
_SHORT, _LONG = BLOCKS
# Updates weigh 1/n until n reaches this many runs (a week of 5-minute runs), then stay at 1/HORIZON.
HORIZON_RUNS = 2016
# An update's weight from then on, and what it leaves of the estimate before (the same floats as worked out).
_HORIZON_ALPHA = 1.0 / HORIZON_RUNS
_HORIZON_KEEP = 1.0 - _HORIZON_ALPHA
# Residuals and block means are clipped at this many of the model's own standard deviations.
WINSOR = 2.5
# g (variance of a mean over that of independent runs) is kept within [1, G_MAX].
G_MAX = 400.0
# Until a block size has this many blocks, its ratio is shrunk towards PRIOR_RATIOS: a series whose
# noise is not known yet is assumed to wander somewhat (a little slower on independent noise for its
# first day or two, instead of false alerts on correlated noise).
PRIOR_BLOCKS = 4.0
PRIOR_RATIOS = (1.2, 2.0)
# A streak of at most this many slow runs (residual above the page ratio) that recovers is a burst.
BURST_RUNS = 6
# ... and are followed by this many runs in a row under the clearing ratio.
RECOVERED = 3
# A burst's length is remembered, fading by this factor per run (half in about 2.4 days).
BURST_FADE = 0.9997
# The horizon of `long_run`: 12 hours of 5-minute runs.
LONG_RUNS = 144
# Below this many runs, residuals are not clipped (no scale yet).
MIN_RUNS = 12
# Engagement is decided on the variogram of the residuals: half the mean square difference of residuals
# VARIO_LAG runs apart over that of neighbours (1 for independent runs, 1.10 for 10% of the variance AR(1)
# with phi 0.9, 1.27 for 30% with phi 0.97, 1.33 for half with phi 0.5). A step moves only the differences
# that straddle its edges (VARIO_LAG pairs each), so an undetected step hardly moves it, where it inflates
# every block variance for as long as it lasts.
VARIO_LAG = 36
# Until this many pairs of each lag are in, the variogram ratio is shrunk towards 1 (not engaged).
VARIO_PRIOR_PAIRS = 288.0
_PHI_MAX = 0.995
_PHI_COARSE = (*(i / 40.0 for i in range(1, 40)), _PHI_MAX)
# The CUSUM's threshold, measured against how the series' own sum has behaved (`tail_multiplier`):
# `NoiseModel.tail`: weeks watched, excursions past TAIL_FROM, of them those that ended below the threshold, their
# summed excess over TAIL_FROM (each fading over TAIL_WEEKS), the current excursion's peak, the weeks watched
# since the last excursion ended (not yet folded in) and the multiplier worked out then.
TAIL_FIELDS = 7
TAIL_FROM = 0.5  # excursions are counted from half the threshold (where, too, the model stops learning)
TAIL_WEEKS = 4.0  # what was seen fades over this many weeks
# Until the series has shown its own, it is taken to behave as the derivation says: TAIL_PRIOR_WEEKS of
# excursions that reach the threshold at exactly its share of the rate, their excess falling off as
# exp(-TAIL_PRIOR_DECAY x) (in units of the threshold). The bench's series fall off at 2-3.5 (one probe a run,
# independent or ar:0.9:0.1, 4 excursions a week past half); 3 instead of 6 cut false alerts a little more on
# them (0.68 against 0.71 a week) for +20% steps caught later (538 against 485 minutes), so the prior stays fast.
TAIL_PRIOR_WEEKS = 0.5
TAIL_PRIOR_DECAY = 6.0
TAIL_MOST = 2.5  # the threshold is raised at most this much (and never lowered)
# An excursion that fired is counted (where it fired: censored) only if the incident it opened cleared within
# this long: wander, as far as the CUSUM is concerned. A regression lasts longer, and counting it would raise
# the threshold of a series for being caught (on the bench's series with steps, +10% steps caught 75% -> 56%
# of the time with one probe a run, 75% -> 69% with five, counting every one; the bench's steps last 6-36
# hours, the wander of its slowest AR(1), phi 0.97 at 5-minute runs, about 3 hours).
TAIL_WANDER_S = 4 * 3600.0


@dataclass(slots=True)
class NoiseModel:
    """Online estimate of one series' residual scale and autocorrelation (see the module's doc)."""

    runs: int = 0
    mean: float = 0.0  # of the winsorised residuals (log units)
    var: float = 0.0  # per run
    sums: list[float] = field(default_factory=lambda: [0.0] * len(BLOCKS))  # the block being filled
    counts: list[int] = field(default_factory=lambda: [0] * len(BLOCKS))
    blocks: list[int] = field(default_factory=lambda: [0] * len(BLOCKS))  # completed blocks
    block_var: list[float] = field(default_factory=lambda: [0.0] * len(BLOCKS))  # of block means x block size
    share: float = 0.0  # fitted: the AR(1) share of the variance, 0..1
    phi: float = 0.0  # fitted: its coefficient per run
    slow: int = 0  # slow runs in the current streak
    calm: int = 0  # runs in a row back near the baseline since it
    burst: float = 0.0  # the longest recent burst of slow runs that recovered, fading
    run: int = 0  # slow runs in a row, ending at the last run
    longest: int = 0  # the most slow runs in a row in the current streak
    lagged: list[float] = field(default_factory=list)  # the last VARIO_LAG (winsorised) residuals
    vario: list[float] = field(default_factory=lambda: [0.0, 0.0])  # semivariance at lag 1 and VARIO_LAG
    pairs: list[int] = field(default_factory=lambda: [0, 0])
    # The CUSUM's own excursions, measured against its threshold (`tail_multiplier`; TAIL_FIELDS says what each is).
    tail: list[float] = field(default_factory=lambda: fresh_tail())

    @property
    def sd(self) -> float:
        """The per-run standard deviation of the residuals (log units), 0 before any run."""
        return math.sqrt(self.var)

    def ratio(self, index: int) -> float:
        """The measured g of BLOCKS[index], shrunk towards 1 while few blocks are in."""
        prior = PRIOR_RATIOS[index]
        if self.var <= 0 or self.blocks[index] == 0:
            return prior
        measured = min(G_MAX, max(1.0, self.block_var[index] / self.var))
        blocks = self.blocks[index]
        return (blocks * measured + PRIOR_BLOCKS * prior) / (blocks + PRIOR_BLOCKS)

    def g(self, n: float) -> float:
        """How many times more a mean of n consecutive residuals varies than one of n independent ones."""
        return _variance_ratio_cached(self.share, self.phi, n)

    @property
    def vario_ratio(self) -> float:
        """The semivariance at VARIO_LAG runs over that at 1 run, shrunk towards 1 while few pairs are in: 1
        for independent runs with or without a step, above 1 when neighbouring runs are alike."""
        if self.vario[0] <= 0 or self.pairs[1] == 0:
            return 1.0
        measured = self.vario[1] / self.vario[0]
        measured = measured if measured < G_MAX else G_MAX  # min(G_MAX, measured), once a run
        pairs = self.pairs[1]
        return (pairs * measured + VARIO_PRIOR_PAIRS) / (pairs + VARIO_PRIOR_PAIRS)

    @property
    def long_run(self) -> float:
        """g over LONG_RUNS runs: the long-run variance over the per-run variance, at the horizon over
        which the CUSUM adds up evidence (a fit's g(inf) extrapolates from 3-hour blocks far too far)."""
        return self.g(LONG_RUNS)

    def effective_runs(self, n: int) -> float:
        """How many independent runs `n` consecutive runs are worth."""
        return n / self.g(n) if n > 0 else 0.0

    def correlation_minutes(self, interval_s: float) -> float:
        """The e-folding time of an AR(1) with the same long-run variance: "runs correlate for about"."""
        ratio = self.long_run
        if ratio <= 1.0 + 1e-9:
            return 0.0
        phi = (ratio - 1.0) / (ratio + 1.0)
        return -interval_s / math.log(phi) / 60.0

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "mean": self.mean,
            "var": self.var,
            "sums": list(self.sums),
            "counts": list(self.counts),
            "blocks": list(self.blocks),
            "block_var": list(self.block_var),
            "share": self.share,
            "phi": self.phi,
            "slow": self.slow,
            "calm": self.calm,
            "burst": self.burst,
            "run": self.run,
            "longest": self.longest,
            "lagged": list(self.lagged),
            "vario": list(self.vario),
            "pairs": list(self.pairs),
            "tail": list(self.tail),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoiseModel:
        def floats(key: str) -> list[float]:
            values = [float(v) for v in data.get(key, [])]
            return values if len(values) == len(BLOCKS) else [0.0] * len(BLOCKS)

        def ints(key: str) -> list[int]:
            values = [int(v) for v in data.get(key, [])]
            return values if len(values) == len(BLOCKS) else [0] * len(BLOCKS)

        return cls(
            runs=int(data.get("runs", 0)),
            mean=float(data.get("mean", 0.0)),
            var=max(0.0, float(data.get("var", 0.0))),
            sums=floats("sums"),
            counts=ints("counts"),
            blocks=ints("blocks"),
            block_var=floats("block_var"),
            share=min(1.0, max(0.0, float(data.get("share", 0.0)))),
            phi=min(_PHI_MAX, max(0.0, float(data.get("phi", 0.0)))),
            slow=max(0, int(data.get("slow", 0))),
            calm=max(0, int(data.get("calm", 0))),
            burst=max(0.0, float(data.get("burst", 0.0))),
            run=max(0, int(data.get("run", 0))),
            longest=max(0, int(data.get("longest", 0))),
            lagged=[float(v) for v in data.get("lagged", [])][-VARIO_LAG:],
            vario=_pair(data.get("vario"), float),
            pairs=_pair(data.get("pairs"), int),
            tail=_tail(data.get("tail")),
        )

    def copy(self) -> NoiseModel:
        return NoiseModel(
            self.runs,
            self.mean,
            self.var,
            list(self.sums),
            list(self.counts),
            list(self.blocks),
            list(self.block_var),
            self.share,
            self.phi,
            self.slow,
            self.calm,
            self.burst,
            self.run,
            self.longest,
            list(self.lagged),
            list(self.vario),
            list(self.pairs),
            list(self.tail),
        )


def _tail(values: Any) -> list[float]:
    """A stored `tail`, or a fresh one where it is missing (a model stored before it existed) or unusable."""
    try:
        tail = [float(v) for v in values]
    except (TypeError, ValueError):
        return fresh_tail()
    if len(tail) != TAIL_FIELDS or not all(math.isfinite(v) and v >= 0.0 for v in tail):
        return fresh_tail()
    tail[6] = min(TAIL_MOST, max(1.0, tail[6]))
    return tail


def _pair(values: Any, kind: Any) -> list[Any]:
    """Two non-negative numbers from stored state; zeros when missing or malformed (a model stored before)."""
    if not isinstance(values, list) or len(values) != 2:
        return [kind(0), kind(0)]
    return [max(kind(0), kind(v)) for v in values]


def _weight(count: int, horizon: float) -> float:
    # 1 / max(1.0, min(float(count), horizon)), the min() and max() spelt out (the same comparisons): min() and
    # max() parse their arguments as keywords, at several times the cost of the rest.
    span = float(count)
    span = horizon if horizon < span else span
    return 1.0 / (span if span > 1.0 else 1.0)


def update(model: NoiseModel, residual: float, *, deferred_fit: bool = False) -> bool:
    """Add one residual (log units) to `model`, in place. True when it completed a block that refits the
    model's share and phi; with `deferred_fit` that is the caller's to do (`extend`: no update reads them)."""
    # Once a run for every series: the model's fields are read into locals and written back, min / max and
    # `_weight` spelt out (the same comparisons, so the same floats), the weights past the horizon constants.
    runs = model.runs = model.runs + 1
    if runs == 1:
        model.mean = residual
    mean, var = model.mean, model.var
    if runs > MIN_RUNS and var > 0:  # sqrt(var) > 0
        reach = WINSOR * sqrt(var)
        low = mean - reach
        if not residual > low:  # max(low, residual)
            residual = low
        high = mean + reach
        if not residual < high:  # min(high, ...)
            residual = high
    deviation = residual - mean
    if runs >= HORIZON_RUNS:
        model.mean = mean = mean + _HORIZON_ALPHA * deviation
        model.var = var = _HORIZON_KEEP * (var + _HORIZON_ALPHA * deviation * deviation)
    else:
        alpha = 1.0 / runs  # _weight(runs, HORIZON_RUNS), runs >= 1
        model.mean = mean = mean + alpha * deviation
        if runs > 1:
            model.var = var = (1.0 - alpha) * (var + alpha * deviation * deviation)
    # The semivariances: the differences of the (winsorised) residual from the residual before it and from the
    # one VARIO_LAG runs before it (the first of the VARIO_LAG kept), each clipped at WINSOR x sqrt(2 var) too.
    lagged = model.lagged
    held = len(lagged)
    if held:
        bound = WINSOR * sqrt(2.0 * var) if runs > MIN_RUNS and var > 0 else inf
        vario, pairs = model.vario, model.pairs
        difference = abs(residual - lagged[-1])
        if not difference < bound:  # min(bound, ...)
            difference = bound
        count = pairs[0] = pairs[0] + 1
        alpha = _HORIZON_ALPHA if count >= HORIZON_RUNS else 1.0 / count
        before = vario[0]
        vario[0] = before + alpha * (difference * difference / 2.0 - before)
        if held >= VARIO_LAG:  # then exactly VARIO_LAG are kept
            difference = abs(residual - lagged[0])
            if not difference < bound:
                difference = bound
            count = pairs[1] = pairs[1] + 1
            alpha = _HORIZON_ALPHA if count >= HORIZON_RUNS else 1.0 / count
            before = vario[1]
            vario[1] = before + alpha * (difference * difference / 2.0 - before)
            del lagged[0]
    lagged.append(residual)
    # Both blocks (BLOCKS: the short one, then the long one) take the residual, spelt out for the two of them
    # as `fit` is; most runs complete neither.
    sums, counts = model.sums, model.counts
    sums[0] += residual
    sums[1] += residual
    short = counts[0] = counts[0] + 1
    long = counts[1] = counts[1] + 1
    if short < _SHORT and long < _LONG:
        return False
    refit = False
    if short >= _SHORT:
        refit = _complete_block(model, 0, _SHORT, mean, var)
    if long >= _LONG:
        refit = _complete_block(model, 1, _LONG, mean, var) or refit
    if refit and not deferred_fit:
        model.share, model.phi = fit(model.ratio(0), model.ratio(1), near=model.phi)
    return refit


def _complete_block(model: NoiseModel, index: int, size: int, mean: float, var: float) -> bool:
    """Fold the block of BLOCKS[index] (`size` runs) just filled into its variance; whether that refits."""
    sums, blocks, block_var = model.sums, model.blocks, model.block_var
    block_mean = sums[index] / size
    sums[index], model.counts[index] = 0.0, 0
    done = blocks[index] = blocks[index] + 1
    # Block means vary as g(size) x var / size; clip the deviation at WINSOR of that.
    spread = math.sqrt((var if var > block_var[index] else block_var[index]) / size)  # max(block_var[index], var)
    deviation = block_mean - mean
    if done > PRIOR_BLOCKS and spread > 0:
        # min(WINSOR * spread, max(-WINSOR * spread, deviation)), spelt out as in `update`
        deviation = deviation if deviation > -WINSOR * spread else -WINSOR * spread
        deviation = deviation if deviation < WINSOR * spread else WINSOR * spread
    beta = _weight(done, HORIZON_RUNS / size)
    sample = size * deviation * deviation
    block_var[index] = sample if done == 1 else (1 - beta) * block_var[index] + beta * sample
    # Refit when a long block completes (short blocks alone until the first one): the fit moves slowly.
    return index == len(BLOCKS) - 1 or blocks[-1] == 0


def observe(model: NoiseModel, *, slow: bool, calm: bool) -> None:
    """Follow streaks of slow runs (above the page ratio). A streak followed by RECOVERED runs in a row
    back near the baseline (`calm`: under the clearing ratio) is a burst if it held at most BURST_RUNS
    slow runs, and pages must outlast the longest recent one: its most slow runs in a row (a burst is
    slow runs in a row; the noisier runs of a mild step cross the page ratio one at a time, now and then,
    and must not make pages slower). Called on every run, frozen or not: a regression does not recover,
    and the runs of a step that hover around the page ratio are not calm, so neither counts as a burst."""
    model.burst *= BURST_FADE
    if slow:
        model.slow += 1
        model.run += 1
        model.longest = max(model.longest, model.run)
        model.calm = 0
        return
    model.run = 0
    if not model.slow:
        return
    model.calm = model.calm + 1 if calm else 0
    if model.calm >= RECOVERED:
        if model.slow <= BURST_RUNS:
            model.burst = max(model.burst, float(model.longest))
        model.slow = model.calm = model.longest = 0


# A page must outlast a burst of at least this many slow runs in a row, measured or not (a series' first
# burst pages before any is measured otherwise) ...
BURST_DEFAULT = 3
# ... and of at most this many: 5 slow runs in a row (25 minutes at 5-minute runs) always page.
PERSIST_MOST = 5


def page_persistence(model: NoiseModel, *, window: int) -> int:
    """Slow runs in a row (`model.run`) a page needs on this series, where a burst can fill the majority of
    the jump test's short window (the page window's majority, window // 2 + 1) and so confirm the page rule
    on its own: BURST_DEFAULT + 1 before the series has shown a burst that long, two more than its longest
    recent one after (a burst's next run is slow by chance often enough to page: bench/detector.py
    `bursts`), at most PERSIST_MOST; 0 where a burst cannot fill it (a 10-run window, for jobs with one
    probe per run)."""
    short = window // 2 + 1
    burst = round(model.burst)
    if max(BURST_DEFAULT, burst) < short // 2 + 1:
        return 0
    return min(PERSIST_MOST, burst + 2 if burst >= BURST_DEFAULT else BURST_DEFAULT + 1)


# The page rule's jump test measures how much neighbouring windows differ on this many runs before them
# (three days of 5-minute runs: on load that wanders for an hour, one day's neighbours measure the spread
# 20% too small one time in 20, and a jump of 4 such spreads is then wander of 3.2), and needs at least
# this many pairs of neighbours per run of the window (their windows overlap: 8 per run is 4 pairs that do
# not).
JUMP_HISTORY_RUNS = 864
JUMP_PAIRS_PER_RUN = 8


def jump_spread(
    history: Sequence[float],
    window: int,
    medians: Sequence[float] | None = None,
    *,
    after: int | None = None,
    after_medians: Sequence[float] | None = None,
) -> float | None:
    """The MAD-sigma of the median of each `after` (default `window`) consecutive values less that of the
    `window` before them, over `history` (in time order; nan where a run has no value); None with fewer
    than JUMP_PAIRS_PER_RUN x `window` such pairs. Measured, not modelled: whatever the noise (AR, bursts,
    regimes), it is how far apart neighbouring windows of this series come by chance.

    `medians` and `after_medians`, when the caller keeps them: `window_medians(history, window)` and
    `window_medians(history, after)`."""
    # Each window's median once (a pair is the windows at `start` and `start + window`), and nans
    # counted by prefix sums, not searched for in every pair: the page rule asks this on every slow run.
    after = window if after is None else after
    if medians is None:
        medians = window_medians(history, window)
    if after_medians is None:
        after_medians = medians if after == window else window_medians(history, after)
    pairs = max(0, len(history) - window - after + 1)
    total = sum(history)
    if total == total:  # no nan (a day of residuals mostly has none): every pair, differenced in C
        jumps = list(map(sub, after_medians[window : window + pairs], medians[:pairs]))
    else:
        nans = [0, *accumulate(map(math.isnan, history))]
        jumps = [
            after_medians[start + window] - medians[start]
            for start in range(pairs)
            if nans[start + window + after] == nans[start]
        ]
    if len(jumps) < JUMP_PAIRS_PER_RUN * window:
        return None
    # mad_sigma(jumps): the same float from one sort (stats.mad_sigma_sorted selects the MAD from it).
    return median_and_sigma(jumps)[1]


def window_medians(history: Sequence[float], window: int) -> list[float]:
    """The median of each `window` consecutive values of `history`; nan for a window holding a nan."""
    count = len(history) - window + 1
    total = sum(history)
    if count <= 0 or total != total:  # a nan among them (or no window): window by window
        return [window_median(history[low : low + window]) for low in range(count)]
    # Every window sorted in C: the windows are the tuples of `window` shifted copies zipped, and the median
    # taken by position (as `median` does: the middle value, or the middle two's sum / 2.0), without a call
    # per window (the jump test asks for three days of them after a quiet spell: 227k windows a year).
    windows = map(sorted, zip(*(history[k : k + count] for k in range(window)), strict=True))
    half = window // 2
    if window % 2:
        return list(map(itemgetter(half), windows))
    return list(map(truediv, starmap(add, map(itemgetter(half - 1, half), windows)), repeat(2.0)))


def window_median(values: Sequence[float]) -> float:
    """The median of `values`; nan when one is nan."""
    return math.nan if any(map(math.isnan, values)) else median(values)


def estimate(residuals: Iterable[float]) -> NoiseModel:
    """A model of these residuals (in time order), as if fed one by one."""
    model = NoiseModel()
    extend(model, residuals)
    return model


def extend(model: NoiseModel, residuals: Iterable[float]) -> None:
    """`update` `model` with each of these residuals in turn, fitting share and phi once at the end, to the
    ratios of the last update that refits: the same model, for a fit's cost instead of one per 3 hours."""
    ratios = None
    for residual in residuals:
        if update(model, residual, deferred_fit=True):
            ratios = model.ratio(0), model.ratio(1)
    if ratios is not None:
        model.share, model.phi = fit(*ratios, near=model.phi)


def ar_ratio(phi: float, n: float) -> float:
    """g(n) of an AR(1) process with coefficient phi."""
    if phi <= 0.0:
        return 1.0
    limit = (1.0 + phi) / (1.0 - phi)
    if math.isinf(n):
        return limit
    return limit - 2.0 * phi * (1.0 - float(phi**n)) / (n * (1.0 - phi) ** 2)


def variance_ratio(share: float, phi: float, n: float) -> float:
    """g(n) of white noise plus an AR(1) process holding `share` of the variance."""
    if n <= 1:
        return 1.0
    return min(G_MAX, 1.0 - share + share * ar_ratio(phi, n))


@functools.lru_cache(maxsize=1024)
def _variance_ratio_cached(share: float, phi: float, n: float) -> float:
    # The detector asks for the same few windows (5, 24, 144, the reference's runs) after every run, and
    # the fit changes every 36 runs: a pure function's cache, not state.
    return variance_ratio(share, phi, n)


@functools.lru_cache(maxsize=1024)
def _block_ar_ratios(phi: float) -> tuple[float, float]:
    # `fit` tries the same few hundred phis (a fixed coarse grid, a fine one around each of its points)
    # every time a long block completes: a pure function's cache, not state.
    return ar_ratio(phi, BLOCKS[0]), ar_ratio(phi, BLOCKS[1])


# `_best_fit` works out a grid point's miss (two logs and two squares) only where its short blocks' ratio is
# within exp(log ratio_short +- sqrt(best miss so far)), widened by this share: outside, the first term of its miss
# alone is larger than that best (the margin is far above the rounding of the bound, some 1e-15 of it).
_FIT_MARGIN = 1e-9


def _best_fit(
    grid: Sequence[tuple[float, float, float]],
    ratio_long: float,
    log_short: float,
    log_long: float,
    first: tuple[float, float, float],
) -> tuple[float, float, float]:
    """The first smallest (miss, share, phi) over `grid`'s (phi, its g(n) for n in BLOCKS): the share that
    matches the long blocks' ratio, and how far (in log) both ratios are from the measured ones.

    `first`: the (miss, share, phi) of one of the grid's points, likely close to the best (the best of the coarse
    grid, or the point the model was fitted to last time): points whose miss is larger cannot be the best, and
    most are told so without their logs. The answer does not depend on which point it is."""
    # Refit every 3 hours of runs for every series, over some 60 phis: min() and the best tuple spelt out,
    # a tuple built only for a candidate (the same comparisons, so the same point).
    log, exp, sqrt = math.log, math.exp, math.sqrt
    best = first
    reach = sqrt(best[0])
    low, high = exp(log_short - reach) * (1.0 - _FIT_MARGIN), exp(log_short + reach) * (1.0 + _FIT_MARGIN)
    for phi, ar_short, ar_long in grid:
        # variance_ratio(share, phi, n), with ar_ratio(phi, n) from the grid (both BLOCKS above 1).
        share = (ratio_long - 1.0) / (ar_long - 1.0)
        share = share if share < 1.0 else 1.0  # min(1.0, share)
        short = 1.0 - share + share * ar_short
        short = short if short < G_MAX else G_MAX
        if short < low or short > high:  # (log(short) - log_short) ** 2 alone is above the best miss
            continue
        long = 1.0 - share + share * ar_long
        miss = (log(short) - log_short) ** 2 + (log(long if long < G_MAX else G_MAX) - log_long) ** 2
        # (miss, share, phi) < best: only a miss no larger can be.
        if miss <= best[0] and (miss, share, phi) < best:
            best = (miss, share, phi)
            reach = sqrt(miss)
            low, high = exp(log_short - reach) * (1.0 - _FIT_MARGIN), exp(log_short + reach) * (1.0 + _FIT_MARGIN)
    return best


def _fit_point(
    point: tuple[float, float, float], ratio_long: float, log_short: float, log_long: float
) -> tuple[float, float, float]:
    """(miss, share, phi) of one grid point, as `_best_fit` works it out."""
    phi, ar_short, ar_long = point
    share = (ratio_long - 1.0) / (ar_long - 1.0)
    share = share if share < 1.0 else 1.0
    short = 1.0 - share + share * ar_short
    long = 1.0 - share + share * ar_long
    miss = (math.log(short if short < G_MAX else G_MAX) - log_short) ** 2 + (
        math.log(long if long < G_MAX else G_MAX) - log_long
    ) ** 2
    return miss, share, phi


@functools.lru_cache(maxsize=1)
def _coarse_grid() -> tuple[tuple[float, float, float], ...]:
    return tuple((phi, *_block_ar_ratios(phi)) for phi in _PHI_COARSE)


def fit(ratio_short: float, ratio_long: float, *, near: float = 0.9) -> tuple[float, float]:
    """(share, phi) of white noise plus AR(1) whose g(BLOCKS[0]) and g(BLOCKS[1]) are closest (in log) to
    the measured ones; (0, 0) when the long blocks vary no more than independent runs would. A coarse
    grid of phi, then a fine one around its best point.

    `near`: a phi likely close to the answer (the model's last fit): the coarse grid's point nearest it is worked
    out first, and the points far worse than it are passed over sooner. The answer does not depend on it."""
    if ratio_long <= 1.0:
        return 0.0, 0.0
    log_short, log_long = math.log(ratio_short), math.log(ratio_long)
    grid = _coarse_grid()
    # The coarse phis are i / 40 (and _PHI_MAX last): the point nearest `near`.
    start = round(near * 40.0) - 1
    start = 0 if start < 0 else len(grid) - 1 if start >= len(grid) else start
    coarse = _best_fit(grid, ratio_long, log_short, log_long, _fit_point(grid[start], ratio_long, log_short, log_long))
    # The fine grid's centre is the coarse point: its miss bounds the rest there.
    best = _best_fit(_fine_grid(coarse[2]), ratio_long, log_short, log_long, coarse)
    return best[1], best[2]


@functools.lru_cache(maxsize=64)
def _fine_grid(centre: float) -> tuple[tuple[float, float, float], ...]:
    # The fine grid about each point of the coarse one (the centres `fit` can find), built once for each.
    fine = [min(_PHI_MAX, max(0.005, centre + step / 400.0)) for step in range(-10, 11)]
    return tuple((phi, *_block_ar_ratios(phi)) for phi in fine)


# The rules scale their evidence by the model only when residuals VARIO_LAG runs apart differ at least this
# many times more (in variance) than neighbours do (`engaged`): independent series measured 0.95-1.08 after
# two weeks (bench/detector.py, with steps), AR(1) rows with 5 probes per run 1.24-1.94, with 1 probe
# 1.06-1.26 (where the AR share of a run's variance is smallest).
ENGAGE_VARIO = 1.12


def engaged(model: NoiseModel) -> bool:
    """Whether the rules scale their evidence by `model`: runs measured clearly more alike than independent
    ones (the variogram ratio at least ENGAGE_VARIO). Not on block variances: an undetected step inflates
    those for as long as it lasts (on independent runs with steps g(6) reached 1.3-1.9 and engaged the
    model half the time), while it moves the variogram only at its edges."""
    return model.vario_ratio >= ENGAGE_VARIO


def describe(model: NoiseModel, *, interval_s: float, runs: int) -> str:
    """In words, for notices: "noise: sd 0.21, runs correlate for about 45 min; equivalent to 4 independent runs"."""
    minutes = model.correlation_minutes(interval_s)
    correlate = f"runs correlate for about {minutes:.0f} min" if minutes >= 1 else "runs look independent"
    equivalent = model.effective_runs(runs)
    shown = f"{equivalent:.0f}" if equivalent >= 1.5 else f"{equivalent:.1f}"
    return f"noise: sd {model.sd:.2f}, {correlate}; equivalent to {shown} independent runs"


# The CUSUM's false-alert rate comes out this many times above Siegmund's approximation for a known
# reference: the reference (a slot's seasonal baseline and a day's level) is itself estimated, and
# shared by neighbouring runs. Measured with bench/detector.py on independent noise (docs/detection.md).
# Used only when the caller gives no `reference_variance` (the detector gives one: core.py REFERENCE_SHARE).
REFERENCE_PENALTY = 3.4
# The CUSUM's threshold is never below this many clipped runs' worth: a burst of half an hour of slow runs,
# however slow, cannot open a ticket alone (the Gaussian theory does not know about bursts).
MIN_SPIKES = 6
# The share of `false_alerts_per_week` the CUSUM may spend; the window rules and pages spend the rest.
CUSUM_SHARE = 0.5
# With the model on, the window ticket rule waits this many confirming runs more than `ticket.confirmations`
# (9 by default: 45 minutes of 5-minute runs): wander that lifts a 2-hour window past its z for half an hour and
# falls back was most of that rule's false tickets. bench/detector.py, 36 rows: false alerts 0.391 / 0.616 ->
# 0.335 / 0.538 a series-week (all series / without steps), rows meeting every target 9 -> 12; seed 777 0.433 /
# 0.693 -> 0.372 / 0.590, 10 -> 11; +20% caught 0.6 and 0.3 points less often, a median 23 and 27 minutes later
# (docs/detection.md). The SLO ticket's streak, and the rules without the model, keep `ticket.confirmations`.
TICKET_EXTRA_CONFIRMATIONS = 3
WEEK_S = 7 * 86400.0


def fresh_tail() -> list[float]:
    """`NoiseModel.tail` before anything was seen: the threshold as derived (multiplier 1)."""
    return [0.0] * (TAIL_FIELDS - 1) + [1.0]


def tail_watch(model: NoiseModel, weeks: float) -> None:
    """One more run the CUSUM watched, `weeks` long (the detector adds it to `tail[5]` in place: every run)."""
    model.tail[5] += weeks


def tail_end(model: NoiseModel, per_week: float, *, fired_at: float | None = None) -> None:
    """The current excursion ended: below the threshold (it came back to 0), or, `fired_at`, where the sum
    reached the threshold (its height in units of the threshold before the multiplier: a censored one, it might
    have gone further), told when the ticket it opened cleared within TAIL_WANDER_S (the detector does not
    count one that lasted longer: a regression). Counted if it went past TAIL_FROM; the weeks watched since
    the last end are folded in (what was seen before them fading over TAIL_WEEKS) and the multiplier worked out
    again for `per_week`, so between ends a run reads it (`tail[6]`) and does nothing else."""
    tail = model.tail
    pending = tail[5]
    if pending > 0.0:
        keep = math.exp(-pending / TAIL_WEEKS)
        # The weeks watched, each fading from when it was watched: the last `pending` of them add T (1 - keep).
        tail[0] = tail[0] * keep + TAIL_WEEKS * (1.0 - keep)
        tail[1] *= keep
        tail[2] *= keep
        tail[3] *= keep
        tail[5] = 0.0
    peak = tail[4] if fired_at is None else fired_at
    if peak > TAIL_FROM:
        tail[1] += 1.0
        tail[2] += fired_at is None
        tail[3] += peak - TAIL_FROM
    tail[4] = 0.0
    tail[6] = tail_multiplier(model, per_week)


def tail_multiplier(model: NoiseModel, per_week: float) -> float:
    """How much the CUSUM's derived threshold must rise for the sum to reach it `per_week` times a week, on
    what this series' own sum has done: the rate of its excursions past TAIL_FROM of the threshold, and how
    fast their heights fall off past it (an exponential tail, the censored excursions that fired counted by
    the maximum-likelihood estimate), carried to where the rate is `per_week`; between 1 and TAIL_MOST.

    The threshold is derived for the noise as modelled (Gaussian runs, an AR(1) over a fit of two block
    sizes, the reference's error at half its estimate). A series whose sum climbs further than that (long
    memory, bursts, heavy tails, a reference off by more) shows it here, several times a week, long before
    it shows in false alerts at a quarter of one a week: past half the threshold the sum goes far more often."""
    tail = model.tail
    prior = TAIL_PRIOR_WEEKS * per_week * math.exp(TAIL_PRIOR_DECAY * (1.0 - TAIL_FROM))
    rate = (tail[1] + prior) / (tail[0] + TAIL_PRIOR_WEEKS)
    if rate <= per_week or per_week <= 0.0:
        return 1.0
    decay = (tail[2] + prior) / (tail[3] + prior / TAIL_PRIOR_DECAY)
    multiplier = TAIL_FROM + math.log(rate / per_week) / decay
    return min(TAIL_MOST, max(1.0, multiplier))


def siegmund_arl(drift: float, threshold: float) -> float:
    """Runs to an alarm of a one-sided CUSUM (reset at 0) of unit-variance Gaussian increments with
    mean `drift` (negative on healthy data: the value's mean minus the allowance) and threshold h
    (Siegmund's approximation, h corrected by 1.166)."""
    h = threshold + 1.166
    if abs(drift) < 1e-9:
        return h * h
    a = -2.0 * drift * h
    if a > 700:
        return math.inf
    return (math.exp(a) - a - 1.0) / (2.0 * drift * drift)


# Gauss-Hermite nodes and weights for the mean over a standard normal (probabilists' form, 7 points).
_NODES = (
    -3.750439717725742,
    -2.366759410734541,
    -1.154405394739968,
    0.0,
    1.154405394739968,
    2.366759410734541,
    3.750439717725742,
)
_WEIGHTS = (
    0.000548268855972,
    0.030757123967586,
    0.240123178605013,
    0.457142857142857,
    0.240123178605013,
    0.030757123967586,
    0.000548268855972,
)


def false_alarms_per_run(allowance: float, threshold: float, offset_sd: float) -> float:
    """The alarm rate of that CUSUM when the reference it measures from is off by a normal amount with sd
    `offset_sd` (same units), fixed while the sum runs: averaged over the reference's error."""
    if offset_sd <= 0:
        return 1.0 / siegmund_arl(-allowance, threshold)
    return sum(w / siegmund_arl(offset_sd * x - allowance, threshold) for x, w in zip(_NODES, _WEIGHTS, strict=True))


def cusum_threshold(
    *,
    false_alerts_per_week: float,
    allowance: float,
    long_run: float,
    interval_s: float,
    reference_variance: float = 0.0,
    near: float | None = None,
) -> float:
    """The CUSUM threshold, in the detector's units (sums of values / g, g = `long_run`), that raises
    CUSUM_SHARE of `false_alerts_per_week` on a healthy series of this noise and run interval.

    In long-run sigmas the values have allowance k / sqrt(g) and unit variance, and the sum is a
    Brownian motion with drift; its threshold h_L there is h_L / sqrt(g) in the detector's units.
    `reference_variance` (per-run sigmas^2) is how uncertain the level and seasonal baseline the values
    are measured from are: a reference that is too low by e makes the sum drift down by k - e instead of
    k, and the rate is averaged over that error. Without it (0), REFERENCE_PENALTY stands in for it.

    `near`: a threshold (the detector's units) likely close to this one, such as the one derived for the
    inputs before: the search starts there and mostly ends sooner. The answer does not depend on it."""
    runs_per_week = WEEK_S / max(interval_s, 1.0)
    # Without the reference's error given, the penalty measured on independent noise stands in for it.
    penalty = REFERENCE_PENALTY if reference_variance <= 0 else 1.0
    target = CUSUM_SHARE * false_alerts_per_week / runs_per_week / penalty
    scale = math.sqrt(max(long_run, 1.0))
    k = allowance / scale
    offset = math.sqrt(max(reference_variance, 0.0)) / scale
    return _bisected_threshold(_alarm_rate(k, offset), target, None if near is None else near * scale) / scale


# `_bisected_threshold` reads as a bisection: the threshold doubles from 1 while its alarm rate is above the
# target (at most to 2^THRESHOLD_MOST_DOUBLINGS), then [0, that] is halved THRESHOLD_HALVINGS times.
THRESHOLD_MOST_DOUBLINGS = 20  # 2^20 is the first power of two past 1e6
THRESHOLD_HALVINGS = 24


def _bisected_threshold(rate: Callable[[float], float], target: float, near: float | None = None) -> float:
    """The threshold a plain bisection on `rate` finds, from some 8 evaluations of 30 (the detector derives
    one whenever the CUSUM's inputs move: 30 evaluations each were a fifth of a year's replay).

    The rate falls as the threshold grows. The doubling stops at the first power of two 2^i whose rate is not
    above `target`, and every point the halvings try is a multiple of 2^i / 2^24, so the bisection ends on
    the first such multiple whose rate is not above `target`, exact in floating point. Both are found here
    from where a secant in log(rate) puts the crossing, and confirmed by evaluating each side of it: the
    same float whatever the estimate (a poor one only costs a longer search), given the rate does not rise
    between neighbouring grid points, which moves it by some 1e-7 of itself, far more than its rounding.
    `near`: where the secant starts instead (`cusum_threshold`)."""
    seen: dict[float, float] = {}

    def rate_at(threshold: float) -> float:  # the estimate's first points are tried again by the search
        value = seen.get(threshold)
        if value is None:
            value = seen[threshold] = rate(threshold)
        return value

    def within(threshold: float) -> bool:  # the bisection's test, negated as it is written there
        return not rate_at(threshold) > target

    estimate = _crossing(rate_at, target, near)
    doublings = THRESHOLD_MOST_DOUBLINGS
    steps = 1 << THRESHOLD_HALVINGS
    if estimate is not None and 1.0 < estimate < math.ldexp(1.0, doublings - 1):
        # Mostly settled by the two grid points about the estimate: when the rate is above the target at the
        # first and not at the next, it is above it at every power of two up to 2^(power - 1) (at most that
        # first point) and not at 2^power (at least the next), so the doubling stops at 2^power and the
        # halvings end on the next point.
        power = math.ceil(math.log2(estimate))
        step = math.ldexp(1.0, power - THRESHOLD_HALVINGS)
        point = max(steps // 2 + 1, min(steps, math.ceil(estimate / step)))
        if within(point * step) and not within((point - 1) * step):
            return point * step
    guess = 0 if estimate is None or estimate <= 1.0 else min(doublings, math.ceil(math.log2(estimate)))
    power = _first_true(lambda i: i == doublings or within(math.ldexp(1.0, i)), guess, 0, doublings)
    step = math.ldexp(1.0, power - THRESHOLD_HALVINGS)
    guess = steps if estimate is None else max(1, min(steps, math.ceil(estimate / step)))
    # The halvings never try 0, and take the top (2^power) to be within whatever the doubling found there.
    return _first_true(lambda j: j == steps or within(j * step), guess, 1, steps) * step


def _crossing(rate: Callable[[float], float], target: float, near: float | None = None) -> float | None:
    """About where `rate` crosses `target`: secant steps in log(rate) from 8 and 16 (the detector's thresholds
    mostly lie between, in long-run sigmas), or from `near` and a point beside it (a threshold derived for
    inputs close to these: two or three steps fewer), stopped within 1e-5 of it (the next step would land
    within a grid point or two of `_bisected_threshold`'s); None where the logs are not finite."""
    if not target > 0:
        return None
    log_target = math.log(target)
    x0, x1 = (near, near * 1.001) if near is not None and 1.0 < near < 1e6 else (8.0, 16.0)
    y0, y1 = rate(x0), rate(x1)
    for _ in range(12):
        if not (0 < y0 < math.inf and 0 < y1 < math.inf) or y0 == y1:
            return None
        f0, f1 = math.log(y0) - log_target, math.log(y1) - log_target
        x2 = x1 - f1 * (x1 - x0) / (f1 - f0)
        if not 0 < x2 < 1e7:
            return None
        if abs(x2 - x1) <= 1e-5 * x2:
            return x2
        x0, y0, x1, y1 = x1, y1, x2, rate(x2)
    return x1


def _first_true(test: Callable[[int], bool], guess: int, low: int, high: int) -> int:
    """The smallest integer in low..high where `test` holds, for a `test` that holds from somewhere on and
    does at `high`: tried at `guess` and beside it, then by steps doubling away from it and halving back."""
    guess = max(low, min(high, guess))
    if test(guess):
        if guess == low or not test(guess - 1):
            return guess
        top, reach = guess - 1, 2  # holds at top; find a bottom where it does not
        while top - reach >= low and test(top - reach):
            top, reach = top - reach, reach * 2
        bottom = max(low - 1, top - reach)  # does not hold at bottom (low - 1: nothing below low)
    else:
        bottom, reach = guess, 1
        while bottom + reach < high and not test(bottom + reach):
            bottom, reach = bottom + reach, reach * 2
        top = min(high, bottom + reach)
    while top - bottom > 1:
        middle = (bottom + top) // 2
        if test(middle):
            top = middle
        else:
            bottom = middle
    return top


def _alarm_rate(allowance: float, offset_sd: float) -> Callable[[float], float]:
    """`false_alarms_per_run(allowance, threshold, offset_sd)` as a function of the threshold, the same float:
    each node's drift and its factors in `siegmund_arl` worked out once, for the searches that try many."""
    if offset_sd <= 0:
        return lambda threshold: 1.0 / siegmund_arl(-allowance, threshold)
    nodes = []
    for x, weight in zip(_NODES, _WEIGHTS, strict=True):
        drift = offset_sd * x - allowance
        nodes.append((weight, abs(drift) < 1e-9, -2.0 * drift, 2.0 * drift * drift))
    exp, inf = math.exp, math.inf

    def rate(threshold: float) -> float:
        h = threshold + 1.166
        total = 0.0  # summed in order from 0, as sum() adds false_alarms_per_run's terms
        for weight, flat, slope, divisor in nodes:
            if flat:
                total += weight / (h * h)
                continue
            a = slope * h
            total += weight / (inf if a > 700 else (exp(a) - a - 1.0) / divisor)
        return total

    return rate


def lorden_delay_runs(*, shift: float, long_run_variance: float, arl_runs: float) -> float:
    """The smallest worst-case mean delay (runs) any detector can reach for a shift of `shift` (log units)
    in noise of this long-run variance (log units^2 per run) at this many runs between false alarms:
    log(ARL) / I, with I = shift^2 / (2 x long-run variance) the information per run (Lorden 1971,
    asymptotically as ARL grows)."""
    return math.log(arl_runs) * 2.0 * long_run_variance / (shift * shift)
