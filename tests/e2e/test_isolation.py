"""The instrument never disturbs itself: what the monitor serves (UI, API, auth, /metrics) cannot move
what it measures, and its listener holds up against hostile clients (issue 19).

Listener limits are tested on a real aiohttp listener over loopback; the end-to-end cases run a real
daemon probing the simulator while clients hammer its listener, and compare every stored TTFT with
the simulator's own stamps.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import sqlite3
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from monitor.metrics.server import ListenerLimits, start_metrics_server
from monitor.web.auth import hash_password
from tests.conftest import call_cli, start_sim, stop_sim
from tests.support.daemon import start_daemon, stop_daemon, wait_ready, write_config
from tests.support.ports import free_port

# Its figures are times within milliseconds: it runs while no other test runs.
pytestmark = pytest.mark.solo


async def _ready() -> tuple[bool, str]:
    return True, "ready"


@contextlib.asynccontextmanager
async def listener(limits: ListenerLimits, routes: list[web.RouteDef] | None = None):
    port = free_port()
    runner = await start_metrics_server(
        CollectorRegistry(), _ready, f"127.0.0.1:{port}", routes=routes or [], limits=limits
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _read_until_closed(reader: asyncio.StreamReader, within_s: float) -> bytes:
    return await asyncio.wait_for(reader.read(), timeout=within_s)


async def test_a_half_sent_request_is_closed_after_the_idle_timeout() -> None:
    async with listener(ListenerLimits(idle_timeout_s=0.5)) as address:
        host, port = address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        started = time.monotonic()
        await _read_until_closed(reader, within_s=5)  # returns at EOF: the server closed it
        assert time.monotonic() - started < 3
        writer.close()


async def test_connections_past_the_cap_get_one_503_and_are_closed_and_the_listener_still_answers() -> None:
    async with listener(ListenerLimits(idle_timeout_s=30, max_connections=5)) as address:
        host, port = address.split(":")
        held = []
        for _ in range(5):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
            held.append((reader, writer))
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection(host, int(port))
        answer = await _read_until_closed(reader, within_s=5)
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"Retry-After" in answer
        writer.close()
        for _, w in held:
            w.close()
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as session, session.get(f"http://{address}/healthz") as resp:
            assert resp.status == 200


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/no-such-page", "/api/v1/nothing"])
async def test_every_answer_has_the_security_headers_and_no_version_banner(path: str) -> None:
    async with (
        listener(ListenerLimits()) as address,
        aiohttp.ClientSession() as session,
        session.get(f"http://{address}{path}") as resp,
    ):
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
        assert resp.headers["Server"] == "ttft-monitor"
        assert "aiohttp" not in str(resp.headers).lower() and "python" not in str(resp.headers).lower()


async def test_a_method_not_allowed_page_has_the_security_headers() -> None:
    async with (
        listener(ListenerLimits()) as address,
        aiohttp.ClientSession() as session,
        session.post(f"http://{address}/metrics") as resp,
    ):
        assert resp.status == 405
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        assert resp.headers["Server"] == "ttft-monitor"


async def test_a_request_body_over_the_cap_is_refused() -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    async with (
        listener(ListenerLimits(max_body_bytes=1024), [web.post("/echo", echo)]) as address,
        aiohttp.ClientSession() as session,
    ):
        async with session.post(f"http://{address}/echo", data=b"x" * 100) as resp:
            assert resp.status == 200
        async with session.post(f"http://{address}/echo", data=b"x" * 5000) as resp:
            assert resp.status == 413


async def test_ui_requests_past_the_cap_are_told_to_retry_while_health_still_answers() -> None:
    release = asyncio.Event()

    async def slow(_request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done")

    limits = ListenerLimits(max_requests_in_progress=1, max_requests_waiting=0, wait_for_turn_s=5)
    async with listener(limits, [web.get("/slow", slow)]) as address, aiohttp.ClientSession() as session:
        first = asyncio.create_task(session.get(f"http://{address}/slow"))
        await asyncio.sleep(0.2)
        async with session.get(f"http://{address}/slow") as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"]
        async with session.get(f"http://{address}/healthz") as resp:
            assert resp.status == 200  # operations paths are not behind the UI's cap
        release.set()
        response = await first
        assert response.status == 200
        response.release()


async def test_a_handler_is_cancelled_when_its_client_goes_away() -> None:
    cancelled = asyncio.Event()

    async def long(_request: web.Request) -> web.Response:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response(text="late")

    async with listener(ListenerLimits(), [web.get("/long", long)]) as address:
        host, port = address.split(":")
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /long HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), timeout=5)


async def test_metrics_rendered_off_the_loop_keep_health_answering() -> None:
    registry = CollectorRegistry()
    counter = Counter("bench_many", "many series", ("a", "b"), registry=registry)
    for i in range(300):
        for j in range(40):
            counter.labels(str(i), str(j)).inc()
    port = free_port()
    runner = await start_metrics_server(registry, _ready, f"127.0.0.1:{port}")
    try:
        async with aiohttp.ClientSession() as session:
            scrape = asyncio.create_task(session.get(f"http://127.0.0.1:{port}/metrics"))
            await asyncio.sleep(0.01)
            started = time.monotonic()
            async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
            health_s = time.monotonic() - started
            response = await scrape
            body = await response.read()
            assert b'bench_many_total{a="299",b="39"} 1.0' in body
        assert health_s < 1.0
    finally:
        await runner.cleanup()


async def test_a_ui_statement_that_runs_too_long_is_abandoned_by_sqlite(tmp_path: Path) -> None:
    from sqlalchemy import text

    from monitor.store.engine import create_engine

    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/t.db", statement_timeout_s=0.3)
    endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
    try:
        async with engine.connect() as connection:
            started = time.monotonic()
            with pytest.raises(Exception, match="interrupted"):
                await connection.scalar(text(endless))
            assert time.monotonic() - started < 3
            assert await connection.scalar(text("SELECT 7")) == 7  # the connection is still usable
    finally:
        await engine.dispose()


async def test_a_ui_statement_whose_task_is_cancelled_stops_at_once(tmp_path: Path) -> None:
    # A client that goes away cancels its handler; the statement must not run on to its deadline in
    # aiosqlite's thread, spending a core the probes need.
    from sqlalchemy import text

    from monitor.store.engine import create_engine

    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/t.db", statement_timeout_s=60)
    endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"

    async def query() -> None:
        async with engine.connect() as connection:
            await connection.scalar(text(endless))

    try:
        task = asyncio.create_task(query())
        await asyncio.sleep(0.5)
        assert not task.done()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await asyncio.sleep(0.3)  # the next progress check
        cpu = time.process_time()
        await asyncio.sleep(1.0)
        assert time.process_time() - cpu < 0.3, "the cancelled statement is still running"
    finally:
        await asyncio.wait_for(engine.dispose(), 10)


# ------------------------------------------------------------------ a real daemon under hostile load

USER, PASSWORD = "ops", "correct horse"


def _hostile_config(folder: Path, sim) -> Path:
    path = write_config(folder, sim, schedule="* * * * * *")
    path.write_text(
        path.read_text()
        + f'web:\n  enabled: true\n  basic_user: "{USER}"\n  basic_password_hash: "{hash_password(PASSWORD)}"\n'
    )
    return path


async def _flood(address: str, kind: str, seconds: float) -> int:
    """Clients hammering the daemon's listener; returns how many requests (or sockets) were made."""
    host, port = address.split(":")
    deadline = time.monotonic() + seconds
    made = 0
    wrong = "Basic " + base64.b64encode(f"{USER}:wrong".encode()).decode()
    right = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    async def client(session: aiohttp.ClientSession, url: str, auth: str | None) -> None:
        nonlocal made
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url, headers={"Authorization": auth} if auth else {}) as resp:
                    await resp.read()
            made += 1

    async def half_sent() -> None:
        nonlocal made
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                await asyncio.sleep(0.1)
                continue
            made += 1
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(reader.read(), timeout=max(0.1, deadline - time.monotonic()))
            writer.close()

    base = f"http://{address}"
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        if kind == "wrong_passwords":
            jobs = [client(session, f"{base}/api/v1/series", wrong) for _ in range(30)]
        elif kind == "heavy_queries":
            jobs = [client(session, f"{base}/api/v1/compare?since=400d", right) for _ in range(15)]
            jobs += [client(session, f"{base}/api/v1/series/1/points?since=7d", right) for _ in range(15)]
        elif kind == "half_sent_sockets":
            jobs = [half_sent() for _ in range(400)]
        else:
            jobs = [client(session, f"{base}/metrics", None) for _ in range(4)]
        await asyncio.gather(*jobs)
    return made


@pytest.mark.realtime
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["wrong_passwords", "heavy_queries", "half_sent_sockets", "metrics_scrapes"])
def test_stored_ttft_stays_true_while_the_listener_is_hammered(tmp_path: Path, kind: str) -> None:
    """Before the listener had a loop of its own, 50 wrong-password clients stored 2,184-2,451 ms for a
    true 52 ms. Now every stored TTFT stays within a few ms of the simulator's own stamps, every tick
    is stored and nothing is lost."""
    sim = start_sim("--no-noise")
    daemon = None
    try:
        config = _hostile_config(tmp_path, sim)
        assert call_cli("db", "upgrade", "--config", str(config)).code == 0
        daemon = start_daemon(config, tmp_path)
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2, timeout=30)
        address = daemon.metrics_url.removeprefix("http://")
        load_started = time.time()
        # 5 s of load: with kernel stamps on both ends the overhead is ~0.1 ms, so five runs under load
        # (each with its samples) show a stored TTFT pulled away from the simulator's as 10 s did.
        made = asyncio.run(_flood(address, kind, seconds=5))
        load_ended = time.time()
        assert made > 30, f"the load did not reach the listener ({made} requests)"
        time.sleep(2.5)
        assert stop_daemon(daemon) == 0
        with sqlite3.connect(tmp_path / "ttft.db") as db:
            rows = db.execute(
                "SELECT s.request_id, s.ttft_us / 1000.0 AS ttft_ms, r.intended_at "
                "FROM samples s JOIN runs r ON r.id = s.run_id WHERE s.error IS NULL"
            ).fetchall()
            ticks = [row[0] for row in db.execute("SELECT intended_at FROM runs ORDER BY intended_at").fetchall()]
        logs = daemon.logs()
        assert not [e for e in logs if e.get("event") in ("results_lost", "database_write_failed")]
        missed = [e for e in logs if e.get("event") in ("job_runs_coalesced", "job_run_missed", "job_run_skipped")]
        assert not missed, missed
        overheads = []
        during = 0
        for request_id, ttft_ms, intended in rows:
            record = sim.get(f"/sim/requests/{request_id}")
            overheads.append(ttft_ms - (record["first_token_write_ns"] - record["received_ns"]) / 1e6)
            at = _epoch(intended)
            during += load_started <= at <= load_ended
        assert during >= 4, f"only {during} runs during the load"  # of the 5 due in it
        overheads.sort()
        median = overheads[len(overheads) // 2]
        assert median < 3.0, overheads
        assert overheads[-1] < 40.0, overheads  # was seconds under a wrong-password flood
        # One run a second: no second of the daemon's life without its run.
        seconds = sorted({_epoch(t) // 1 for t in ticks})
        gaps = [b - a for a, b in itertools.pairwise(seconds) if b - a > 1]
        assert not gaps, f"ticks missing: {gaps}"
    finally:
        if daemon is not None and daemon.process.poll() is None:
            stop_daemon(daemon)
        stop_sim(sim)


def _epoch(text: str) -> float:
    from datetime import UTC, datetime

    moment = datetime.fromisoformat(str(text).replace(" ", "T"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
