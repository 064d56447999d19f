"""What the daemon serves and delivers, opened on its service loop (monitor.service_loop).

`open_served` runs there and opens, on engines of its own: the listener (`/metrics`, health, the UI
and API), the alert dispatcher and housekeeping (rollups, retention). The probes' loop keeps the
scheduler, the timed client, the writer and detection; detection enqueues notifications in the
database from there and wakes this loop's dispatcher with a thread-safe call.

The UI's engine is small (one connection per request it handles at once) and its statements are
abandoned by the database after `UI_STATEMENT_TIMEOUT_S`; housekeeping's engine has no such bound,
a rollup may legitimately take a while, and neither can take a connection from the probes' pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.dispatcher import Dispatcher
from monitor.alert.metrics import AlertMetrics
from monitor.alert.settings import Alerts
from monitor.alert.transport import Transport
from monitor.config.models import ColdPolicy, Config, Database
from monitor.metrics.definitions import Metrics
from monitor.metrics.server import ListenerLimits, start_metrics_server
from monitor.probe.proxy import ProxyEnvironment
from monitor.schedule.maintenance import Housekeeping, run_maintenance
from monitor.store.engine import create_engine
from monitor.store.repository import Repository
from monitor.store.writer import WriteOutcome
from monitor.tasks import finish_tasks

UI_STATEMENT_TIMEOUT_S = 10.0
HOUSEKEEPING_POOL = 3
# The probes' loop beats every LOOP_LAG_INTERVAL_S (monitor.daemon); this long without a beat means it is stuck.
PROBE_LOOP_STUCK_S = 5.0


@dataclass(frozen=True, slots=True)
class ProbeSide:
    """What readiness reads from the probes' loop: plain values, safe to read from this thread."""

    scheduler_running: Callable[[], bool]
    last_beat: Callable[[], float]  # time.monotonic() of the probes' loop's last turn
    last_write: Callable[[], WriteOutcome | None] = lambda: None  # the writer's last database write
    # The jobs crossed budgets hold (reduced, paused), as JSON objects, for the overview.
    budget_holds: Callable[[], list[dict[str, str]]] = lambda: []


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """The listener, the dispatcher and housekeeping; `close(grace_s)` stops them in that order of need."""

    runner: web.AppRunner
    dispatcher: Dispatcher
    transport: Transport
    engines: list[AsyncEngine]
    tasks: list[asyncio.Task[None]]
    stop: asyncio.Event  # set to stop the dispatcher's and housekeeping's tasks
    housekeeping: Housekeeping

    def update_alerts(self, alerts: Alerts) -> None:
        self.dispatcher.update_config(alerts)

    def update_housekeeping(self, database: Database, cold: ColdPolicy | None) -> None:
        """A reload's retention and cold tier policy, from housekeeping's next pass (its engine stays)."""
        self.housekeeping.database = database
        self.housekeeping.cold = cold

    async def close(self, grace_s: float) -> None:
        """Deliver what is due within `grace_s`, then close the listener, the session and the engines."""
        self.stop.set()
        await finish_tasks(self.tasks, max(0.5, grace_s))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.runner.cleanup(), timeout=3)
        with contextlib.suppress(Exception):
            await self.transport.close()
        for engine in self.engines:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.dispose(), timeout=2)


async def open_served(
    config: Config,
    *,
    metrics: Metrics,
    alert_metrics: AlertMetrics | None,
    probe_side: ProbeSide,
    limits: ListenerLimits | None = None,
) -> Served:
    """Open everything on the running (service) loop. Raises WebConfigError (a bad `web` section)
    or OSError (the listen address), after closing what it had opened."""
    from monitor.web.serve import ui_routes

    limits = limits or ListenerLimits()
    url = config.database.url
    ui_engine = create_engine(
        url,
        pool_size=limits.max_requests_in_progress,
        max_overflow=0,
        pool_timeout=limits.wait_for_turn_s,
        statement_timeout_s=UI_STATEMENT_TIMEOUT_S,
    )
    house_engine = create_engine(url, pool_size=HOUSEKEEPING_POOL, max_overflow=2)
    engines = [ui_engine, house_engine]
    transport = Transport(proxies=ProxyEnvironment.from_environ(os.environ))
    await transport.__aenter__()
    stop = asyncio.Event()
    house = Repository(house_engine)

    async def readiness() -> tuple[bool, str]:
        if not probe_side.scheduler_running():
            return False, "scheduler not running"
        stuck = time.monotonic() - probe_side.last_beat()
        if stuck > PROBE_LOOP_STUCK_S:
            return False, f"the probes' event loop has not turned for {stuck:.0f} s"
        try:
            async with asyncio.timeout(2):
                await house.ping()
        except TimeoutError:
            metrics.database_up.set(0)
            return False, "database unreachable (no answer within 2 s)"
        except Exception as exc:
            metrics.database_up.set(0)
            return False, f"database unreachable ({type(exc).__name__})"
        write = probe_side.last_write()
        if write is not None and not write.ok:  # it answers, yet takes no write (a standby, a read-only flag)
            metrics.database_up.set(0)
            return False, f"database writes fail: {write.error}"
        metrics.database_up.set(1)
        return True, "ready"

    try:
        routes = ui_routes(config, ui_engine, budget_holds=probe_side.budget_holds)
        runner = await start_metrics_server(
            metrics.registry, readiness, config.metrics.listen, routes=routes, limits=limits
        )
    except BaseException:
        await transport.close()
        for engine in engines:
            await engine.dispose()
        raise
    dispatcher = Dispatcher(house_engine, config.alerts, transport, metrics=alert_metrics)
    housekeeping = Housekeeping(config.database, config.cold_policy())
    tasks = [
        asyncio.create_task(dispatcher.run(stop)),
        asyncio.create_task(run_maintenance(house, housekeeping, stop)),
    ]
    structlog.get_logger().debug("service_loop_serving", listen=config.metrics.listen, ui=bool(routes))
    return Served(
        runner=runner,
        dispatcher=dispatcher,
        transport=transport,
        engines=engines,
        tasks=tasks,
        stop=stop,
        housekeeping=housekeeping,
    )
