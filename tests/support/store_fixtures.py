"""Fixtures for the store suite (tests/integration/test_store_*.py and others load this with `pytest_plugins`).

The `backend` fixture runs a test on SQLite and on PostgreSQL. PostgreSQL's address comes from one
environment variable, TTFT_TEST_POSTGRES_URL (e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test;
`.ci/run` sets it). The session creates its own database `ttft_test_<random>` there, migrated to
head, and every test gets a fresh copy of it (CREATE DATABASE ... TEMPLATE), so parallel runs and
tests never see each other's rows. All of them are dropped at the end.

Without the variable the PostgreSQL cases are skipped, and the terminal summary says so loudly
(tests/conftest.py counts them).

PYTEST_DONT_REWRITE: the test modules import helpers from here before `pytest_plugins` loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import random
import shutil
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.probe.result import ErrorClass, Sample, TimingPath
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.records import RunRecord, runs_from_samples, sample_id_of
from tests.conftest import POSTGRES_ENV

BACKENDS = ("sqlite", "postgres")


def postgres_url() -> str | None:
    return os.environ.get(POSTGRES_ENV) or None


def _dsn(url: str) -> str:
    """The asyncpg form of a SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@dataclass
class PostgresServer:
    admin_url: str  # the database named by TTFT_TEST_POSTGRES_URL, used to create and drop others
    template: str  # this session's database, migrated to head
    prefix: str
    _counter: Iterator[int] = field(default_factory=itertools.count)

    async def _admin(self, *statements: str) -> None:
        connection = await asyncpg.connect(_dsn(self.admin_url))
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    async def create(self, *, empty: bool = False) -> str:
        """A new database: a copy of the migrated template, or `empty`; returns its URL."""
        name = f"{self.prefix}_{next(self._counter)}"
        source = "template0" if empty else self.template
        await self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        return _with_database(self.admin_url, name)

    async def drop(self, url: str) -> None:
        name = make_url(url).database
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer | None]:
    admin_url = postgres_url()
    if admin_url is None:
        yield None
        return
    prefix = f"ttft_test_{uuid.uuid4().hex[:10]}"
    server = PostgresServer(admin_url=admin_url, template=prefix, prefix=prefix)

    async def set_up() -> None:
        try:
            await server._admin(f'CREATE DATABASE "{prefix}"')
        except (OSError, asyncpg.PostgresError) as exc:
            raise RuntimeError(
                f"{POSTGRES_ENV} is set but PostgreSQL cannot be used ({type(exc).__name__}: {exc}); "
                "start it (pg_ctlcluster --skip-systemctl-redirect 15 main start) or unset the variable"
            ) from exc
        await migrate.upgrade(_with_database(admin_url, prefix))

    async def tear_down() -> None:
        connection = await asyncpg.connect(_dsn(admin_url))
        try:
            names = await connection.fetch(
                "SELECT datname FROM pg_database WHERE datname LIKE $1", prefix.replace("_", r"\_") + "%"
            )
            for row in names:
                await connection.execute(f'DROP DATABASE IF EXISTS "{row["datname"]}" WITH (FORCE)')
        finally:
            await connection.close()

    asyncio.run(set_up())
    try:
        yield server
    finally:
        asyncio.run(tear_down())


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once; tests get copies (migrating each would cost seconds)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "store.db"
    asyncio.run(migrate.upgrade(f"sqlite+aiosqlite:///{path}"))
    return path


@dataclass
class Backend:
    name: str
    url: str

    def engine(self, **kwargs: Any) -> AsyncEngine:
        return create_engine(self.url, **kwargs)


def _skip_without_postgres(request: pytest.FixtureRequest) -> None:
    pytest.skip(f"PostgreSQL case skipped: {POSTGRES_ENV} is not set (see tests/support/store_fixtures.py)")


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    postgres_server: PostgresServer | None,
    sqlite_template: Path,
) -> AsyncIterator[Backend]:
    """A database migrated to head, fresh for this test."""
    if request.param == "sqlite":
        shutil.copyfile(sqlite_template, tmp_path / "store.db")
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'store.db'}")
        return
    if postgres_server is None:
        _skip_without_postgres(request)
    assert postgres_server is not None
    url = await postgres_server.create()
    try:
        yield Backend("postgres", url)
    finally:
        await postgres_server.drop(url)


@pytest.fixture
async def twin(backend: Backend, tmp_path: Path, postgres_server: PostgresServer | None) -> AsyncIterator[Backend]:
    """A second database of the test's backend, migrated: one never compacted, say, to compare with."""
    if backend.name == "sqlite":
        path = Path(make_url(backend.url).database or "")
        shutil.copyfile(path, tmp_path / "twin.db")
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'twin.db'}")
        return
    assert postgres_server is not None
    url = await postgres_server.create()
    try:
        yield Backend("postgres", url)
    finally:
        await postgres_server.drop(url)


@pytest.fixture(params=BACKENDS)
async def empty_backend(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_server: PostgresServer | None
) -> AsyncIterator[Backend]:
    """A database with no tables at all."""
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'empty' / 'store.db'}")
        return
    if postgres_server is None:
        _skip_without_postgres(request)
    assert postgres_server is not None
    url = await postgres_server.create(empty=True)
    try:
        yield Backend("postgres", url)
    finally:
        await postgres_server.drop(url)


@pytest.fixture
async def postgres_backend(
    request: pytest.FixtureRequest, postgres_server: PostgresServer | None
) -> AsyncIterator[Backend]:
    """A PostgreSQL database migrated to head, for what only PostgreSQL has."""
    if postgres_server is None:
        _skip_without_postgres(request)
    assert postgres_server is not None
    url = await postgres_server.create()
    try:
        yield Backend("postgres", url)
    finally:
        await postgres_server.drop(url)


@pytest.fixture
async def engine(backend: Backend) -> AsyncIterator[AsyncEngine]:
    engine = backend.engine()
    try:
        yield engine
    finally:
        await engine.dispose()


# ---------------------------------------------------------------- an outage you can switch


class TcpProxy:
    """A real TCP proxy between the app and PostgreSQL. `cut()` closes every connection and refuses
    new ones (what a crashed server or a restart looks like to the client); `restore()` reopens."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer)),
            asyncio.ensure_future(self._pipe(up_reader, writer)),
        ]
        self._tasks.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)
        self._tasks.difference_update(pipes)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0.05)

    async def restore(self) -> None:
        await self.start()

    async def close(self) -> None:
        await self.cut()


class SqliteLock:
    """Another connection holding SQLite's exclusive lock: every write of ours times out as `locked`,
    as when the file is unusable. (chmod would not do: the tests may run as root.)"""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._connection: sqlite3.Connection | None = None

    async def cut(self) -> None:
        self._connection = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        self._connection.execute("BEGIN EXCLUSIVE")

    async def restore(self) -> None:
        if self._connection is not None:
            self._connection.execute("ROLLBACK")
            self._connection.close()
            self._connection = None

    async def close(self) -> None:
        await self.restore()


@dataclass
class Outage:
    """A database the app reaches through something the test can break: `cut()` and `restore()`."""

    app_url: str  # what the code under test connects to
    cut: Callable[[], Any]
    restore: Callable[[], Any]
    sqlite_busy_timeout_ms: int = 5000


@pytest.fixture
async def outage(backend: Backend) -> AsyncIterator[Outage]:
    if backend.name == "sqlite":
        path = Path(make_url(backend.url).database or "")
        lock = SqliteLock(path)
        try:
            yield Outage(backend.url, lock.cut, lock.restore, sqlite_busy_timeout_ms=50)
        finally:
            await lock.close()
        return
    parsed = make_url(backend.url)
    proxy = TcpProxy(parsed.host or "127.0.0.1", parsed.port or 5432)
    await proxy.start()
    app_url = parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        yield Outage(app_url, proxy.cut, proxy.restore)
    finally:
        await proxy.close()


# ---------------------------------------------------------------- realistic samples


T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
PROVIDERS = {"qwen3-8b": "vllm", "gpt-4o-mini": "openai"}


def make_samples(
    target: str = "qwen3-8b",
    prompt: str = "short",
    *,
    at: datetime = T0,
    rounds: int = 5,
    warmup: int = 1,
    rng: random.Random | None = None,
    errors: dict[int, ErrorClass] | None = None,
) -> list[Sample]:
    """One series' samples of one run, with every field filled as the probe would."""
    rng = rng or random.Random(f"{target}/{prompt}/{at.isoformat()}")
    errors = errors or {}
    out = []
    for index in range(warmup + rounds):
        sent = at + timedelta(seconds=index * 1.3, microseconds=rng.randrange(1_000_000))
        ttft = rng.lognormvariate(5.5, 0.3)
        error = errors.get(index + 1)
        fresh = index == 0
        sample = Sample(
            target=target,
            model="Qwen/Qwen3-8B" if target == "qwen3-8b" else target,
            api="openai-chat",
            prompt=prompt,
            round=index + 1,
            warmup=index < warmup,
            intended_at=at,
            sent_at=sent,
            dns_ms=rng.uniform(0.2, 3) if fresh else None,
            connect_ms=rng.uniform(0.3, 2) if fresh else None,
            tls_ms=rng.uniform(5, 20) if fresh else None,
            connection_reused=not fresh,
            setup_ms=rng.uniform(0.05, 30),
            ttfb_ms=ttft * 0.2,
            first_event_ms=ttft * 0.6,
            ttft_ms=None if error else ttft,
            ttfa_ms=None if error else ttft * 1.4,
            first_tool_call_ms=None if error or index % 2 else ttft * 1.2,
            total_ms=ttft + rng.uniform(300, 900),
            gap_p50_ms=None if error else rng.uniform(10, 20),
            gap_p95_ms=None if error else rng.uniform(20, 40),
            gap_max_ms=None if error else rng.uniform(40, 90),
            decode_tps=None if error else rng.uniform(40, 90),
            token_events=0 if error else rng.randrange(20, 64),
            prompt_tokens=None if error else 512 + rng.randrange(0, 8),
            completion_tokens=None if error else 64,
            cached_tokens=None if error else 0,
            prompt_tokens_target=512,
            prompt_chars=2150 + rng.randrange(0, 40),
            served_model="Qwen/Qwen3-8B-AWQ",
            fingerprint="fp_44709d6fcb",
            request_id=f"req-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}",
            http_status=(503 if error is ErrorClass.SERVER_ERROR else 200) if error else 200,
            server_processing_ms=None if error else round(ttft * 0.9, 3),
            ratelimit_remaining_requests=9999 - index,
            ratelimit_remaining_tokens=1_500_000 - 64 * index,
            retry_after="7" if error is ErrorClass.RATE_LIMITED else None,
            server_timing=None if error else f"gfet4t7; dur={round(ttft)}",
            error=error,
            error_message=f"upstream said no ({error.value})" if error else None,
            timing_path=TimingPath.TASK_READ if index == 2 else TimingPath.STAMPED,
            self_delay_ms=0.1 + 0.05 * index,  # not drawn from rng: that would move every later draw
            via_proxy=index == 1,
            connection_retried=index == 3,
            reasoning_tokens=None if error else 12,
            reasoning_tokens_estimated=index == 2,
        )
        out.append(sample)
    return out


def make_batch(
    at: datetime = T0,
    *,
    targets: tuple[str, ...] = ("qwen3-8b", "gpt-4o-mini"),
    prompts: tuple[str, ...] = ("short", "long"),
    job: str = "every-5m",
    location: str = "test-lab",
    **kwargs: Any,
) -> list[tuple[RunRecord, list[Sample]]]:
    samples = [s for t in targets for p in prompts for s in make_samples(t, p, at=at, **kwargs)]
    return runs_from_samples(samples, job=job, location=location, provider_of=PROVIDERS)


def as_read_back(run: RunRecord, samples: list[Sample]) -> tuple[RunRecord, list[Sample]]:
    """A stored run as the repository reads it back: each sample named by its run and round (the probe's own
    sample id is not stored)."""
    return run, [dataclasses.replace(s, sample_id=str(sample_id_of(run.run_id, s.round))) for s in samples]


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each cold chunk decoded (`cold.decode_chunk`) from now on in the test."""
    from monitor.store import cold

    decoded: list[int] = []
    real = cold.decode_chunk

    def counting(*args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cold, "decode_chunk", counting)
    return decoded


@contextlib.asynccontextmanager
async def counted_trips(connection: AsyncConnection) -> AsyncIterator[list[int]]:
    """How many trips to the SQLite connection's thread the statements inside take ([count], read at the end):
    store/sqlite_driver.py's `_execute` counted on this connection's driver, put back after."""
    from monitor.store import sqlite_driver

    driver = (await connection.get_raw_connection()).driver_connection
    assert isinstance(driver, sqlite_driver.OneTripConnection)
    count = [0]
    original = driver._execute

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return await original(fn, *args, **kwargs)

    driver._execute = counted  # type: ignore[method-assign]
    try:
        yield count
    finally:
        del driver._execute
