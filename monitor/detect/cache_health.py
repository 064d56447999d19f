"""Is the prompt cache working? Pure code over the runs of a `cache: both` pair.

A `cache: both` prompt is probed busted (`NAME`, cold) and warm (`NAME.warm`) in every run. Each run
of the pair gives the cache speed-up (cold TTFT / warm TTFT, medians of the run) and, where the API
reports it, the share of the warm prompt's tokens served from the cache. Caching stops working
silently (a provider change, a template that moves the cached prefix, `--no-enable-prefix-caching`):
the warm probes report no cached tokens where they did, or are no longer faster than the cold ones.

The rule is the regression detector's, applied to the speed-up instead of the TTFT: a reference from
the trailing runs, a window of recent runs, an effect size (half the reference's gain lost, or the
cached share gone), a robust z on the window's median of log speed-ups, and persistence (every run
of the window on the wrong side). One slow or uncached run is never an incident. The reference is
frozen when an incident opens, so the runs of the outage cannot become the baseline it is judged by;
it resolves once a window of runs is back past halfway.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from monitor.detect.state import RunPoint

KIND = "cache_stopped"
Reason = Literal["no_cached_tokens", "no_speedup"]


@dataclass(frozen=True, slots=True)
class CacheRules:
    baseline_runs: int = 24  # the trailing runs the reference is the median of
    min_baseline_runs: int = 6  # fewer with figures: no reference yet, no verdict
    window_runs: int = 3  # the recent runs judged together
    min_speedup: float = 1.3  # a reference speed-up below this is too small to watch (short prompts)
    min_share: float = 0.5  # a reference cached share at least this is watched
    lost_share: float = 0.1  # a run whose cached share is at most this found (next to) nothing cached
    z_threshold: float = 3.0
    # The MAD sigma of the log speed-ups is floored here: a simulator or a very steady server would
    # otherwise make a 5% wobble significant.
    min_sigma: float = 0.05


DEFAULT_RULES = CacheRules()


@dataclass(frozen=True, slots=True)
class PairRun:
    """One run of the pair: the cold and warm TTFT medians, the warm probes' cached and prompt tokens."""

    at: datetime
    cold_ms: float | None
    warm_ms: float | None
    warm_cached_tokens: float | None = None  # None: the API does not report cached tokens
    warm_prompt_tokens: float | None = None

    @property
    def speedup(self) -> float | None:
        if self.cold_ms is None or self.warm_ms is None or self.cold_ms <= 0 or self.warm_ms <= 0:
            return None
        return self.cold_ms / self.warm_ms

    @property
    def cached_share(self) -> float | None:
        if self.warm_cached_tokens is None or not self.warm_prompt_tokens or self.warm_prompt_tokens <= 0:
            return None
        return min(max(self.warm_cached_tokens / self.warm_prompt_tokens, 0.0), 1.0)


@dataclass(frozen=True, slots=True)
class Reference:
    """What a working cache looked like: the median speed-up and cached share, their spread, over `runs`."""

    speedup: float | None
    log_sigma: float | None
    cached_share: float | None
    runs: int

    def watches_speed(self, rules: CacheRules) -> bool:
        return self.speedup is not None and self.speedup >= rules.min_speedup

    def watches_share(self, rules: CacheRules) -> bool:
        return self.cached_share is not None and self.cached_share >= rules.min_share

    def halfway_speedup(self) -> float:
        """The speed-up halfway between none (1x) and the reference's."""
        assert self.speedup is not None
        return 1.0 + (self.speedup - 1.0) / 2

    def to_json(self) -> dict[str, Any]:
        return {
            "speedup": self.speedup,
            "log_sigma": self.log_sigma,
            "cached_share": self.cached_share,
            "runs": self.runs,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reference:
        def number(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

        runs = data.get("runs")
        return cls(number("speedup"), number("log_sigma"), number("cached_share"), runs if isinstance(runs, int) else 0)


def reference_of(runs: Sequence[PairRun], rules: CacheRules = DEFAULT_RULES) -> Reference | None:
    """The reference over `runs` (the trailing ones before the window), or None with too few figures."""
    speedups = [math.log(s) for s in (r.speedup for r in runs) if s is not None]
    shares = [s for s in (r.cached_share for r in runs) if s is not None]
    if len(speedups) < rules.min_baseline_runs and len(shares) < rules.min_baseline_runs:
        return None
    speed = sigma = None
    if len(speedups) >= rules.min_baseline_runs:
        center = statistics.median(speedups)
        mad = statistics.median(abs(x - center) for x in speedups)
        speed, sigma = math.exp(center), max(1.4826 * mad, rules.min_sigma)
    share = statistics.median(shares) if len(shares) >= rules.min_baseline_runs else None
    return Reference(speed, sigma, share, max(len(speedups), len(shares)))


def run_is_cacheless(run: PairRun, reference: Reference | None, rules: CacheRules = DEFAULT_RULES) -> bool:
    """Whether this one run's warm probes look uncached against the reference (no cached tokens where
    there were, or at most halfway to the reference's speed-up). Not an incident by itself: the warm
    series' regression detector leaves such a run out, so a stopped cache is one cache incident, not
    also a TTFT regression of the warm probes."""
    if reference is None:
        return False
    share = run.cached_share
    if reference.watches_share(rules) and share is not None:
        return share <= rules.lost_share
    speedup = run.speedup
    if reference.watches_speed(rules) and speedup is not None:
        return speedup <= reference.halfway_speedup()
    return False


def leave_out_cacheless(
    history: Sequence[RunPoint], spans: Sequence[tuple[datetime, datetime]], *, window_runs: int
) -> list[RunPoint]:
    """`history` (oldest first) without the runs of each cache outage (`spans`: its incident's opening and
    end): from the first run of the window that opened it (`window_runs` runs, the opening one last) to
    the end, both included."""
    if not spans:
        return list(history)
    times = [point.at for point in history]
    out = [False] * len(history)
    for opened, ended in spans:
        first = max(0, bisect_left(times, opened) - (window_runs - 1))
        for index in range(first, bisect_right(times, ended)):
            out[index] = True
    return [point for point, dropped in zip(history, out, strict=True) if not dropped]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The window against the reference."""

    stopped: bool
    reason: Reason | None
    reference: Reference
    window_runs: int
    speedup: float | None  # the window's median speed-up
    cached_share: float | None  # the window's median cached share
    z: float | None  # how many standard errors the window's log speed-up lies below the reference's
    healthy: bool  # every run of the window is past halfway back to the reference (resolves an incident)


def judge(window: Sequence[PairRun], reference: Reference, rules: CacheRules = DEFAULT_RULES) -> Verdict | None:
    """The verdict on the last `rules.window_runs` runs with figures; None when there are fewer."""
    usable = [r for r in window if r.speedup is not None or r.cached_share is not None][-rules.window_runs :]
    if len(usable) < rules.window_runs:
        return None
    speedups = [r.speedup for r in usable if r.speedup is not None]
    shares = [r.cached_share for r in usable if r.cached_share is not None]
    median_speedup = statistics.median(speedups) if speedups else None
    median_share = statistics.median(shares) if shares else None
    z = None
    if reference.speedup is not None and reference.log_sigma and median_speedup is not None:
        # The standard error of a median of n: about 1.2533 sigma / sqrt(n).
        error = 1.2533 * reference.log_sigma / math.sqrt(len(speedups))
        z = (math.log(reference.speedup) - math.log(median_speedup)) / error
    reason: Reason | None = None
    if reference.watches_share(rules) and len(shares) == len(usable) and all(s <= rules.lost_share for s in shares):
        reason = "no_cached_tokens"
    elif (
        reference.watches_speed(rules)
        and len(speedups) == len(usable)
        and all(s <= reference.halfway_speedup() for s in speedups)
        and z is not None
        and z >= rules.z_threshold
    ):
        reason = "no_speedup"
    back_share = not reference.watches_share(rules) or (
        len(shares) == len(usable) and all(s >= reference.cached_share / 2 for s in shares)  # type: ignore[operator]
    )
    back_speed = not reference.watches_speed(rules) or (
        len(speedups) == len(usable) and all(s > reference.halfway_speedup() for s in speedups)
    )
    return Verdict(
        stopped=reason is not None,
        reason=reason,
        reference=reference,
        window_runs=len(usable),
        speedup=median_speedup,
        cached_share=median_share,
        z=z,
        healthy=back_share and back_speed,
    )


Action = Literal["open", "resolve"]


def advance(
    runs: Sequence[PairRun], frozen: Reference | None, rules: CacheRules = DEFAULT_RULES
) -> tuple[Action | None, Verdict | None]:
    """What the pair's runs (oldest first, the latest last) mean now. `frozen`: the reference an open
    incident was opened against (None: no incident open). Open when the window is stopped against the
    trailing reference; resolve when it is healthy against the frozen one."""
    window = runs[-rules.window_runs :]
    if frozen is not None:
        verdict = judge(window, frozen, rules)
        return ("resolve" if verdict is not None and verdict.healthy else None), verdict
    trailing = runs[: -rules.window_runs][-rules.baseline_runs :]
    reference = reference_of(trailing, rules)
    if reference is None:
        return None, None
    verdict = judge(window, reference, rules)
    return ("open" if verdict is not None and verdict.stopped else None), verdict


def current_reference(
    runs: Sequence[PairRun], frozen: Reference | None, rules: CacheRules = DEFAULT_RULES
) -> Reference | None:
    """The reference the latest run is judged by: the frozen one while an incident is open, else the
    trailing runs before it."""
    if frozen is not None:
        return frozen
    return reference_of(runs[:-1][-rules.baseline_runs :], rules)


# ---------------------------------------------------------------- wording


def _times(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}x"


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def describe(target: str, prompt: str, verdict: Verdict) -> str:
    """The notice: "prompt cache of qwen3-8b / long stopped working: warm probes found 0% of the prompt
    cached over the last 3 runs (97% before); speed-up over cold 1.0x (4.2x before)"."""
    ref = verdict.reference
    lead = f"prompt cache of {target} / {prompt} stopped working: "
    if verdict.reason == "no_cached_tokens":
        what = (
            f"warm probes found {_share(verdict.cached_share)} of the prompt cached over the last "
            f"{verdict.window_runs} runs ({_share(ref.cached_share)} before)"
        )
    else:
        what = f"warm probes are no faster than cold ones over the last {verdict.window_runs} runs"
    speed = f"; speed-up over cold {_times(verdict.speedup)} ({_times(ref.speedup)} before"
    if verdict.z is not None and verdict.reason == "no_speedup":
        speed += f", z {verdict.z:.1f}"
    return lead + what + speed + ")"


def describe_resolved(target: str, prompt: str, verdict: Verdict) -> str:
    ref = verdict.reference
    return (
        f"prompt cache of {target} / {prompt} works again: speed-up over cold {_times(verdict.speedup)} "
        f"({_times(ref.speedup)} before it stopped), {_share(verdict.cached_share)} of the prompt cached "
        f"over the last {verdict.window_runs} runs"
    )
