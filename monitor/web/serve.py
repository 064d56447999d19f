"""Mounting the UI: its routes for the daemon's metrics listener, and `ttft-monitor serve` alone."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import IO

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.config.models import Config
from monitor.config.urls import is_loopback
from monitor.detect.detector import Detector, Rules
from monitor.web.api import web_routes
from monitor.web.auth import Guard
from monitor.web.costs import CostBook


class WebConfigError(ValueError):
    """The `web` section cannot be used as it is; the message says how to fix it."""


def guard_from_config(config: Config, environ: Mapping[str, str]) -> Guard:
    from monitor.config.secrets import FILE_SUFFIX, SecretError, resolve_secret

    settings = config.web
    token = None
    if settings.token_env:
        name = settings.token_env
        if environ.get(name) is None and not environ.get(name + FILE_SUFFIX):
            raise WebConfigError(
                f"web.token_env names {name}, which is not set; export it (or {name}{FILE_SUFFIX}, a file "
                "holding it) or remove web.token_env"
            )
        try:
            token = resolve_secret(
                env_name=name, file=None, environ=environ, env_field="web.token_env", file_field="web.token_env"
            ).value
        except SecretError as exc:
            raise WebConfigError(str(exc)) from None
    return Guard(
        token=token,
        basic_user=settings.basic_user,
        basic_password_hash=settings.basic_password_hash,
        session_lifetime_s=settings.session_hours * 3600,
        trust_proxy_headers=settings.trust_proxy_headers,
    )


def exposure_warning(listen: str, guard: Guard) -> str | None:
    """One line when the UI is reachable beyond this machine with no auth (allowed, but said)."""
    if is_loopback(listen) or guard.enabled:
        return None
    return (
        f"the status pages on {listen} are reachable beyond this machine without auth "
        "(web.allow_unauthenticated); set web.token_env or web.basic_user/basic_password_hash to protect them"
    )


def ui_routes(
    config: Config,
    engine: AsyncEngine,
    environ: Mapping[str, str] | None = None,
    *,
    listen: str | None = None,
    listen_key: str = "metrics.listen",
    budget_holds: Callable[[], list[dict[str, str]]] | None = None,
) -> list[web.RouteDef]:
    """The UI's routes for `config` (none when `web.enabled` is false), served on `listen` (default
    `metrics.listen`). Raises WebConfigError, also when they would be reachable beyond this machine
    with no auth and `web.allow_unauthenticated` is not set."""
    if not config.web.enabled:
        return []
    from monitor.config.check import unprotected_listen
    from monitor.store.engine import describe_db_error

    problem = unprotected_listen(config, listen, key=listen_key)
    if problem:
        raise WebConfigError(problem)
    guard = guard_from_config(config, os.environ if environ is None else environ)
    url = config.database.url
    detection = config.detection
    return web_routes(
        engine,
        guard=guard,
        describe_error=lambda exc: describe_db_error(exc, url),
        thresholds={"ticket_ratio": detection.ticket.ratio, "page_ratio": detection.page.ratio},
        detector=Detector(Rules.from_config(detection)),
        costs=CostBook(config, engine),
        budget_holds=budget_holds,
    )


def ui_url(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}/"


async def serve(config: Config, listen: str, *, out: IO[str] = sys.stderr) -> int:
    """The UI and API alone, read-only, until SIGTERM/SIGINT. Exit 2 on a config error, 3 when the
    database cannot be reached or the address is taken."""
    from prometheus_client import CollectorRegistry

    from monitor.metrics.server import start_metrics_server
    from monitor.store.engine import StoreError, create_engine, describe_db_error, display_url
    from monitor.store.repository import Repository
    from monitor.store.schema import ensure_current

    if not config.web.enabled:
        config = config.model_copy(update={"web": config.web.model_copy(update={"enabled": True})})
    try:
        engine = create_engine(config.database.url)
    except StoreError as exc:  # the SQLite file's directory cannot be created
        print(f"ttft-monitor serve: {exc}", file=out)
        return 3
    try:
        try:
            routes = ui_routes(config, engine, listen=listen, listen_key="--listen")
        except WebConfigError as exc:
            print(f"ttft-monitor serve: {exc}", file=out)
            return 2
        repository = Repository(engine)
        try:
            await repository.ping()
        except Exception as exc:
            print(f"ttft-monitor serve: {describe_db_error(exc, config.database.url)}", file=out)
            return 3
        try:
            # Pages over a schema behind or missing would answer "no such table"; say what fixes it.
            await ensure_current(engine)
        except StoreError as exc:
            print(f"ttft-monitor serve: {exc}", file=out)
            return 3

        async def readiness() -> tuple[bool, str]:
            try:
                await asyncio.wait_for(repository.ping(), timeout=2)
            except Exception as exc:
                return False, f"database unreachable ({type(exc).__name__})"
            return True, "ready"

        try:
            runner = await start_metrics_server(CollectorRegistry(), readiness, listen, routes=routes)
        except OSError as exc:
            print(
                f"ttft-monitor serve: cannot listen on {listen}: {exc.strerror}; choose another --listen "
                "or stop what uses that port",
                file=out,
            )
            return 3
        try:
            warning = exposure_warning(listen, guard_from_config(config, os.environ))
            if warning:
                print(f"ttft-monitor serve: warning: {warning}", file=out)
            print(
                f"ttft-monitor serve: status pages at {ui_url(listen)} (read-only; database "
                f"{display_url(config.database.url)}). Ctrl-C stops.",
                file=out,
                flush=True,
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        await engine.dispose()
    return 0
