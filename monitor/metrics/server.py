"""`/metrics`, `/healthz` and `/readyz` on a small aiohttp runner that cleans up after itself."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

ReadinessCheck = Callable[[], Awaitable[tuple[bool, str]]]


def build_app(
    registry: CollectorRegistry, readiness: ReadinessCheck, routes: Sequence[web.RouteDef] = ()
) -> web.Application:
    """`routes` are served beside these three on the same listener (the web UI, monitor.web.api)."""

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        ready, reason = await readiness()
        return web.Response(text=f"{reason}\n", status=200 if ready else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.add_routes(routes)
    return app


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def start_metrics_server(
    registry: CollectorRegistry, readiness: ReadinessCheck, listen: str, *, routes: Sequence[web.RouteDef] = ()
) -> web.AppRunner:
    runner = web.AppRunner(build_app(registry, readiness, routes), access_log=None, handle_signals=False)
    await runner.setup()
    host, port = split_listen(listen)
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
