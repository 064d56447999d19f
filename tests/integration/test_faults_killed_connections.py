"""Detection whose PostgreSQL connections are killed under it (pg_terminate_backend) is retried, and
every run is still evaluated exactly once.

The kill is real: the connection the detection transaction is on runs
`pg_terminate_backend(pg_backend_pid())` right before one of its statements (then asyncpg says
`cannot switch to state 12`, `connection is closed` or the server's administrator shutdown), or right
before its COMMIT. A transaction that had not committed rolled back with its connection, so running it
again is safe; one cut at COMMIT is looked up first, so a run is never applied twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event
from sqlalchemy.util import await_only
from structlog.testing import capture_logs

from monitor.store.engine import is_broken_connection, is_connection_error
from monitor.store.models import DetectorStateRow, IncidentRow
from tests.support.detection import HEALTHY, RECOVERED, SLOW, config, notifications, outage, rows, run_ticks, service_on
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)


class Killer:
    """Kills, from another connection (`pg_terminate_backend(pid, 5000)`, which waits until the backend
    is gone), the connection of every `read_every`-th detector-state read of a detection transaction
    right before it runs, and of every `commit_every`-th commit of one that wrote the state."""

    def __init__(self, engine: Any, admin: asyncpg.Connection, *, read_every: int, commit_every: int) -> None:
        self.read_every, self.commit_every = read_every, commit_every
        self.seen: Counter[str] = Counter()
        self.killed: Counter[str] = Counter()
        self._admin = admin
        self._engine = engine.sync_engine
        event.listen(self._engine, "before_cursor_execute", self._before_execute)
        event.listen(self._engine, "commit", self._before_commit)

    def close(self) -> None:
        if event.contains(self._engine, "commit", self._before_commit):
            event.remove(self._engine, "before_cursor_execute", self._before_execute)
            event.remove(self._engine, "commit", self._before_commit)

    def _kill(self, conn: Any) -> None:
        # The hooks run inside SQLAlchemy's greenlet, where an awaitable can be waited for in place.
        pid = conn.connection.driver_connection.get_server_pid()
        await_only(self._admin.execute("SELECT pg_terminate_backend($1, 5000)", pid))

    def _before_execute(self, conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        text = " ".join(statement.split()).upper()
        if text.startswith(("UPDATE DETECTOR_STATE", "INSERT INTO DETECTOR_STATE")):
            conn.info["wrote_state"] = True
        if text.startswith("SELECT DETECTOR_STATE.STATE, DETECTOR_STATE.VERSION"):
            self.seen["read"] += 1
            if self.seen["read"] % self.read_every == 0:
                self.killed["read"] += 1
                self._kill(conn)

    def _before_commit(self, conn: Any) -> None:
        if not conn.info.pop("wrote_state", False):
            return
        self.seen["commit"] += 1
        if self.seen["commit"] % self.commit_every == 0:
            self.killed["commit"] += 1
            self._kill(conn)


@pytest.mark.realtime
async def test_detection_retries_killed_connections_and_evaluates_every_run_exactly_once(
    postgres_backend: Backend,
) -> None:
    engine = postgres_backend.engine()
    admin = await asyncpg.connect(postgres_backend.url.replace("postgresql+asyncpg", "postgresql"))
    killer = Killer(engine, admin, read_every=5, commit_every=7)
    try:
        with capture_logs() as logs:
            await run_ticks(engine, service_on(engine, config()), outage({"a1": 3.0}), targets=("a1",))
        killer.close()  # counts below are the kills made during detection only
        states = await rows(engine, DetectorStateRow)
        incidents = await rows(engine, IncidentRow)
        sent = await notifications(engine)
    finally:
        killer.close()
        await admin.close()
        await engine.dispose()
    assert killer.killed["read"] >= 10 and killer.killed["commit"] >= 8, killer.killed
    assert [e for e in logs if e["event"] == "detection_failed"] == []
    retried = [e for e in logs if e["event"] == "detection_retried"]
    assert len(retried) == killer.killed["read"] + killer.killed["commit"], Counter(e["error"] for e in retried)
    assert {e["committing"] for e in retried} == {False, True}
    # Exactly once: each series' state moved on once per run, no more (a cut COMMIT applied twice would
    # show as one version too many), no less (a lost evaluation, one too few).
    assert sorted(s.version for s in states) == [HEALTHY + SLOW + RECOVERED] * 2
    assert sorted((i.kind, i.severity, i.resolved_at is not None) for i in incidents) == [
        ("regression", "page", True),
        ("regression", "page", True),
    ]
    assert [(n.state, len(n.members)) for n in sent] == [("firing", 2), ("resolved", 2)]


@pytest.mark.parametrize(
    ("error", "broken"),
    [
        (type("InternalClientError", (Exception,), {})("cannot switch to state 12"), True),
        (type("ConnectionDoesNotExistError", (Exception,), {})("connection was closed in the middle"), True),
        (type("AdminShutdownError", (Exception,), {})("terminating connection due to administrator command"), True),
        (type("InterfaceError", (Exception,), {})("connection is closed"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (type("UniqueViolationError", (Exception,), {})("duplicate key"), False),
        (ValueError("bad value"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_a_connection_that_broke_under_a_statement_is_told_from_a_refused_statement(
    error: BaseException, broken: bool
) -> None:
    assert is_broken_connection(error) is broken
    if broken and "InternalClientError" in type(error).__name__:
        assert is_connection_error(error)  # the writer spools and retries it, as any lost connection
