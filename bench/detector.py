"""Detector quality: false alerts, recall and delay on realistic synthetic series, ours beside the naive rule.

Each series is one run every 5 minutes for several weeks; a run is the median of `--rounds` probes
(default 5, the config's default `rounds`). Per probe: a base TTFT (log-uniform 200..3000 ms), a
+-20% daily cycle (random phase), a slow drift (a mean-reverting random walk, about 3% a day), lognormal
noise of the given sigma, 2% spikes of 3-10x, and 0.5% failed requests. Steps of +10/+20/+50/+100%
lasting 3-12 hours start after a 3.5-day warm-up (tickets need that much history), 1.5-3 days apart,
and then recover. Fixed seed.

Scores, per sigma and detector: false alerts per series per week (alerts opening outside a step or
the hour after it, warm-up included), false pages per week, and per step size the share of steps
caught (an alert opens, or becomes a page, during the step), the median and the longest delay from
the step's start, and the median time from the step's end to the alert's resolution. The naive
rule is "median of the last hour > 1.2x median of the last 24 hours", alerting while it holds; every
naive alert counts as a page.

    .venv/bin/python bench/detector.py [--series 40] [--weeks 4] [--rounds 5] [--jobs 2]
        [--set ticket.window_runs=24 ...]

`--set KEY=VALUE` changes one of our rules (see `Rules` in monitor/detect/detector.py). Takes
under a minute on 2 cores with the defaults. docs/detection.md has the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import os
import random
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import Any

from monitor.detect.detector import Detector, Rules, RunPoint, Threshold

RUN_S = 300
DAY_S = 86400
WEEK_S = 7 * DAY_S
STEP_SIZES = (1.1, 1.2, 1.5, 2.0)
GRACE_S = 3600
# Tickets need three days of seasonal history and half a day of level; steps start after that
# (false alerts count from day 0).
WARMUP_S = 3.5 * DAY_S
EPOCH = datetime(2025, 1, 6, tzinfo=UTC)  # a Monday, midnight UTC


@dataclass(frozen=True, slots=True)
class Step:
    start: float
    end: float
    factor: float


@dataclass(frozen=True, slots=True)
class Alert:
    opened: float
    severity: str  # the highest it reached
    resolved: float | None
    paged: float | None = None  # when it became a page, if it did


@dataclass(frozen=True, slots=True)
class Series:
    times: list[float]  # seconds since EPOCH
    ttfts: list[float | None]
    steps: list[Step]
    duration_s: float


# ---------------------------------------------------------------- generating


def make_steps(rng: random.Random, duration_s: float) -> list[Step]:
    sizes: list[float] = []
    steps: list[Step] = []
    t = WARMUP_S + rng.uniform(0, DAY_S)
    while True:
        length = rng.uniform(3, 12) * 3600
        if t + length > duration_s - 3600:
            return steps
        if not sizes:
            sizes = list(STEP_SIZES)
            rng.shuffle(sizes)
        steps.append(Step(t, t + length, sizes.pop()))
        t += length + rng.uniform(1.5, 3.0) * DAY_S


def make_series(sigma: float, seed: int, *, weeks: float, rounds: int) -> Series:
    rng = random.Random(seed)
    duration = weeks * WEEK_S
    base = math.exp(rng.uniform(math.log(200), math.log(3000)))
    phase = rng.uniform(0, 2 * math.pi)
    steps = make_steps(rng, duration)
    drift = 0.0
    drift_sd = 0.03 / math.sqrt(DAY_S / RUN_S)
    revert = RUN_S / (7 * DAY_S)
    times: list[float] = []
    ttfts: list[float | None] = []
    step_index = 0
    gauss, uniform, rand = rng.gauss, rng.uniform, rng.random
    for i in range(int(duration // RUN_S)):
        t = i * RUN_S
        drift += -drift * revert + gauss(0, drift_sd)
        while step_index < len(steps) and t >= steps[step_index].end:
            step_index += 1
        factor = 1.0
        if step_index < len(steps) and steps[step_index].start <= t:
            factor = steps[step_index].factor
        level = base * (1 + 0.2 * math.sin(2 * math.pi * t / DAY_S + phase)) * math.exp(drift) * factor
        probes = []
        for _ in range(rounds):
            if rand() < 0.005:
                continue
            value = level * math.exp(gauss(0, sigma))
            if rand() < 0.02:
                value *= uniform(3, 10)
            probes.append(value)
        times.append(t)
        ttfts.append(median(probes) if probes else None)
    return Series(times, ttfts, steps, duration)


# ---------------------------------------------------------------- detectors


def naive_alerts(series: Series) -> list[Alert]:
    """Median of the last hour > 1.2 x median of the last 24 hours, alerting while it holds."""
    hour: deque[tuple[float, float]] = deque()
    day: deque[tuple[float, float]] = deque()
    day_sorted: list[float] = []
    alerts: list[Alert] = []
    opened: float | None = None
    first = series.times[0]
    for t, ttft in zip(series.times, series.ttfts, strict=True):
        if ttft is None:
            continue
        hour.append((t, ttft))
        day.append((t, ttft))
        insort(day_sorted, ttft)
        while hour[0][0] <= t - 3600:
            hour.popleft()
        while day[0][0] <= t - DAY_S:
            old = day.popleft()[1]
            del day_sorted[bisect_left(day_sorted, old)]
        if t - first < DAY_S:
            continue
        firing = median([v for _, v in hour]) > 1.2 * _median_sorted(day_sorted)
        if firing and opened is None:
            opened = t
        elif not firing and opened is not None:
            alerts.append(Alert(opened, "page", t, opened))
            opened = None
    if opened is not None:
        alerts.append(Alert(opened, "page", None, opened))
    return alerts


def _median_sorted(data: list[float]) -> float:
    half = len(data) // 2
    return data[half] if len(data) % 2 else (data[half - 1] + data[half]) / 2


def ours_alerts(series: Series, rules: Rules) -> list[Alert]:
    """Incidents of every kind; one escalated from ticket to page counts once, as a page."""
    replayer = Detector(rules).replayer()
    open_at: dict[str, tuple[float, float | None]] = {}
    alerts: list[Alert] = []
    for t, ttft in zip(series.times, series.ttfts, strict=True):
        point = RunPoint(EPOCH + timedelta(seconds=t), ttft, None if ttft is not None else "timeout_first_token")
        for event in replayer.feed(point):
            if event.action == "open":
                open_at[event.kind] = (t, t if event.severity == "page" else None)
            elif event.action == "update" and event.severity == "page":
                open_at[event.kind] = (open_at[event.kind][0], t)
            elif event.action == "resolve":
                opened, paged = open_at.pop(event.kind)
                alerts.append(Alert(opened, "page" if paged is not None else "ticket", t, paged))
    alerts += [
        Alert(opened, "page" if paged is not None else "ticket", None, paged) for opened, paged in open_at.values()
    ]
    return sorted(alerts, key=lambda a: a.opened)


# ---------------------------------------------------------------- scoring


@dataclass
class Score:
    weeks: float = 0.0
    false_alerts: int = 0
    false_pages: int = 0
    pages: int = 0
    steps: dict[float, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(STEP_SIZES, 0))
    caught: dict[float, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(STEP_SIZES, 0))
    delays: dict[float, list[float]] = dataclasses.field(default_factory=lambda: {s: [] for s in STEP_SIZES})
    clears: dict[float, list[float]] = dataclasses.field(default_factory=lambda: {s: [] for s in STEP_SIZES})

    def add(self, other: Score) -> None:
        self.weeks += other.weeks
        self.false_alerts += other.false_alerts
        self.false_pages += other.false_pages
        self.pages += other.pages
        for size in STEP_SIZES:
            self.steps[size] += other.steps[size]
            self.caught[size] += other.caught[size]
            self.delays[size] += other.delays[size]
            self.clears[size] += other.clears[size]


def score(series: Series, alerts: Sequence[Alert]) -> Score:
    result = Score(weeks=series.duration_s / WEEK_S)
    for alert in alerts:
        inside = any(s.start <= alert.opened <= s.end + GRACE_S for s in series.steps)
        result.pages += alert.severity == "page"
        if not inside:
            result.false_alerts += 1
            result.false_pages += alert.severity == "page"
    for step in series.steps:
        result.steps[step.factor] += 1
        # Caught: an alert opens during the step, or one already open becomes a page during it.
        moments = [
            (moment, alert)
            for alert in alerts
            for moment in (alert.opened, alert.paged)
            if moment is not None and step.start <= moment <= step.end
        ]
        if moments:
            moment, alert = min(moments, key=lambda m: m[0])
            result.caught[step.factor] += 1
            result.delays[step.factor].append(moment - step.start)
            if alert.resolved is not None:
                result.clears[step.factor].append(alert.resolved - step.end)
    return result


def evaluate_series(task: tuple[float, int, float, int, dict[str, Any]]) -> tuple[float, Score, Score]:
    sigma, seed, weeks, rounds, overrides = task
    series = make_series(sigma, seed, weeks=weeks, rounds=rounds)
    rules = apply_overrides(Rules(), overrides)
    return sigma, score(series, naive_alerts(series)), score(series, ours_alerts(series, rules))


# ---------------------------------------------------------------- rules from the command line


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"'{text}' is not KEY=VALUE (e.g. ticket.window_runs=24)")
    return key.strip(), float(value) if "." in value or "e" in value else int(value)


def apply_overrides(rules: Rules, overrides: dict[str, Any]) -> Rules:
    for key, value in overrides.items():
        if "." in key:
            part, name = key.split(".", 1)
            nested: Threshold = getattr(rules, part)
            change: dict[str, Any] = {part: dataclasses.replace(nested, **{name: value})}
        else:
            change = {key: value}
        rules = dataclasses.replace(rules, **change)
    return rules


# ---------------------------------------------------------------- report


def _label(factor: float) -> str:
    return f"+{round((factor - 1) * 100)}%"


def _minutes(values: list[float], pick: Callable[[list[float]], float] = median) -> str:
    return f"{pick(values) / 60:5.0f}" if values else "    -"


def format_table(sigma: float, scores: dict[str, Score], series_count: int) -> str:
    any_score = next(iter(scores.values()))
    steps = ", ".join(f"{any_score.steps[s]} x {_label(s)}" for s in STEP_SIZES)
    lines = [
        f"sigma {sigma:.1f}: {series_count} series, {any_score.weeks:.0f} series-weeks, steps {steps}",
        "detector  false/wk  false pages/wk  pages/wk | "
        + " | ".join(f"{_label(s):>5}: recall delay   max clear" for s in STEP_SIZES),
    ]
    for name, result in scores.items():
        cells = []
        for size in STEP_SIZES:
            recall = result.caught[size] / result.steps[size] if result.steps[size] else math.nan
            delays, clears = result.delays[size], result.clears[size]
            cells.append(f"       {recall:6.1%} {_minutes(delays)} {_minutes(delays, max)} {_minutes(clears)}")
        lines.append(
            f"{name:<8} {result.false_alerts / result.weeks:9.2f} {result.false_pages / result.weeks:15.3f} "
            f"{result.pages / result.weeks:9.2f} | " + " | ".join(cells)
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=40, help="series per sigma (40)")
    parser.add_argument("--weeks", type=float, default=4, help="weeks per series (4)")
    parser.add_argument("--rounds", type=int, default=5, help="probes per run (5)")
    parser.add_argument("--sigmas", default="0.1,0.2,0.3,0.4", help="per-probe lognormal sigmas")
    parser.add_argument("--seed", type=int, default=20250106)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument(
        "--set",
        dest="overrides",
        type=parse_override,
        action="append",
        default=[],
        help="override a rule of ours, e.g. ticket.window_runs=24 (repeatable)",
    )
    args = parser.parse_args(argv)
    sigmas = [float(s) for s in args.sigmas.split(",")]
    overrides = dict(args.overrides)
    rules = apply_overrides(Rules(), overrides)
    print(f"rules: {rules}")
    print(
        f"runs every {RUN_S // 60} min, median of {args.rounds} probes; false = opened outside a step "
        f"or the {GRACE_S // 60} min after it; delays (median, max) and clears (median) in minutes"
    )
    tasks = [
        (sigma, args.seed + 1000 * index + round(sigma * 10), args.weeks, args.rounds, overrides)
        for sigma in sigmas
        for index in range(args.series)
    ]
    started = time.perf_counter()
    totals = {sigma: {"naive": Score(), "ours": Score()} for sigma in sigmas}
    if args.jobs > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            results = pool.map(evaluate_series, tasks, chunksize=1)
    else:
        results = [evaluate_series(task) for task in tasks]
    for sigma, naive, ours in results:
        totals[sigma]["naive"].add(naive)
        totals[sigma]["ours"].add(ours)
    for sigma in sigmas:
        print()
        print(format_table(sigma, totals[sigma], args.series))
    print(f"\n{len(tasks)} series in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
