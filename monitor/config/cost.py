"""What probing costs: the tokens of a probe, how often a schedule runs, the projection per job and in
total, and the budgets a config must keep (docs/cost.md).

Pure functions of the config and, where a database already holds them, of the tokens actually seen per
probe (`Seen`, read by the caller); nothing here does I/O. The config loader refuses a config whose
projection exceeds a budget (`budget_problems`); `check-config` prints the projection (`render_projection`);
`probe` and the metrics price what was spent with `cost_of`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from monitor.config.cron import build_trigger
from monitor.config.series import cache_pairs, series_prompts

if TYPE_CHECKING:
    from monitor.config.models import BudgetLimit, Config
    from monitor.probe.settings import Prices, PromptProfile, Target

# A month, for projections and monthly budgets, is 30 days: a fixed length, so a figure does not change
# with the calendar (a 31-day month spends 3% more than it says).
DAYS_PER_MONTH = 30
PERIOD_DAYS = {"day": 1, "month": DAYS_PER_MONTH}
# Runs per day are counted over 52 whole weeks from a Monday, so weekday schedules average exactly and
# day-of-month ones within a day's share of a year.
_REFERENCE_START = datetime(2025, 1, 6, tzinfo=UTC)
_WEEKS = 52

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Tokens:
    """Tokens by kind. `input` counts every prompt token, the `cached` ones among them included; `output` is
    the visible answer and `reasoning` the hidden thinking (together the API's completion tokens)."""

    input: float = 0.0
    cached: float = 0.0
    output: float = 0.0
    reasoning: float = 0.0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.input + other.input,
            self.cached + other.cached,
            self.output + other.output,
            self.reasoning + other.reasoning,
        )

    def scaled(self, factor: float) -> Tokens:
        return Tokens(self.input * factor, self.cached * factor, self.output * factor, self.reasoning * factor)

    @property
    def total(self) -> float:
        return self.input + self.output + self.reasoning


def spent(
    *, prompt_tokens: int | None, cached_tokens: int | None, completion_tokens: int | None, reasoning_tokens: int | None
) -> Tokens:
    """One request's tokens from what the server reported (a count it did not send is 0)."""
    completion = completion_tokens or 0
    reasoning = min(reasoning_tokens or 0, completion) if completion_tokens is not None else reasoning_tokens or 0
    return Tokens(
        input=float(prompt_tokens or 0),
        cached=float(cached_tokens or 0),
        output=float(max(completion - reasoning, 0)),
        reasoning=float(reasoning),
    )


def cost_of(tokens: Tokens, prices: Prices) -> float:
    """(input - cached) x input + cached x cached_input + output x output + reasoning x reasoning, per token."""
    per_input, per_cached, per_output, per_reasoning = prices.per_token()
    uncached = max(tokens.input - tokens.cached, 0.0)
    return (
        uncached * per_input
        + tokens.cached * per_cached
        + tokens.output * per_output
        + tokens.reasoning * per_reasoning
    )


def prices_for(config: Config, target: str) -> Prices | None:
    """A target's own prices, else its provider's, else None (costs in tokens only)."""
    settings = config.targets[target]
    if settings.prices is not None:
        return settings.prices
    provider = config.providers.get(settings.provider)
    return provider.prices if provider is not None else None


@lru_cache(maxsize=256)
def runs_per_day(schedule: str, timezone: str) -> float:
    """How many times a day `schedule` fires in `timezone`, on average over 52 weeks.

    Cron fields are independent, so a day's fires are (matching hours) x (matching minutes in an hour) x
    (matching seconds in a minute); about 500 look-ups where counting every fire of `*/5 * * * * *` would
    take 6 million. Daylight-saving days are counted as ordinary ones.
    """
    trigger = copy.copy(build_trigger(schedule, timezone))
    trigger.jitter = None
    zone = trigger.timezone
    start = _REFERENCE_START.astimezone(zone).replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None)

    def fires(begin: datetime, length: timedelta) -> bool:
        at = begin.replace(tzinfo=zone)
        nxt = trigger.get_next_fire_time(None, at)
        return nxt is not None and nxt < at + length

    days = [start + timedelta(days=d) for d in range(7 * _WEEKS)]
    matching_days = [day for day in days if fires(day, timedelta(days=1))]
    if not matching_days:
        return 0.0
    day = matching_days[0]
    hours = [day + timedelta(hours=h) for h in range(24) if fires(day + timedelta(hours=h), timedelta(hours=1))]
    hour = hours[0]
    minutes = [
        hour + timedelta(minutes=m) for m in range(60) if fires(hour + timedelta(minutes=m), timedelta(minutes=1))
    ]
    minute = minutes[0]
    seconds = sum(1 for s in range(60) if fires(minute + timedelta(seconds=s), timedelta(seconds=1)))
    return len(matching_days) / len(days) * len(hours) * len(minutes) * seconds


@dataclass(frozen=True, slots=True)
class Seen:
    """The mean tokens per probe a database holds for one target and prompt (successful samples)."""

    samples: int
    prompt_tokens: float | None
    cached_tokens: float | None
    completion_tokens: float | None
    reasoning_tokens: float | None


def run_tokens(target: Target, prompt: PromptProfile, requests: int, seen: Seen | None = None) -> Tokens:
    """One run's tokens for one target and prompt, `requests` requests (rounds and warm-ups).

    Without history: every request sends the prompt's `tokens` and generates `max_tokens` (an upper bound:
    reasoning counts against it too, so it is inside the output); with `cache: warm`, all but the run's first
    request are served from the cache. With history: the means seen per probe.
    """
    if seen is not None and seen.samples > 0 and seen.completion_tokens is not None:
        one = spent(
            prompt_tokens=round(seen.prompt_tokens if seen.prompt_tokens is not None else prompt.tokens),
            cached_tokens=round(seen.cached_tokens or 0),
            completion_tokens=round(seen.completion_tokens),
            reasoning_tokens=round(seen.reasoning_tokens or 0),
        )
        return one.scaled(requests)
    cached = prompt.tokens * (requests - 1) if prompt.cache == "warm" else 0
    return Tokens(
        input=float(prompt.tokens * requests),
        cached=float(cached),
        output=float(target.params.max_tokens * requests),
        reasoning=0.0,
    )


@dataclass(frozen=True, slots=True)
class SeriesProjection:
    """One target and prompt of a job, per day."""

    target: str
    provider: str
    prompt: str
    requests_per_run: int
    per_day: Tokens
    cost_per_day: float | None  # None: the target has no prices
    currency: str | None
    seen: int  # samples the figures come from; 0: from the schedule and max_tokens


@dataclass(frozen=True, slots=True)
class JobProjection:
    name: str
    runs_per_day: float
    series: tuple[SeriesProjection, ...]

    @property
    def per_day(self) -> Tokens:
        return sum((s.per_day for s in self.series), Tokens())

    def cost_per_day(self) -> dict[str, float]:
        return costs(self.series)

    @property
    def requests_per_run(self) -> int:
        return sum(s.requests_per_run for s in self.series)


def costs(series: Iterable[SeriesProjection]) -> dict[str, float]:
    """Cost per day by currency of the priced series."""
    out: dict[str, float] = {}
    for s in series:
        if s.cost_per_day is not None and s.currency is not None:
            out[s.currency] = out.get(s.currency, 0.0) + s.cost_per_day
    return out


@dataclass(frozen=True, slots=True)
class MonthlyCost:
    """What probing one target and prompt costs a month at its schedule: for the overview, the series page
    and the report. `cost` is None without prices; `seen` is how many samples the figures come from (0:
    from the schedule and max_tokens, an upper bound)."""

    tokens: float
    cost: float | None
    currency: str | None
    seen: int

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens_per_month": round(self.tokens),
            "cost_per_month": None if self.cost is None else round(self.cost, 4),
            "currency": self.currency,
            "from_history": self.seen > 0,
        }


def monthly_by_series(jobs: Sequence[JobProjection]) -> dict[tuple[str, str], MonthlyCost]:
    """Each (target, prompt)'s tokens and cost a month, summed over the jobs that probe it."""
    out: dict[tuple[str, str], MonthlyCost] = {}
    for job in jobs:
        for s in job.series:
            key = (s.target, s.prompt)
            tokens = s.per_day.total * DAYS_PER_MONTH
            cost = None if s.cost_per_day is None else s.cost_per_day * DAYS_PER_MONTH
            before = out.get(key)
            if before is not None:
                tokens += before.tokens
                cost = None if cost is None or before.cost is None else cost + before.cost
            out[key] = MonthlyCost(tokens, cost, s.currency, max(s.seen, before.seen if before else 0))
    return out


def canary_prompt_tokens(prompt: str) -> int:
    """A canary's input tokens, from above: about 4 characters a token, and a chat template's wrapping."""
    return -(-len(prompt) // 4) + CHAT_TEMPLATE_TOKENS


# Tokens a chat template adds around a short message (role markers, a system line): an upper bound.
CHAT_TEMPLATE_TOKENS = 16


def project(config: Config, seen: Mapping[tuple[str, str], Seen] | None = None) -> list[JobProjection]:
    """Every job's tokens and cost per day; `seen` by (target, prompt) replaces the schedule's upper bound."""
    seen = seen or {}
    jobs = []
    for job in config.jobs:
        per_day = runs_per_day(job.schedule, job.timezone)
        series = []
        for target_name in job.targets:
            target = config.targets.get(target_name)
            if target is None:
                continue
            prices = prices_for(config, target_name)
            twins = cache_pairs(config.prompts)
            for prompt_name, prompt in series_prompts(config.prompts, job.prompts):
                # A warm twin gets one warm-up of its own when the job has none (PromptSpec.primed).
                requests = job.rounds + (max(job.warmup, 1) if prompt_name in twins else job.warmup)
                history = seen.get((target_name, prompt_name))
                tokens = run_tokens(target, prompt, requests, history).scaled(per_day)
                series.append(
                    SeriesProjection(
                        target=target_name,
                        provider=target.provider,
                        prompt=prompt_name,
                        requests_per_run=requests,
                        per_day=tokens,
                        cost_per_day=cost_of(tokens, prices) if prices is not None else None,
                        currency=prices.currency if prices is not None else None,
                        seen=history.samples if history is not None and history.completion_tokens is not None else 0,
                    )
                )
            if target.canary is not None:  # one short request per run after the probes (monitor/probe/canary.py)
                canary = Tokens(
                    input=float(canary_prompt_tokens(target.canary.prompt)), output=float(target.canary.max_tokens)
                ).scaled(per_day)
                series.append(
                    SeriesProjection(
                        target=target_name,
                        provider=target.provider,
                        prompt="canary",
                        requests_per_run=1,
                        per_day=canary,
                        cost_per_day=cost_of(canary, prices) if prices is not None else None,
                        currency=prices.currency if prices is not None else None,
                        seen=0,
                    )
                )
        jobs.append(JobProjection(name=job.name, runs_per_day=per_day, series=tuple(series)))
    return jobs


# ---------------------------------------------------------------- budgets


@dataclass(frozen=True, slots=True)
class _Scope:
    loc: Loc
    label: str  # how the message names it
    limit: BudgetLimit
    series: list[tuple[str, SeriesProjection]] = field(default_factory=list)  # (job, series)


def _scopes(config: Config, jobs: Sequence[JobProjection]) -> tuple[list[_Scope], list[tuple[Loc, str]]]:
    budget = config.budget
    problems: list[tuple[Loc, str]] = []
    scopes: list[_Scope] = []
    every = [(job.name, s) for job in jobs for s in job.series]
    if budget.total is not None:
        scopes.append(_Scope(("budget", "total"), "all jobs together", budget.total, every))
    for name, limit in budget.providers.items():
        if name not in config.providers:
            known = ", ".join(config.providers) or "none"
            problems.append((("budget", "providers", name), f"no provider named '{name}' (known: {known})"))
            continue
        chosen = [(j, s) for j, s in every if s.provider == name]
        scopes.append(_Scope(("budget", "providers", name), f"provider '{name}'", limit, chosen))
    names = [job.name for job in config.jobs]
    for name, limit in budget.jobs.items():
        if name not in names:
            problems.append((("budget", "jobs", name), f"no job named '{name}' (known: {', '.join(names) or 'none'})"))
            continue
        chosen = [(j, s) for j, s in every if j == name]
        scopes.append(_Scope(("budget", "jobs", name), f"job '{name}'", limit, chosen))
    return scopes, problems


def budget_problems(config: Config, jobs: Sequence[JobProjection] | None = None) -> list[tuple[Loc, str]]:
    """Each budget the projection exceeds (or cannot be checked against), with the key path of the budget,
    naming the jobs and their figures."""
    budget = config.budget
    if budget.total is None and not budget.providers and not budget.jobs:
        return []  # nothing to check: no projection (each job's cron walked over a year, ~10 ms)
    jobs = project(config) if jobs is None else jobs
    scopes, problems = _scopes(config, jobs)
    for scope in scopes:
        limit = scope.limit
        days = PERIOD_DAYS[limit.per]
        by_job: dict[str, list[SeriesProjection]] = {}
        for job_name, s in scope.series:
            by_job.setdefault(job_name, []).append(s)
        runs = {job.name: job.runs_per_day for job in jobs}
        if limit.tokens is not None:
            projected = sum(s.per_day.total for _, s in scope.series) * days
            if projected > limit.tokens:
                detail = ", ".join(
                    f"{name} {tokens_text(sum(s.per_day.total for s in series) * days)} "
                    f"({_runs_text(runs[name])} x {sum(s.requests_per_run for s in series)} requests)"
                    for name, series in by_job.items()
                )
                problems.append(
                    (
                        (*scope.loc, "tokens"),
                        f"{scope.label} projects {tokens_text(projected)} tokens per {limit.per}, over the budget of "
                        f"{tokens_text(limit.tokens)}: {detail}; {_REMEDY}",
                    )
                )
        if limit.cost is not None:
            unpriced = sorted({s.target for _, s in scope.series if s.currency is None})
            foreign = sorted(
                {f"{s.target} ({s.currency})" for _, s in scope.series if s.currency not in (None, limit.currency)}
            )
            if unpriced:
                problems.append(
                    (
                        (*scope.loc, "cost"),
                        f"{scope.label}: target(s) {', '.join(unpriced)} have no prices, so a cost budget cannot be "
                        "checked; add `prices:` to their provider or target, or limit `tokens:` instead",
                    )
                )
                continue
            if foreign:
                problems.append(
                    (
                        (*scope.loc, "currency"),
                        f"{scope.label}: the budget is in {limit.currency} but {', '.join(foreign)} are priced in "
                        "another currency; give the budget and the prices one currency",
                    )
                )
                continue
            projected_cost = sum(s.cost_per_day or 0.0 for _, s in scope.series) * days
            if projected_cost > limit.cost:
                detail = ", ".join(
                    f"{name} {money_text(sum(s.cost_per_day or 0.0 for s in series) * days)} "
                    f"({_runs_text(runs[name])} x {sum(s.requests_per_run for s in series)} requests, "
                    f"{tokens_text(sum(s.per_day.total for s in series) * days)} tokens)"
                    for name, series in by_job.items()
                )
                problems.append(
                    (
                        (*scope.loc, "cost"),
                        f"{scope.label} projects {money_text(projected_cost)} {limit.currency} per {limit.per}, over "
                        f"the budget of {money_text(limit.cost)} {limit.currency}: {detail}; {_REMEDY}",
                    )
                )
    return problems


_REMEDY = (
    "lower rounds, warmup, prompts, max_tokens or how often the schedule runs, or raise the budget "
    "(`check-config` prints the projection)"
)


# ---------------------------------------------------------------- text


def tokens_text(value: float) -> str:
    return f"{round(value):,}"


def money_text(value: float) -> str:
    """Cents for sums of a cent or more; smaller sums with four decimals, so a cheap probe is not shown as 0."""
    return f"{value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.4f}"


def _runs_text(per_day: float) -> str:
    return f"{per_day:,.4g} runs/day"


def tokens_detail(tokens: Tokens) -> str:
    return (
        f"{tokens_text(tokens.total)} tokens (input {tokens_text(tokens.input)}, cached {tokens_text(tokens.cached)}, "
        f"output {tokens_text(tokens.output)}, reasoning {tokens_text(tokens.reasoning)})"
    )


def costs_text(by_currency: Mapping[str, float], factor: float = 1.0) -> str:
    return ", ".join(f"{money_text(v * factor)} {c}" for c, v in sorted(by_currency.items()))


def render_projection(jobs: Sequence[JobProjection]) -> list[str]:
    """check-config's account of what the schedule spends, per job and in total."""
    lines = [
        f"cost projection (a month is {DAYS_PER_MONTH} days; without history a request generates max_tokens, "
        "an upper bound that includes reasoning):"
    ]
    every: list[SeriesProjection] = []
    for job in jobs:
        every += job.series
        lines.append(f"  {job.name}: {_runs_text(job.runs_per_day)} x {job.requests_per_run} requests")
        lines += _period_lines(job.per_day, job.cost_per_day(), unpriced=_unpriced(job.series), indent="    ")
        for s in job.series:
            basis = f"seen in {s.seen} samples" if s.seen else "from max_tokens"
            cost = f", {money_text(s.cost_per_day)} {s.currency}" if s.cost_per_day is not None else ", no prices"
            lines.append(f"    {s.target} x {s.prompt}: per day {tokens_text(s.per_day.total)} tokens{cost} ({basis})")
    lines.append("  total:")
    total = sum((s.per_day for s in every), Tokens())
    lines += _period_lines(total, costs(every), unpriced=_unpriced(every), indent="    ")
    return lines


def _unpriced(series: Iterable[SeriesProjection]) -> list[str]:
    return sorted({s.target for s in series if s.currency is None})


def _period_lines(per_day: Tokens, cost_per_day: Mapping[str, float], *, unpriced: list[str], indent: str) -> list[str]:
    lines = []
    for period, days in PERIOD_DAYS.items():
        cost = f"; {costs_text(cost_per_day, days)}" if cost_per_day else ""
        lines.append(f"{indent}per {period}: {tokens_detail(per_day.scaled(days))}{cost}")
    if unpriced:
        lines.append(f"{indent}(no prices for {', '.join(unpriced)}: in tokens only)")
    return lines


# ---------------------------------------------------------------- budgets at run time

# The spend of the last hour, or less right after a start, is what "on course" extrapolates: recent enough
# that a model which started reasoning shows at once; at least a few runs' worth before judging.
COURSE_WINDOW_S = 3600.0
COURSE_MIN_SPAN_S = 20.0


@dataclass(frozen=True, slots=True)
class Course:
    """Where one budget is heading at the rate actually spent: the period's figures at that rate."""

    path: str  # `jobs.ttft`, `providers.openai`, `total`: the budget's key under `budget`
    label: str
    per: str
    tokens: float
    cost: float | None  # None without a cost limit
    currency: str
    ratio: float  # projected / limit, the larger of tokens and cost
    over: bool

    def message(self, limit: BudgetLimit) -> str:
        figures = [f"{tokens_text(self.tokens)} tokens"]
        limits = []
        if limit.tokens is not None:
            limits.append(f"{tokens_text(limit.tokens)} tokens")
        if self.cost is not None and limit.cost is not None:
            figures.append(f"{money_text(self.cost)} {self.currency}")
            limits.append(f"{money_text(limit.cost)} {self.currency}")
        return (
            f"budget.{self.path}: {self.label} is on course to spend {' and '.join(figures)} per {self.per} at the "
            f"rate of the last hour, over its budget of {' and '.join(limits)} (a model that started reasoning, a "
            "longer prompt?); see ttft_monitor_tokens_total and `check-config`"
        )


def budget_course(
    config: Config, spent: Mapping[tuple[str, str], Tokens], *, span_s: float
) -> list[tuple[Course, BudgetLimit]]:
    """Each budget's course from `spent`, the tokens by (job, target) of the last `span_s` seconds, extrapolated
    to the budget's period; empty when the span is too short to judge."""
    if span_s < COURSE_MIN_SPAN_S:
        return []
    budget = config.budget
    scopes: list[tuple[str, str, BudgetLimit, Callable[[str, str], bool]]] = []
    if budget.total is not None:
        scopes.append(("total", "all jobs together", budget.total, lambda job, target: True))
    for name, limit in budget.providers.items():

        def at_provider(job: str, target: str, name: str = name) -> bool:
            spec = config.targets.get(target)
            return spec is not None and spec.provider == name

        scopes.append((f"providers.{name}", f"provider '{name}'", limit, at_provider))
    for name, limit in budget.jobs.items():

        def in_job(job: str, target: str, name: str = name) -> bool:
            return job == name

        scopes.append((f"jobs.{name}", f"job '{name}'", limit, in_job))
    out = []
    for path, label, limit, chosen in scopes:
        factor = PERIOD_DAYS[limit.per] * 86400 / span_s
        mine = [(target, tokens) for (job, target), tokens in spent.items() if chosen(job, target)]
        tokens = sum(t.total for _, t in mine) * factor
        ratios = [tokens / limit.tokens] if limit.tokens is not None else []
        cost = None
        if limit.cost is not None:
            priced = [(prices_for(config, target), t) for target, t in mine if target in config.targets]
            cost = sum(cost_of(t, p) for p, t in priced if p is not None and p.currency == limit.currency) * factor
            ratios.append(cost / limit.cost)
        ratio = max(ratios, default=0.0)
        course = Course(path, label, limit.per, tokens, cost, limit.currency, ratio, ratio > 1.0)
        out.append((course, limit))
    return out


# ---------------------------------------------------------------- what a budget does when crossed


def jobs_in_scope(config: Config, path: str) -> list[str]:
    """The jobs a budget's action holds: `jobs.NAME` that job; `providers.NAME` every job probing one of
    the provider's targets (the whole job: its rounds are one setting); `total` every job."""
    if path == "total":
        return [job.name for job in config.jobs]
    kind, _, name = path.partition(".")
    if kind == "jobs":
        return [job.name for job in config.jobs if job.name == name]
    if kind == "providers":
        return [
            job.name
            for job in config.jobs
            if any((spec := config.targets.get(t)) is not None and spec.provider == name for t in job.targets)
        ]
    return []


def period_end(per: str, now: datetime) -> datetime:
    """When the budget's current period ends: the next UTC midnight, or the first of the next UTC month
    (the notices name calendar periods; the projection's month is 30 days)."""
    now = now.astimezone(UTC)
    if per == "day":
        return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)
