"""The UI's routes: the pages, their static files, and the JSON API under /api/v1/ (docs/api.md).

Read-only: every handler only SELECTs. `web_routes` returns route definitions that the metrics
listener (`run`) or `serve` mounts; each is wrapped by the auth guard, the listener's other routes
(/metrics, /healthz, /readyz) are not.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.csvsafe import csv_row
from monitor.detect.detector import Detector
from monitor.metrics.server import SECURITY_HEADERS
from monitor.store.engine import StoreError
from monitor.timefmt import iso
from monitor.web.auth import COOKIE, Authenticator, Guard, Outcome, Verdict, client_address, forwarded_https
from monitor.web.costs import CostBook, cost_fields
from monitor.web.errors import NotFound, TooBroad

if TYPE_CHECKING:
    from monitor.web import queries

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
API = "/api/v1"
PAGES = {"/": "overview.html", "/series": "series.html", "/compare": "compare.html", "/incidents": "incidents.html"}
PAGE_TEMPLATE = "page.html"
_CONTENT_TYPES = {".html": "text/html", ".js": "application/javascript", ".css": "text/css", ".txt": "text/plain"}
# ASCII only: `\d` and float() also take fullwidth and other Unicode digits, and float() takes `1_0`.
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(m|h|d|w)\s*", re.ASCII)
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WHOLE = re.compile(r"-?[0-9]+", re.ASCII)
_ISO_CHARACTERS = re.compile(r"[0-9T:.,+\-Z ]{1,40}", re.ASCII)
# Series ids are BIGINT on PostgreSQL (and SQLite's INTEGER): a larger number cannot be an id, and
# binding it would fail in the driver as if the database were down.
MAX_ID = 2**63 - 1
# Times the queries can step back and forth from (baselines reach weeks back) without leaving
# datetime's years 1-9999.
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)
MAX_RANGE = timedelta(days=400)


class BadRequest(ValueError):
    """A query parameter that cannot be used; the message names it and what to send instead."""


def parse_duration(text: str, name: str = "since") -> timedelta:
    """'6h', '24h', '7d', '30d', '90d', '15m', '2w'."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise BadRequest(f"{name}={_shown(text)} is not a duration; use a number and m, h, d or w, e.g. 24h or 7d")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    # Compared before timedelta() is built: a large number would overflow it.
    if not 0 < seconds <= MAX_RANGE.total_seconds():
        raise BadRequest(f"{name}={_shown(text)} is out of range; use more than 0 and at most 400d")
    return timedelta(seconds=seconds)


def parse_time(text: str, name: str) -> datetime:
    not_a_time = BadRequest(f"{name}={_shown(text)} is not an ISO 8601 time; use e.g. 2026-03-02T09:00:00Z")
    if _ISO_CHARACTERS.fullmatch(text) is None:
        raise not_a_time
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise not_a_time from None
    if moment.tzinfo is None:
        raise BadRequest(f"{name}={_shown(text)} has no time zone; add Z or an offset")
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+23:59 is before year 1 in UTC
        moment = EARLIEST - timedelta(days=1)
    if not EARLIEST <= moment < LATEST:
        raise BadRequest(f"{name}={_shown(text)} is out of range; use a time from 1970 to 8999")
    return moment


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
    request: web.Request, payload: Mapping[str, object], rows: Sequence[Mapping[str, Any]], name: str
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
    """Every file of monitor/web/static, read once, and the pages made from its one page template."""
    folder = resources.files("monitor.web") / "static"
    files = {item.name: item.read_bytes() for item in folder.iterdir() if item.is_file()}
    # The pages differ only in their title and script, so they share one head; the template itself is not served.
    template = files.pop(PAGE_TEMPLATE).decode("utf-8")
    for name in PAGES.values():
        stem = name.removesuffix(".html")
        page = template.replace("{title}", stem.capitalize()).replace("{script}", f"{stem}.js")
        files[name] = page.encode("utf-8")
    return files


def _content_type(name: str) -> str:
    return next((kind for suffix, kind in _CONTENT_TYPES.items() if name.endswith(suffix)), "application/octet-stream")


def came_over_https(request: web.Request, *, trust_proxy_headers: bool) -> bool:
    """TLS on this connection, or (only when told to trust the proxy) `X-Forwarded-Proto: https`."""
    forwarded = request.headers.get("X-Forwarded-Proto") if trust_proxy_headers else None
    return request.secure or forwarded_https(forwarded)


def web_routes(
    engine: AsyncEngine,
    *,
    guard: Guard | None = None,
    authenticator: Authenticator | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    describe_error: Callable[[BaseException], str] = lambda exc: type(exc).__name__,
    thresholds: Mapping[str, float] | None = None,
    detector: Detector | None = None,
    costs: CostBook | None = None,
    budget_holds: Callable[[], list[dict[str, str]]] | None = None,
) -> list[web.RouteDef]:
    """The pages, /static/*, /login, /logout and /api/v1/*, for an aiohttp application. `guard` says
    who may see them (`authenticator`, when given, carries a guard and its limiter, cache and verifier
    threads). `detector` (the config's detection rules) draws the series view's baseline."""
    auth = authenticator or Authenticator(guard or Guard())
    guard = auth.guard
    files = static_files()
    if guard.token:
        # The pages' header shows a sign-out button only where there is a session to end.
        files.update(
            {
                name: body.replace(b"<body>", b'<body data-signout="1">', 1)
                for name, body in files.items()
                if name.endswith(".html")
            }
        )
    # The queries are imported by the first view asked for, not when the routes are mounted: a daemon
    # whose pages nobody opens does not hold them (about 3 MB of its resident memory).
    overview_caches: list[queries.OverviewCache] = []
    trust = guard.trust_proxy_headers

    def address_of(request: web.Request) -> str:
        return client_address(request.remote, request.headers.get("X-Forwarded-For"), trust_proxy_headers=trust)

    def guarded(handler: Handler, *, api: bool) -> Handler:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            verdict = await auth.check(
                authorization=request.headers.get("Authorization"),
                cookie=request.cookies.get(COOKIE),
                address=address_of(request),
            )
            if not verdict.allowed:
                return _denied(verdict, api=api)
            try:
                return await handler(request)
            except BadRequest as exc:
                return web.json_response({"error": str(exc)}, status=400, headers=SECURITY_HEADERS)
            except TooBroad as exc:
                return web.json_response({"error": str(exc)}, status=400, headers=SECURITY_HEADERS)
            except NotFound as exc:
                return web.json_response({"error": str(exc)}, status=404, headers=SECURITY_HEADERS)
            except web.HTTPException:
                raise
            except Exception as exc:
                return _failed(request, exc)

        return wrapper

    def _failed(request: web.Request, exc: Exception) -> web.Response:
        # The answer names the class of problem only; where the database lives (a file path, a host)
        # and the driver's words go to the log, for whoever runs the monitor.
        database = isinstance(exc, (SQLAlchemyError, OSError, StoreError))
        structlog.get_logger().error(
            "web_request_failed", path=request.path, error_class=type(exc).__name__, error=describe_error(exc)
        )
        if database:
            message, status = "database unavailable; the monitor's log says why", 503
        else:
            message, status = f"internal error ({type(exc).__name__}); the monitor's log says more", 500
        return web.json_response({"error": message}, status=status, headers=SECURITY_HEADERS)

    def _denied(verdict: Verdict, *, api: bool) -> web.Response:
        headers = dict(SECURITY_HEADERS)
        if verdict.outcome is Outcome.THROTTLED:
            headers["Retry-After"] = str(max(1, math.ceil(verdict.retry_after_s)))
            message = "too many failed sign-ins from this address; try again after Retry-After seconds"
            return web.json_response({"error": message}, status=429, headers=headers)
        if verdict.outcome is Outcome.BUSY:
            headers["Retry-After"] = str(max(1, math.ceil(verdict.retry_after_s)))
            message = "too many password checks at once; try again shortly"
            return web.json_response({"error": message}, status=503, headers=headers)
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

    def _login_refused(status: int, headers: Mapping[str, str] | None = None) -> web.Response:
        return web.Response(
            body=files["login.html"],
            status=status,
            content_type="text/html",
            headers={**SECURITY_HEADERS, **(headers or {})},
        )

    async def login(request: web.Request) -> web.Response:
        if not guard.token:
            return _login_refused(401)  # basic auth or none: there is no token to sign in with
        address = address_of(request)
        refusal = auth.throttled(address, method="login")
        if refusal is not None:  # refused before the body is even read
            return _login_refused(429, {"Retry-After": str(max(1, math.ceil(refusal.retry_after_s)))})
        form = await request.post()
        candidate = form.get("token")
        verdict = auth.login(candidate if isinstance(candidate, str) else "", address)
        if verdict.outcome is Outcome.THROTTLED:
            return _login_refused(429, {"Retry-After": str(max(1, math.ceil(verdict.retry_after_s)))})
        if not verdict.allowed:
            return _login_refused(401)
        response = web.Response(status=303, headers={**SECURITY_HEADERS, "Location": "/"})
        response.set_cookie(
            COOKIE,
            auth.new_session(),
            max_age=int(guard.session_lifetime_s),
            httponly=True,
            samesite="Strict",
            path="/",
            secure=came_over_https(request, trust_proxy_headers=trust),
        )
        return response

    async def logout(request: web.Request) -> web.Response:
        # The cookie is cleared in this browser; the session is stateless, so a copy of the cookie stays
        # valid until it expires (web.session_hours). Changing the token ends every session at once.
        response = web.Response(status=303, headers={**SECURITY_HEADERS, "Location": "/login"})
        response.del_cookie(
            COOKIE, path="/", secure=came_over_https(request, trust_proxy_headers=trust), samesite="Strict"
        )
        return response

    async def series(request: web.Request) -> web.Response:
        from monitor.web import queries

        at = now()
        if not overview_caches:
            overview_caches.append(queries.OverviewCache())
        rows = await queries.overview(
            engine,
            now=at,
            cache=overview_caches[0],
            min_history_runs=detector.rules.min_history_runs if detector else None,
        )
        if costs is not None:  # what probing each series costs a month, beside its TTFT
            book = await costs.get()
            for row in rows:
                row.update(cost_fields(book, row["target"], row["prompt"]))
        # Jobs a crossed budget holds (`budget.*.action`): the overview says so above the table.
        holds = budget_holds() if budget_holds is not None else []
        return _respond(request, {"now": iso(at), "series": rows, "budget_holds": holds}, rows, "series")

    async def points(request: web.Request) -> web.Response:
        from monitor.web import queries

        series_id = parse_id(request.match_info["id"])
        start, end = time_window(request.query, now(), "24h")
        max_points = _whole(request.query.get("max_points"), queries.MAX_POINTS, "max_points", 10, queries.MAX_POINTS)
        result = await queries.series_points(
            engine, series_id, start=start, end=end, max_points=max_points, detector=detector
        )
        # The detector's ratios (from the config), so the page draws where tickets and pages begin.
        result["thresholds"] = dict(thresholds) if thresholds else None
        if costs is not None:
            info = result["series"]
            result.update(cost_fields(await costs.get(), info["target"], info["prompt"]))
        return _respond(request, result, result["points"], f"series-{series_id}")

    async def incidents(request: web.Request) -> web.Response:
        from monitor.web import queries

        start, end = time_window(request.query, now(), "30d")
        items = await queries.incidents(engine, start=start, end=end)
        return _respond(request, {"start": iso(start), "end": iso(end), "incidents": items}, items, "incidents")

    async def compare(request: web.Request) -> web.Response:
        from monitor.web import queries

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
        tables = {
            "cells": result["cells"],
            "pairs": result["pairs"],
            "slopes": result["slopes"],
            "cache": result["cache"],
        }
        if table not in tables:
            raise BadRequest(f"table={table!r} is not known; use cells, pairs, slopes or cache")
        return _respond(request, result, tables[table], f"compare-{table}")

    routes = [web.get(path, guarded(page(name), api=False)) for path, name in PAGES.items()]
    routes += [
        web.get("/static/{name}", guarded(static, api=False)),
        web.get("/login", login_page),
        web.post("/login", login),
        web.post("/logout", logout),
        web.get(f"{API}/series", guarded(series, api=True)),
        web.get(API + "/series/{id}/points", guarded(points, api=True)),
        web.get(f"{API}/incidents", guarded(incidents, api=True)),
        web.get(f"{API}/compare", guarded(compare, api=True)),
    ]
    return routes


def _shown(text: str) -> str:
    """A parameter's value for a message: quoted, and cut short (a URL may carry 8 KB of digits)."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


def parse_id(text: str) -> int:
    """A series id from the path: ASCII digits within the database's integer range."""
    if _WHOLE.fullmatch(text) is None:
        raise BadRequest(f"the series id {_shown(text)} must be a whole number from 1 to {MAX_ID} (see /api/v1/series)")
    # The length first: int() refuses numbers of more than 4,300 digits.
    if len(text) > len(str(MAX_ID)) or not 1 <= int(text) <= MAX_ID:
        raise BadRequest(f"the series id {_shown(text)} is out of range; use a whole number from 1 to {MAX_ID}")
    return int(text)


def _whole(text: str | None, default: int, name: str, low: int, high: int) -> int:
    if text is None:
        return default
    if _WHOLE.fullmatch(text) is None:
        raise BadRequest(f"{name}={_shown(text)} is not a whole number; use {low} to {high}")
    if len(text) > 18 or not low <= int(text) <= high:
        raise BadRequest(f"{name}={_shown(text)} is out of range; use {low} to {high}")
    return int(text)
