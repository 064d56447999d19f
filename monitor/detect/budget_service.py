"""Budgets at run time (docs/cost.md): after each stored batch, where each budget is heading at the rate
the last hour actually spent; one notification per budget and period when it is on course to exceed, and
the course in `ttft_monitor_budget_course_ratio`.

The load-time check (monitor.config.cost.budget_problems) can only bound what the schedule asks for; this
catches what the schedule does not say: a model that started reasoning past what max_tokens limits (an
`extra_body` max_completion_tokens), a longer chat template, a provider that changed its tokenizer.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import structlog

from monitor.alert.model import Notification
from monitor.config.cost import COURSE_WINDOW_S, budget_course, jobs_in_scope, period_end
from monitor.config.models import BudgetLimit, Config
from monitor.store.records import BudgetHoldRecord

if TYPE_CHECKING:
    from monitor.alert.outbox import Outbox
    from monitor.metrics.definitions import Metrics
    from monitor.store.repository import Repository

KIND = "budget"
# One notice per budget and period: its id is derived from both, so the outbox's de-duplication keeps it
# to one across runs, restarts and replicas.
_NAMESPACE = uuid.UUID("4f3c1a52-9d0e-4b7a-8a51-6f0f2b1c7e10")


def notice_id(location: str, path: str, per: str, now: datetime) -> uuid.UUID:
    period = f"{now:%Y-%m-%d}" if per == "day" else f"{now:%Y-%m}"
    return uuid.uuid5(_NAMESPACE, f"{location}/{path}/{per}/{period}")


@dataclass(frozen=True, slots=True)
class Hold:
    """A budget's action on one job: `reduce` (1 round, no warm-up) or `pause`, until its period ends."""

    job: str
    action: str
    budget: str  # its key path under `budget`
    per: str
    since: datetime
    until: datetime

    def to_json(self) -> dict[str, str]:
        return {
            "job": self.job,
            "action": self.action,
            "budget": self.budget,
            "per": self.per,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
        }

    def record(self) -> BudgetHoldRecord:
        return BudgetHoldRecord(self.job, self.action, self.budget, self.per, self.since, self.until)

    @classmethod
    def of(cls, record: BudgetHoldRecord) -> Hold:
        return cls(record.job, record.action, record.budget, record.per, record.since, record.until)


def in_force(config: Config, hold: Hold, now: datetime) -> bool:
    """Whether `hold` still holds its job: its period not over, and the config still asking for it (its
    budget there, with the same action, its job in the budget's scope). Pure: `once` asks it too."""
    if now >= hold.until or hold.action not in ACTION_LEVEL:
        return False
    limit = _limit(config, hold.budget)
    return limit is not None and limit.action == hold.action and hold.job in jobs_in_scope(config, hold.budget)


ACTION_LEVEL = {"reduce": 1, "pause": 2}


class BudgetService:
    def __init__(
        self,
        repository: Repository,
        config: Config,
        *,
        outbox: Outbox | None,
        metrics: Metrics | None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._repository = repository
        self._outbox = outbox
        self._metrics = metrics
        self._clock = clock
        self._log = structlog.get_logger()
        self._told: set[uuid.UUID] = set()  # saves the outbox a round trip for a notice already enqueued
        self._holds: dict[str, Hold] = {}  # by job: the strongest action a crossed budget holds it to
        # Kept in the database (table budget_holds) across restarts, replicas and `once` runs: a paused job's
        # last hour spent nothing, so the next check alone would not see the budget crossed again.
        self._lifted: set[str] = set()  # jobs whose stored hold is to be deleted at the next check
        self.update_config(config)

    async def restore(self) -> None:
        """Take up the location's stored holds that are still in force. Never raises."""
        try:
            records = await self._repository.load_budget_holds(self._config.location)
        except Exception as exc:
            self._log.warning(
                "budget_holds_unreadable",
                error=f"{type(exc).__name__}: {exc}",
                hint="a budget still crossed holds its jobs again at its next check",
            )
            return
        now = self._clock()
        for record in records:
            hold = Hold.of(record)
            if not in_force(self._config, hold, now):
                self._lifted.add(hold.job)
                continue
            before = self._holds.get(hold.job)
            if before is None or ACTION_LEVEL[before.action] < ACTION_LEVEL[hold.action]:
                self._holds[hold.job] = hold
                self._log.warning("budget_action_restored", **hold.to_json())
                self._show(hold.job)

    def update_config(self, config: Config) -> None:
        self._config = config
        budget = config.budget
        self._active = budget.total is not None or bool(budget.providers) or bool(budget.jobs)
        # A reload keeps only the holds its budgets still ask for (an action set back to notify, a budget
        # removed or raised in the file, lifts them; a budget still crossed holds again at its next check).
        now = self._clock()
        kept = {job: hold for job, hold in self._holds.items() if in_force(config, hold, now)}
        lifted = set(self._holds) - set(kept)
        self._holds = kept
        for job in lifted:
            self._log.warning("budget_action_lifted", job=job, reason="the config no longer asks for it")
            self._show(job)
        self._lifted |= lifted

    def hold_for(self, job: str, now: datetime | None = None) -> Hold | None:
        """The action a crossed budget holds `job` to now, or None; a hold whose period ended is lifted."""
        hold = self._holds.get(job)
        if hold is None:
            return None
        if (now or self._clock()) >= hold.until:
            del self._holds[job]
            self._log.warning("budget_action_lifted", job=job, budget=hold.budget, reason="its period ended")
            self._show(job)
            self._lifted.add(job)
            return None
        return hold

    def holds(self) -> list[dict[str, str]]:
        """Every job's hold as JSON, for the overview. Read from the pages' thread: a snapshot, changing nothing."""
        now = self._clock()
        return [hold.to_json() for hold in sorted(list(self._holds.values()), key=lambda h: h.job) if now < hold.until]

    def _show(self, job: str) -> None:
        if self._metrics is not None:
            hold = self._holds.get(job)
            self._metrics.job_budget_action.labels(job).set(ACTION_LEVEL.get(hold.action, 0) if hold else 0)

    async def _hold(self, path: str, limit: BudgetLimit, per: str, now: datetime) -> None:
        """Hold every job in the budget's scope to its action, the strongest when budgets overlap."""
        until = period_end(per, now)
        for job in jobs_in_scope(self._config, path):
            before = self._holds.get(job)
            if before is not None and ACTION_LEVEL[before.action] >= ACTION_LEVEL[limit.action]:
                continue
            hold = self._holds[job] = Hold(job, limit.action, path, per, now, until)
            self._lifted.discard(job)
            self._log.warning(
                "budget_action",
                job=job,
                action=limit.action,
                budget=path,
                until=until.isoformat(),
                reason="1 round and no warm-up until the period ends"
                if limit.action == "reduce"
                else "its ticks are skipped until the period ends",
            )
            self._show(job)
            try:
                await self._repository.save_budget_hold(self._config.location, hold.record())
            except Exception as exc:  # it still holds in this process; a restart would take it up at the next check
                self._log.warning("budget_hold_not_saved", job=job, error=f"{type(exc).__name__}: {exc}")

    async def after_store(self, job: str) -> None:
        """Never raises: a budget check must not stop probing."""
        if not self._active:
            return
        try:
            await self._check()
        except Exception as exc:
            self._log.warning("budget_check_failed", job=job, error=f"{type(exc).__name__}: {exc}")

    async def _check(self) -> None:
        # Another replica's holds (the same location, one table) and holds lifted meanwhile, first.
        await self.restore()
        config, now = self._config, self._clock()
        if self._lifted:  # stored holds no longer in force: gone before a restart could take them up
            lifted = sorted(self._lifted)
            await self._repository.delete_budget_holds(config.location, lifted)
            self._lifted.difference_update(lifted)
        spent, first = await self._repository.tokens_spent(config.location, now - timedelta(seconds=COURSE_WINDOW_S))
        if first is None:
            return
        for course, limit in budget_course(config, spent, span_s=(now - first).total_seconds()):
            if self._metrics is not None:
                self._metrics.budget_course.labels(course.path, course.per).set(course.ratio)
            if not course.over:
                continue
            if limit.action != "notify":
                await self._hold(course.path, limit, course.per, now)
            incident_id = notice_id(config.location, course.path, course.per, now)
            if incident_id in self._told:
                continue
            message = course.message(limit)
            if limit.action != "notify":
                jobs = ", ".join(jobs_in_scope(config, course.path)) or "none"
                what = "run with 1 round and no warm-up" if limit.action == "reduce" else "are paused"
                message += f"; its jobs ({jobs}) {what} until {period_end(course.per, now):%Y-%m-%d %H:%M} UTC"
            self._log.warning("budget_on_course_to_exceed", budget=course.path, ratio=round(course.ratio, 3))
            if self._outbox is not None:
                await self._outbox.notify(self._notification(incident_id, course.path, message, now), now=now)
            self._told.add(incident_id)

    def _notification(self, incident_id: uuid.UUID, path: str, message: str, now: datetime) -> Notification:
        job = path.split(".", 1)[1] if path.startswith("jobs.") else ""
        provider = path.split(".", 1)[1] if path.startswith("providers.") else ""
        return Notification(
            incident_id=incident_id,
            state="info",
            kind=KIND,
            severity="ticket",
            job=job,
            target="",
            model="",
            provider=provider,
            prompt="",
            location=self._config.location,
            since=now,
            summary=message,
        )


def _limit(config: Config, path: str) -> BudgetLimit | None:
    budget = config.budget
    if path == "total":
        return budget.total
    kind, _, name = path.partition(".")
    return (budget.jobs if kind == "jobs" else budget.providers if kind == "providers" else {}).get(name)
