"""How the suite runs in parallel (pytest-xdist, `-n auto --dist loadgroup` in pyproject.toml).

Most of the suite waits: on child processes starting, on daemons' ticks, on real peers. Run serially it
kept under one core busy for 24 minutes, so several workers share the two cores well. Two things must
hold for that to be safe, and this module makes them hold:

- **Tests that share an expensive set-up run in one worker.** A test using a module-, class- or
  package-scoped fixture (a browser, a daemon kept for a file) is grouped with the rest of its file, so
  that set-up happens once; the tests of the real vLLM are one group, so one server starts. Every other
  test is scheduled on its own.
- **Tests that measure time run alone.** A test marked `solo` (a TTFT within a few milliseconds, an
  event loop's lag) runs while no other test runs: it takes a lock exclusively that every other test
  holds shared. A turnstile in front of the lock keeps the stream of shared holders from starving it.

With `-n 0` (or a plain serial run) nothing here changes anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from xdist.scheduler import LoadScopeScheduling

SOLO = "solo"
SOLO_GROUP = "solo"  # the solo tests that share no fixture with their file: one worker runs them in a row
VLLM_GROUP = "vllm"
# Fixture scopes that make a file's tests share state or an expensive set-up.
SHARED_SCOPES = frozenset({"module", "class", "package"})
# Groups started first: they take longest, so they must not be the tail of the run.
LONG_GROUPS = (SOLO_GROUP, VLLM_GROUP, "tests/e2e/test_web_browser.py")


def group_of(item: pytest.Item) -> str | None:
    """The xdist group a test must run in, or None to schedule it on its own.

    The solo tests go to one group, run first and in a row, so that the others wait for them once,
    not once per solo test (each would wait for every other worker's test in progress to end)."""
    names = getattr(item, "fixturenames", ())
    if "vllm_server" in names:
        return VLLM_GROUP
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in names:
            definitions = info.name2fixturedefs.get(name, ())
            if any(definition.scope in SHARED_SCOPES for definition in definitions):
                return item.nodeid.split("::", 1)[0]
    return SOLO_GROUP if item.get_closest_marker(SOLO) is not None else None


def assign_groups(items: list[pytest.Item]) -> None:
    """Mark each test with its group (unless it names one itself), put the long groups first, and
    write the groups where the controller's scheduler (`GroupScheduling`) reads them.

    A file's group whose every test is solo joins the solo group (its tests stay in one worker, in a
    row): run later on its own, its first solo test stopped every worker until the longest test in
    progress elsewhere had ended (the kernel clock's and the client's files, 10-17 s each)."""
    groups: dict[str, str] = {}
    chosen: dict[str, str] = {}  # nodeid -> the group this module picked
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is None:
            group = group_of(item)
            if group is not None:
                chosen[item.nodeid] = group
        else:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    solo_only = {group for group in chosen.values() if group not in (SOLO_GROUP, VLLM_GROUP)}
    for item in items:
        group = chosen.get(item.nodeid)
        if group in solo_only and item.get_closest_marker(SOLO) is None:
            solo_only.discard(group)
    for item in items:
        group = chosen.get(item.nodeid)
        if group is None:
            continue
        if group in solo_only:
            group = SOLO_GROUP
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item.nodeid] = group
    folder = run_folder()
    if folder is not None:  # every worker writes the same; the rename makes each write whole
        written = folder / f"groups.{os.getpid()}.json"
        written.write_text(json.dumps(groups), encoding="utf-8")
        os.replace(written, folder / "groups.json")

    def rank(item: pytest.Item) -> int:
        mark = item.get_closest_marker("xdist_group")
        name = mark.args[0] if mark is not None and mark.args else None
        return LONG_GROUPS.index(name) if name in LONG_GROUPS else len(LONG_GROUPS)

    items.sort(key=rank)  # stable: the order within each rank is the collection's


RUN_FOLDER = "TTFT_TEST_RUN_FOLDER"  # set by the process that starts the run; its workers inherit it


def in_worker(config: pytest.Config | None = None) -> bool:
    """Whether this process is an xdist worker: by its config when there is one (a worker's carries
    `workerinput`; the environment may be inherited, by a pytest that a test starts), else by the
    environment xdist sets."""
    if config is not None:
        return hasattr(config, "workerinput")
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def run_folder() -> Path | None:
    """The folder the run's processes share (lock files, summary lines), or None outside a run."""
    folder = os.environ.get(RUN_FOLDER)
    return Path(folder) if folder else None


def open_run_folder(config: pytest.Config) -> Path | None:
    """In the process that starts the run (xdist's controller or a serial run): a new shared folder,
    named in the environment that the workers it starts inherit. None in a worker."""
    if in_worker(config):
        return None
    folder = Path(tempfile.mkdtemp(prefix="ttft-tests-"))
    os.environ[RUN_FOLDER] = str(folder)
    return folder


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's scheduling by scope, each scope being a test's group (`assign_groups`), or the test alone.

    xdist's own `loadgroup` finds a group in a suffix it appends to `item._nodeid`, which pytest 9.2
    no longer reads: every test would be scheduled alone, and each worker would start its own vLLM.
    The controller collects nothing, so the workers write the groups down as they collect, before
    they report their collection, and this reads them when the first scope is asked for."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            folder = run_folder()
            path = None if folder is None else folder / "groups.json"
            self._groups = json.loads(path.read_text(encoding="utf-8")) if path and path.exists() else {}
        return self._groups.get(nodeid, nodeid)


def has_solo_group(items: list[pytest.Item]) -> bool:
    """Whether the tests selected for the run include the solo group (which runs first)."""
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None and mark.args and mark.args[0] == SOLO_GROUP:
            return True
    return False


class SoloLock:
    """A readers-writer lock shared by the workers of one run, through two lock files.

    When the run has a solo group, the other workers' first test waits until that group has taken the
    lock (`wait_for_solo_phase`): whichever test got the lock first made the solo tests, and with them
    every other worker, wait for it (the browser file's first test builds a minute of history)."""

    SOLO_BEGAN = "solo.began"
    SOLO_WAIT_S = 120.0  # bounded: a solo worker that never starts must not hang the run

    def __init__(self, folder: Path) -> None:
        self._turnstile: IO[bytes] = open(folder / "solo.turnstile", "ab")  # noqa: SIM115 - kept for the worker's life
        self._room: IO[bytes] = open(folder / "solo.room", "ab")  # noqa: SIM115
        self._began = folder / self.SOLO_BEGAN
        self._waited = False

        self._alone = False  # held exclusively, from one solo test to the next

    def wait_for_solo_phase(self) -> None:
        """Until the solo group has begun (once per worker; bounded by SOLO_WAIT_S)."""
        if self._waited:
            return
        self._waited = True
        deadline = time.monotonic() + self.SOLO_WAIT_S
        while not self._began.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    @contextmanager
    def held(self, alone: bool, alone_next: bool) -> Iterator[None]:
        """Held for one test; exclusively when `alone`, and kept so when the next test is solo too."""
        if not (alone and self._alone):
            fcntl.flock(self._turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                if not alone:
                    fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            if alone:
                self._began.touch()
            self._alone = alone
        try:
            yield
        finally:
            if not (alone and alone_next):
                fcntl.flock(self._room, fcntl.LOCK_UN)
                if alone:
                    fcntl.flock(self._turnstile, fcntl.LOCK_UN)
                self._alone = False


def solo_lock(config: pytest.Config) -> SoloLock | None:
    """The run's lock in an xdist worker; None in a serial run."""
    folder = run_folder()
    if folder is None or not in_worker(config):
        return None
    return SoloLock(folder)


def workers(cpus: int | None) -> int:
    """How many workers `-n auto` starts: three times the cores, as the suite mostly waits, and at least two.
    TTFT_TEST_WORKERS overrides it.

    With twice the cores, the suite's processes used about half of the two cores while the parallel part ran
    (854 CPU-seconds in 920 s, 167 of them the solo tests alone): 6 workers ran it in 793 s, 4 in 920 s,
    with every test passing (2-core VM, 2026-12-07). The tests that measure time are `solo` either way."""
    chosen = os.environ.get("TTFT_TEST_WORKERS")
    if chosen:
        return int(chosen)
    return max(2, 3 * (cpus or 1))
