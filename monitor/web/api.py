"""The UI's routes: the pages, their static files, and the JSON API under /api/v1/ (docs/api.md).

Read-only: every handler only SELECTs. `web_routes` returns route definitions that the metrics
listener (`run`) or `serve` mounts; each is wrapped by the auth guard, the listener's other routes
(/metrics, /healthz, /readyz) are not.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.csvsafe import csv_row
from monitor.detect.detector import Detector
from monitor.web import queries
from monitor.web.auth import COOKIE, Guard

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
API = "/api/v1"
PAGES = {"/": "overview.html", "/series": "series.html", "/compare": "compare.html", "/incidents": "incidents.html"}
_CONTENT_TYPES = {".html": "text/html", ".js": "application/javascript", ".css": "text/css", ".txt": "text/plain"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|h|d|w)\s*$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_RANGE = timedelta(days=400)


class BadRequest(ValueError):
    """A query parameter that cannot be used; the message names it and what to send instead."""


def parse_duration(text: str, name: str = "since") -> timedelta:
    """'6h', '24h', '7d', '30d', '90d', '15m', '2w'."""
    match = _DURATION.match(text)
    if match is None:
        raise BadRequest(f"{name}={text!r} is not a duration; use a number and m, h, d or w, e.g. 24h or 7d")
    value = timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])
    if value <= timedelta(0) or value > MAX_RANGE:
        raise BadRequest(f"{name}={text!r} is out of range; use more than 0 and at most 400d")
    return value


def parse_time(text: str, name: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{name}={text!r} is not an ISO 8601 time; use e.g. 2026-03-02T09:00:00Z") from None
    if moment.tzinfo is None:
        raise BadRequest(f"{name}={text!r} has no time zone; add Z or an offset")
    return moment.astimezone(UTC)


def time_window(query: Mapping[str, str], now: datetime, default: str) -> tuple[datetime, datetime]:
    """[start, end) from `start`/`end` (ISO) or `since` (a duration back from `end` or now)."""
    end = parse_time(query["end"], "end") if query.get("end") else now
    if query.get("start"):
        start = parse_time(query["start"], "start")
    else:
        start = end - parse_duration(query.get("since") or default)
    if start >= end:
        raise BadRequest("start must be before end")
    if end - start > MAX_RANGE:
        raise BadRequest("the range is longer than 400 days; narrow start/end")
    return start, end


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as CSV; nested values (lists, mappings) as JSON in their cell; no cell a spreadsheet would
    run as a formula (`csv_cell`)."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(csv_row(columns))
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column)
            cells.append(json.dumps(value) if isinstance(value, (list, dict)) else "" if value is None else value)
        writer.writerow(csv_row(cells))
    return out.getvalue()


def _respond(
    request: web.Request, payload: dict[str, Any], rows: Sequence[Mapping[str, Any]], name: str
) -> web.Response:
    if request.query.get("format", "json") == "csv":
        return web.Response(
            text=to_csv(rows),
            content_type="text/csv",
            headers={**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{name}.csv"'},
        )
    if request.query.get("format", "json") != "json":
        raise BadRequest(f"format={request.query['format']!r} is not known; use json or csv")
    return web.json_response(payload, headers=SECURITY_HEADERS)


def static_files() -> dict[str, bytes]:
    """Every file of monitor/web/static, read once."""
    folder = resources.files("monitor.web") / "static"
    return {item.name: item.read_bytes() for item in folder.iterdir() if item.is_file()}


def _content_type(name: str) -> str:
    return next((kind for suffix, kind in _CONTENT_TYPES.items() if name.endswith(suffix)), "application/octet-stream")


def web_routes(
    engine: AsyncEngine,
    *,
    guard: Guard | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    describe_error: Callable[[BaseException], str] = lambda exc: type(exc).__name__,
    thresholds: Mapping[str, float] | None = None,
    detector: Detector | None = None,
) -> list[web.RouteDef]:
    """The pages, /static/*, /login and /api/v1/*, for an aiohttp application. `detector` (the
    config's detection rules) draws the series view's baseline."""
    guard = guard or Guard()
    files = static_files()
    overview_cache = queries.OverviewCache()

    def guarded(handler: Handler, *, api: bool) -> Handler:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            if not guard.allows(request.headers.get("Authorization"), request.cookies.get(COOKIE)):
                return _denied(api=api)
            try:
                return await handler(request)
            except BadRequest as exc:
                return web.json_response({"error": str(exc)}, status=400, headers=SECURITY_HEADERS)
            except queries.NotFound as exc:
                return web.json_response({"error": str(exc)}, status=404, headers=SECURITY_HEADERS)
            except web.HTTPException:
                raise
            except Exception as exc:
                return web.json_response(
                    {"error": f"database: {describe_error(exc)}"}, status=503, headers=SECURITY_HEADERS
                )

        return wrapper

    def _denied(*, api: bool) -> web.Response:
        headers = dict(SECURITY_HEADERS)
        if guard.basic_user is not None and not guard.token:
            headers["WWW-Authenticate"] = 'Basic realm="ttft-monitor", charset="UTF-8"'
        if api or not guard.token:
            return web.json_response({"error": "authentication required"}, status=401, headers=headers)
        return web.Response(body=files["login.html"], status=401, content_type="text/html", headers=headers)

    def page(name: str) -> Handler:
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(body=files[name], content_type="text/html", headers=SECURITY_HEADERS)

        return handler

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in files:
            raise web.HTTPNotFound()
        return web.Response(body=files[name], content_type=_content_type(name), headers=SECURITY_HEADERS)

    async def login_page(_request: web.Request) -> web.Response:
        return web.Response(body=files["login.html"], content_type="text/html", headers=SECURITY_HEADERS)

    async def login(request: web.Request) -> web.Response:
        form = await request.post()
        candidate = form.get("token")
        if not guard.token or not isinstance(candidate, str) or not guard.token_matches(candidate):
            return web.Response(
                body=files["login.html"], status=401, content_type="text/html", headers=SECURITY_HEADERS
            )
        response = web.Response(status=303, headers={**SECURITY_HEADERS, "Location": "/"})
        response.set_cookie(COOKIE, guard.session_value(), httponly=True, samesite="Strict", path="/")
        return response

    async def series(request: web.Request) -> web.Response:
        at = now()
        rows = await queries.overview(engine, now=at, cache=overview_cache)
        return _respond(request, {"now": queries.iso(at), "series": rows}, rows, "series")

    async def points(request: web.Request) -> web.Response:
        try:
            series_id = int(request.match_info["id"])
        except ValueError:
            raise BadRequest("the series id must be a whole number (see /api/v1/series)") from None
        start, end = time_window(request.query, now(), "24h")
        max_points = _whole(request.query.get("max_points"), queries.MAX_POINTS, "max_points", 10, queries.MAX_POINTS)
        result = await queries.series_points(
            engine, series_id, start=start, end=end, max_points=max_points, detector=detector
        )
        # The detector's ratios (from the config), so the page draws where tickets and pages begin.
        result["thresholds"] = dict(thresholds) if thresholds else None
        return _respond(request, result, result["points"], f"series-{series_id}")

    async def incidents(request: web.Request) -> web.Response:
        start, end = time_window(request.query, now(), "30d")
        items = await queries.incidents(engine, start=start, end=end)
        return _respond(
            request, {"start": queries.iso(start), "end": queries.iso(end), "incidents": items}, items, "incidents"
        )

    async def compare(request: web.Request) -> web.Response:
        start, end = time_window(request.query, now(), "7d")
        result = await queries.compare(
            engine,
            start=start,
            end=end,
            targets=request.query.getall("target", []),
            prompts=request.query.getall("prompt", []),
            locations=request.query.getall("location", []),
        )
        table = request.query.get("table", "cells")
        if table not in ("cells", "pairs", "slopes"):
            raise BadRequest(f"table={table!r} is not known; use cells, pairs or slopes")
        return _respond(request, result, result[table], f"compare-{table}")

    routes = [web.get(path, guarded(page(name), api=False)) for path, name in PAGES.items()]
    routes += [
        web.get("/static/{name}", guarded(static, api=False)),
        web.get("/login", login_page),
        web.post("/login", login),
        web.get(f"{API}/series", guarded(series, api=True)),
        web.get(API + "/series/{id}/points", guarded(points, api=True)),
        web.get(f"{API}/incidents", guarded(incidents, api=True)),
        web.get(f"{API}/compare", guarded(compare, api=True)),
    ]
    return routes


def _whole(text: str | None, default: int, name: str, low: int, high: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r} is not a whole number") from None
    if not low <= value <= high:
        raise BadRequest(f"{name}={value} is out of range; use {low} to {high}")
    return value
