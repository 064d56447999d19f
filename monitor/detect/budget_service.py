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
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import structlog

from monitor.alert.model import Notification
from monitor.config.cost import COURSE_WINDOW_S, budget_course
from monitor.config.models import Config

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
        self.update_config(config)

    def update_config(self, config: Config) -> None:
        self._config = config
        budget = config.budget
        self._active = budget.total is not None or bool(budget.providers) or bool(budget.jobs)

    async def after_store(self, job: str) -> None:
        """Never raises: a budget check must not stop probing."""
        if not self._active:
            return
        try:
            await self._check()
        except Exception as exc:
            self._log.warning("budget_check_failed", job=job, error=f"{type(exc).__name__}: {exc}")

    async def _check(self) -> None:
        config, now = self._config, self._clock()
        spent, first = await self._repository.tokens_spent(config.location, now - timedelta(seconds=COURSE_WINDOW_S))
        if first is None:
            return
        for course, limit in budget_course(config, spent, span_s=(now - first).total_seconds()):
            if self._metrics is not None:
                self._metrics.budget_course.labels(course.path, course.per).set(course.ratio)
            if not course.over:
                continue
            incident_id = notice_id(config.location, course.path, course.per, now)
            if incident_id in self._told:
                continue
            message = course.message(limit)
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
