"""Shared fixtures: the simulator as a real child process, and a runner for the real CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support import banners, cli_dump, parallel

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ENV = "TTFT_TEST_POSTGRES_URL"


@dataclass
class SimProcess:
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[str]
    errors: IO[str]

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return json.load(resp)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            return json.load(resp)


def start_sim(*args: str, env: dict[str, str] | None = None) -> SimProcess:
    # stderr goes to a file: an unread pipe would fill up and stall the simulator.
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by stop_sim
    process = subprocess.Popen(
        [sys.executable, "-m", "monitor", "sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if match is None:
        process.kill()
        process.wait()
        process.stdout.close()
        errors.seek(0)
        raise RuntimeError(f"simulator did not start: {line!r} {errors.read()}")
    return SimProcess(url=match.group(1), process=process, errors=errors)


def stop_sim(sim: SimProcess) -> None:
    sim.process.terminate()
    try:
        sim.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        sim.process.kill()
        sim.process.wait()
    if sim.process.stdout is not None:
        sim.process.stdout.close()
    sim.errors.close()


@pytest.fixture(scope="session")
def exact_sim_process() -> Iterator[SimProcess]:
    sim = start_sim("--no-noise")
    yield sim
    stop_sim(sim)


@pytest.fixture
def exact_sim(exact_sim_process: SimProcess) -> SimProcess:
    """A simulator with the noise off: every latency is exactly what its profile says.

    One process for the session, reset before each test (profiles, prefix caches, stamps): a test
    that slows a model must not leave it slow for the next (the grouping test left every seed model
    at 5 ms per 1K prompt tokens, and the report test read the Qwen models' slopes reversed)."""
    exact_sim_process.post("/sim/reset", {})
    return exact_sim_process


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    """A simulator of its own for one test, noise off (a test that changes it leaves no trace)."""
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


@contextmanager
def silent_listener() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a hung peer); yields the port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        listener.close()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> CliResult:
    """`ttft-monitor ARGS` as a real child process. Past `timeout` the child is asked (SIGUSR1, see
    tests/support/cli_dump.py) where every thread and task waits, then killed, and the test fails with
    that and all it printed: a hang seen once in ten runs must say where it was."""
    full_env = {k: v for k, v in os.environ.items() if k != "TTFT_CONFIG"}
    full_env.update(env or {})
    with subprocess.Popen(
        [sys.executable, "-m", "tests.support.cli_dump", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=ROOT,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)
            _wait_for_the_dump(process, within_s=10)
            process.kill()
            stdout, stderr = process.communicate()
            raise AssertionError(
                f"`ttft-monitor {' '.join(args)}` did not end within {timeout:g} s; killed. What it printed, "
                f"and where it waited:\n--- stdout\n{stdout[-20000:]}\n--- stderr\n{stderr[-30000:]}"
            ) from None
        except BaseException:  # pytest-timeout, Ctrl-C: Popen's exit would wait for the child forever
            process.kill()
            raise
    return CliResult(process.returncode, stdout, stderr)


def _wait_for_the_dump(process: subprocess.Popen[str], *, within_s: float) -> None:
    """Until the child has written its SIGUSR1 dump (tests/support/cli_dump.py), or exited, or `within_s`
    passes. The child goes on after its dump: waiting for its exit took the whole `within_s` every time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            process.communicate(timeout=0.1)  # what it writes meanwhile is kept for the next communicate
        except subprocess.TimeoutExpired as pending:
            if pending.stderr and cli_dump.END_OF_DUMP.encode() in pending.stderr:
                return
        else:
            return


TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")  # the folders under tests/, each a marker of the same name
# The markers that start an external peer: each implies `peer`, so `-m 'not peer'` leaves them all out.
PEERS = ("prometheus", "pushgateway", "alertmanager", "browser", "vllm")


def tier(path: Path) -> str | None:
    """The tier of a test file: the folder under tests/ it lives in."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except ValueError:  # a test file outside tests/
        return None
    return folder if folder in TIERS else None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it must see the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test carries its tier's marker, and `peer` when it carries a peer's; in a parallel run,
    its group (tests/support/parallel.py).

    In a serial run the tests that use the real vLLM run last, in their own order. Its server lives for the session,
    and its engine (both cores busy during the attribution burst) must not slow the timing tests that
    would otherwise follow it alphabetically (the web tests)."""
    for item in items:
        folder = tier(item.path)
        if folder is not None:
            item.add_marker(folder)
        if any(item.get_closest_marker(name) for name in PEERS):
            item.add_marker("peer")
    if parallel.in_worker(config):
        parallel.assign_groups(items)
        return
    uses_vllm = [item for item in items if "vllm_server" in getattr(item, "fixturenames", ())]
    if uses_vllm:
        chosen = set(map(id, uses_vllm))
        items[:] = [item for item in items if id(item) not in chosen] + uses_vllm


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return parallel.workers(os.cpu_count())


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") == "loadgroup":
        return parallel.GroupScheduling(config, log)
    return None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout: waiting for the lock is no test time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A `solo` test runs while no other worker runs a test (tests/support/parallel.py)."""
    lock = item.config.stash.get(SOLO_LOCK, None)
    if lock is None:
        yield
        return
    alone = item.get_closest_marker(parallel.SOLO) is not None
    alone_next = nextitem is not None and nextitem.get_closest_marker(parallel.SOLO) is not None
    if not alone and item.config.stash.get(SOLO_FIRST, False):
        lock.wait_for_solo_phase()
    with lock.held(alone, alone_next):
        yield


SOLO_LOCK = pytest.StashKey["parallel.SoloLock | None"]()
SOLO_FIRST = pytest.StashKey[bool]()  # the selected tests include the solo group, which runs first


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[SOLO_FIRST] = parallel.has_solo_group(session.items)


RUN_FOLDER = pytest.StashKey["Path | None"]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RUN_FOLDER] = parallel.open_run_folder(config)
    config.stash[SOLO_LOCK] = parallel.solo_lock(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(RUN_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def skipped_for_postgres(reports: list[Any]) -> int:
    """How many of pytest's skip reports name TTFT_TEST_POSTGRES_URL as their reason. Every way a
    test skips for it counts (tests/support/store_fixtures.py's fixtures, a `skipif` mark, a skip in the
    body), so the banner's count is what was skipped: it said 154 when 157 were (three marks)."""
    count = 0
    for report in reports:
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        count += POSTGRES_ENV in reason
    return count


def pytest_terminal_summary(terminalreporter: Any) -> None:
    banners.write(terminalreporter)
    skipped = skipped_for_postgres(terminalreporter.stats.get("skipped", []))
    if skipped:
        terminalreporter.write_sep("!", "POSTGRESQL TESTS SKIPPED", red=True, bold=True)
        terminalreporter.write_line(
            f"{skipped} PostgreSQL test(s) skipped: {POSTGRES_ENV} is not set. "
            f"Set it, e.g. {POSTGRES_ENV}=postgresql+asyncpg://postgres@127.0.0.1:5432/test "
            "(.ci/run does), to run them against a real PostgreSQL server.",
            red=True,
            bold=True,
        )


def call_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """`ttft-monitor ARGS` called in this process (`monitor.cli.main`, what `python -m monitor` runs):
    the same exit code, stdout and stderr as `run_cli`, without the ~1.4 s of a new interpreter importing
    the monitor. For what a command says and returns (usage errors, config errors, a report); a test of
    start-up, exit or signals keeps `run_cli`. Not for a measuring command that gets to measure (`run`,
    `once`, `probe`: they freeze the heap for the process; `cli_result` picks). Called from a running
    event loop (an async test), it runs in a worker thread, since the commands call asyncio.run, and
    blocks the loop meanwhile, as waiting for a child process did. The environment and the logging
    set-up a command changes are put back afterwards."""
    import asyncio
    import concurrent.futures
    import contextlib
    import io
    import logging

    import structlog

    from monitor.cli import main

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as worker:
            return worker.submit(call_cli, *args, env=env).result()

    saved_environ, saved_structlog = dict(os.environ), structlog.get_config()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    os.environ.pop("TTFT_CONFIG", None)
    os.environ.update(env or {})
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse: a usage error (2), --help or --version (0)
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.environ.clear()
        os.environ.update(saved_environ)
        structlog.configure(**saved_structlog)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return CliResult(code, stdout.getvalue(), stderr.getvalue())


def cli_result(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> CliResult:
    """`ttft-monitor ARGS`: a measuring command as a child process (`run_cli`), any other in-process
    (`call_cli`), for tests that ask every command the same question."""
    from monitor.cli import MEASURING_COMMANDS

    if args[0] in MEASURING_COMMANDS:
        return run_cli(*args, env=env, timeout=timeout)
    return call_cli(*args, env=env)
