"""Faults against real daemons: what is probed, stored, doubled, skipped, and how fast they stop.

Every scenario runs real `ttft-monitor run` processes on a 2-second schedule against the simulator
(`ttft-monitor sim`) and the real PostgreSQL behind a real TCP proxy (tests/support/tcp_proxy.py):

- outage:    PostgreSQL cut (connections reset, new ones refused) for --seconds
- hang:      PostgreSQL blackholed (connections accept, nothing answers) for --seconds
- disk-full: the spool on a small tmpfs (`mount -t tmpfs -o size=...`, needs root) while PostgreSQL is cut
- replica:   two daemons of one location on one PostgreSQL, cut in the middle
- sigterm:   SIGTERM while PostgreSQL is blackholed (exit time against `shutdown_grace_s`), then a
             restart with the database back replays the spool
- sigkill:   SIGKILL four times over --seconds, restarted each time

For each: probed (runs measured, from the daemons' logs), stored (rows in `runs`), distinct
(distinct scheduled times stored), skipped (ticks the scheduler skipped, missed or coalesced) and
exit s (SIGTERM to exit of the last stop).

Then every tick accounted for, and every page once (a second table: ticks due by the monotonic
clock over the scenario, probed, stored, counted as missed by the daemon's own counter, and
notifications sent and received):

- reload-before-tick: a SIGHUP 5 ms before each of 10 ticks (the unchanged file)
- stall:              SIGSTOP for --seconds (a suspended VM, a frozen cgroup), then SIGCONT
- clock-step:         the wall clock 2 minutes back for --seconds, then corrected; then an hour
                      forward and back (libfaketime: `apt-get install faketime`; skipped without)
- read-only:          `default_transaction_read_only` on for --seconds (a standby after a failover)
- delivery-blip:      5 notifications, PostgreSQL cut for 2 s as each reaches the receiver, before
                      its 2xx is recorded (the outbox's dispatcher, in this process)

    TTFT_TEST_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test \\
        .venv/bin/python bench/faults.py [--seconds 60] [--only hang,sigterm] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.tcp_proxy import TcpProxy  # noqa: E402 - the repository's own proxy

TICK_S = 2
SKIP_EVENTS = ("job_run_skipped", "job_run_missed", "job_runs_coalesced")


def set_fake_offset(path: Path, offset: str) -> None:
    """Write libfaketime's offset file in one step: it is read at every clock call
    (FAKETIME_NO_CACHE), and a reader between a truncate and a write sees no offset, a step of its own."""
    staged = path.with_suffix(".new")
    staged.write_text(offset)
    os.replace(staged, path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_sim() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "sim", "--port", "0", "--no-noise"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    match = re.search(r"(http://127\.0\.0\.1:\d+)", proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit("the simulator did not start")
    return proc, match.group(1)


def admin(url: str, statement: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


def query(url: str, sql: str) -> list[tuple]:
    import asyncpg

    async def run() -> list[tuple]:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()

    return asyncio.run(run())


def write_config(folder: Path, sim: str, db_url: str, *, state_dir: Path, grace: float = 20) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: bench
shutdown_grace_s: {grace}
database:
  url: "{db_url}"
  state_dir: "{state_dir}"
metrics:
  listen: "127.0.0.1:{free_port()}"
providers:
  sim:
    base_url: "{sim}/v1"
    api: openai-chat
    timeout_s: {{connect: 2, first_token: 15, total: 30}}
targets:
  fast:
    provider: sim
    model: gpt-4o-mini
    params: {{max_tokens: 4}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: tick
    schedule: "*/{TICK_S} * * * * *"
    targets: [fast]
    prompts: [short]
    rounds: 1
    warmup: 0
    pause_s: 0
"""
    )
    return path


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    log: Path

    def event_names(self) -> list[str]:
        names = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):  # a line that is not JSON (a traceback)
                names.append(json.loads(line).get("event"))
        return names

    def events(self, name: str) -> int:
        return self.event_names().count(name)

    def last_event(self, name: str) -> dict[str, object]:
        """The latest log line of event `name`, parsed (empty when there is none)."""
        last: dict[str, object] = {}
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                event = json.loads(line)
                if event.get("event") == name:
                    last = event
        return last

    def stop(self, sig: int = signal.SIGTERM) -> float:
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return time.monotonic() - started


def start_daemon(config: Path, log: Path, *, env: dict[str, str] | None = None) -> Daemon:
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**{k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}, **(env or {})},
        )
    daemon = Daemon(process, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not daemon.events("daemon_started"):
        if process.poll() is not None:
            raise SystemExit(f"daemon exited at start:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)
    return daemon


@dataclass
class Row:
    scenario: str
    probed: int
    stored: int
    distinct: int
    skipped: int
    exit_s: float
    note: str = ""


@dataclass
class Accounted:
    """Every tick accounted for: `due` should equal `stored + missed` (a run lost unnoticed shows as less)."""

    scenario: str
    due: int | str
    probed: int | str
    stored: int | str
    missed: int | str
    sent: int | str = "-"
    received: int | str = "-"
    note: str = ""


# The thread-safe build first: the daemon reads the clock from several threads (the scheduler's, the
# exporters'), and the single-threaded build read while its offset file changes may return a wrong time.
LIBFAKETIME = next(
    (
        p
        for p in (
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
            "/usr/lib/faketime/libfaketimeMT.so.1",
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/faketime/libfaketime.so.1",
        )
        if Path(p).exists()
    ),
    None,
)


def metrics_text(config: Path) -> str:
    import urllib.request

    listen = config.read_text().split('listen: "', 1)[1].split('"', 1)[0]
    for attempt in range(3):  # a loaded machine can take a while; the figures matter, not the latency
        try:
            with urllib.request.urlopen(f"http://{listen}/metrics", timeout=15) as resp:
                return resp.read().decode()
        except OSError:
            if attempt == 2:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def missed_runs(config: Path) -> int:
    """The daemon's own count of ticks it did not run (coalesced, misfired, still running)."""
    total = 0.0
    for line in metrics_text(config).splitlines():
        if line.startswith("ttft_monitor_scheduler_missed_runs_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return round(total)


def readyz(config: Path) -> int:
    import urllib.error
    import urllib.request

    listen = config.read_text().split('listen: "', 1)[1].split('"', 1)[0]
    try:
        with urllib.request.urlopen(f"http://{listen}/readyz", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def sleep_until(wall: float) -> None:
    while (left := wall - time.time()) > 0:
        time.sleep(min(left, 0.05) if left > 0.06 else left)


class Bench:
    def __init__(self, postgres: str, seconds: float, work: Path) -> None:
        self.postgres = postgres
        self.seconds = seconds
        self.work = work
        self.sim, self.sim_url = start_sim()

    def close(self) -> None:
        self.sim.terminate()
        self.sim.wait()

    def database(self) -> tuple[str, str]:
        name = f"ttft_faults_{uuid.uuid4().hex[:10]}"
        admin(self.postgres, f'CREATE DATABASE "{name}"')
        direct = self.postgres.rsplit("/", 1)[0] + "/" + name
        folder = Path(tempfile.mkdtemp(dir=self.work))
        config = write_config(folder, self.sim_url, direct, state_dir=folder / "state")
        result = subprocess.run(
            [sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise SystemExit(f"db upgrade failed: {result.stdout}{result.stderr}")
        return name, direct

    def run(self, scenario: str) -> Row:
        name, direct = self.database()
        folder = self.work / scenario
        folder.mkdir()
        proxy = TcpProxy("127.0.0.1", int(direct.split(":")[-1].split("/")[0])).start()
        proxied = direct.replace(":5432/", f":{proxy.port}/")
        try:
            return getattr(self, "scenario_" + scenario.replace("-", "_"))(folder, proxy, proxied, direct)
        finally:
            proxy.close()
            admin(self.postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _row(self, scenario: str, daemons: list[Daemon], direct: str, exit_s: float, note: str = "") -> Row:
        intended = [r[0] for r in query(direct, "select intended_at from runs where job = 'tick'")]
        return Row(
            scenario,
            probed=sum(d.events("job_finished") for d in daemons),
            stored=len(intended),
            distinct=len(set(intended)),
            skipped=sum(d.events(e) for d in daemons for e in SKIP_EVENTS),
            exit_s=exit_s,
            note=note,
        )

    def _fault(self, proxy: TcpProxy, mode: str, daemons: list[Daemon], settle: Callable[[], None]) -> float:
        time.sleep(3 * TICK_S)
        proxy.set_mode(mode)  # type: ignore[arg-type]
        time.sleep(self.seconds)
        proxy.set_mode("pass")
        settle()
        return max(d.stop() for d in daemons)

    def _drained(self, daemons: list[Daemon], timeout: float = 60) -> Callable[[], None]:
        """Wait until every daemon's last database failure is followed by a drained spool."""

        def recovered(daemon: Daemon) -> bool:
            names = daemon.event_names()
            failures = [i for i, n in enumerate(names) if n in ("database_write_failed", "spool_drain_failed")]
            if not failures:
                return True
            return any(n in ("spool_drained", "database_write_ok") for n in names[failures[-1] :])

        def wait() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not all(recovered(d) for d in daemons):
                time.sleep(0.5)
            time.sleep(2 * TICK_S)

        return wait

    def scenario_outage(self, folder: Path, proxy: TcpProxy, proxied: str, direct: str) -> Row:
        daemon = start_daemon(write_config(folder, self.sim_url, proxied, state_dir=folder / "state"), folder / "a.log")
        exit_s = self._fault(proxy, "cut", [daemon], self._drained([daemon]))
        return self._row("outage", [daemon], direct, exit_s)

    def scenario_hang(self, folder: Path, proxy: TcpProxy, proxied: str, direct: str) -> Row:
        daemon = start_daemon(write_config(folder, self.sim_url, proxied, state_dir=folder / "state"), folder / "a.log")
        exit_s = self._fault(proxy, "blackhole", [daemon], self._drained([daemon]))
        return self._row("hang", [daemon], direct, exit_s)

    def scenario_disk_full(self, folder: Path, proxy: TcpProxy, proxied: str, direct: str) -> Row:
        spool = folder / "tmpfs"
        spool.mkdir()
        size_kb = max(8, int(self.seconds / TICK_S * 1.4 / 2))  # room for about half of the outage's runs
        mounted = (
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(spool)]).returncode == 0
        )
        if not mounted:
            return Row("disk-full", 0, 0, 0, 0, 0.0, "skipped: mount -t tmpfs needs root")
        try:
            config = write_config(folder, self.sim_url, proxied, state_dir=spool)
            daemon = start_daemon(config, folder / "a.log")
            exit_s = self._fault(proxy, "cut", [daemon], self._drained([daemon]))
            row = self._row("disk-full", [daemon], direct, exit_s)
            row.note = f"tmpfs {size_kb} KiB; lost {daemon.events('results_lost')} batches (logged)"
            return row
        finally:
            subprocess.run(["umount", "-l", str(spool)])

    def scenario_replica(self, folder: Path, proxy: TcpProxy, proxied: str, direct: str) -> Row:
        (folder / "a").mkdir()
        (folder / "b").mkdir()
        a = start_daemon(
            write_config(folder / "a", self.sim_url, proxied, state_dir=folder / "a/state"), folder / "a.log"
        )
        b = start_daemon(
            write_config(folder / "b", self.sim_url, proxied, state_dir=folder / "b/state"), folder / "b.log"
        )
        exit_s = self._fault(proxy, "cut", [a, b], self._drained([a, b]))
        return self._row("replica", [a, b], direct, exit_s, "two daemons, one location")

    def scenario_sigterm(self, folder: Path, proxy: TcpProxy, proxied: str, direct: str) -> Row:
        grace = 20
        config = write_config(folder, self.sim_url, proxied, state_dir=folder / "state", grace=grace)
        first = start_daemon(config, folder / "a.log")
        time.sleep(3 * TICK_S)
        proxy.set_mode("blackhole")
        time.sleep(self.seconds)
        exit_s = first.stop()
        proxy.set_mode("pass")
        second = start_daemon(config, folder / "b.log")
        self._drained([second])()
        second.stop()
        return self._row(
            "sigterm", [first, second], direct, exit_s, f"SIGTERM {self.seconds:g} s into a hang, grace {grace} s"
        )

    def scenario_sigkill(self, folder: Path, proxy: TcpProxy, proxied: str, direct: str) -> Row:
        config = write_config(folder, self.sim_url, proxied, state_dir=folder / "state")
        daemons = []
        for n in range(4):
            daemons.append(start_daemon(config, folder / f"{n}.log"))
            time.sleep(self.seconds / 4)
            daemons[-1].stop(signal.SIGKILL)
        last = start_daemon(config, folder / "last.log")
        time.sleep(3 * TICK_S)
        exit_s = last.stop()
        return self._row("sigkill", [*daemons, last], direct, exit_s, "killed 4 times, restarted each time")

    # ---------------------------------------------------------------- every tick accounted for

    def accounted(self, scenario: str) -> Accounted:
        name, direct = self.database()
        folder = self.work / scenario
        folder.mkdir()
        try:
            return getattr(self, "accounted_" + scenario.replace("-", "_"))(folder, name, direct)
        finally:
            admin(self.postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _observe(
        self,
        scenario: str,
        folder: Path,
        direct: str,
        fault: Callable[[Daemon, Path], str],
        env: dict[str, str] | None = None,
    ) -> Accounted:
        """Start a daemon, wait for its first run, apply `fault`, let it settle, and account for the ticks."""
        config = write_config(folder, self.sim_url, direct, state_dir=folder / "state")
        daemon = start_daemon(config, folder / "a.log", env=env)
        deadline = time.monotonic() + 30
        while daemon.events("job_finished") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        first_runs = daemon.events("job_finished")
        # Ticks due are counted by the monotonic clock from the last finished run's own tick (its start
        # minus its lag, snapped to the schedule, found while the wall clock is still true), so a
        # wall-clock step cannot change how many the schedule owed, and a slow first run (a cold start
        # longer than a tick) does not make the tick it overran look probed; the daemon is stopped half
        # a tick after a boundary, so none is ambiguous.
        finished = daemon.last_event("job_finished")
        took_s = float(finished.get("duration_s", 0.0)) + float(finished.get("lag_ms", 0.0)) / 1000  # type: ignore[arg-type]
        now_wall, now_mono = time.time(), time.monotonic()
        tick_wall = round((now_wall - took_s) / TICK_S) * TICK_S
        anchor = now_mono - (now_wall - tick_wall)
        note = fault(daemon, config)
        time.sleep(2 * TICK_S)
        self._drained([daemon])()
        if folded := daemon.events("job_runs_coalesced"):
            note += f"; {folded} job_runs_coalesced line(s)"
        half = math.ceil((time.monotonic() - anchor) / TICK_S - 0.5) + 0.5
        time.sleep(max(0.0, anchor + half * TICK_S - time.monotonic()))
        missed = missed_runs(config)
        due = int((time.monotonic() - anchor) // TICK_S) + 1
        daemon.stop()  # lets the last tick's run finish and be stored
        probed = daemon.events("job_finished") - first_runs + 1
        stored = query(direct, "select count(*) from runs where job = 'tick'")[0][0] - first_runs + 1
        return Accounted(scenario, due, probed, stored, missed, note=note)

    def accounted_reload_before_tick(self, folder: Path, name: str, direct: str) -> Accounted:
        def fault(daemon: Daemon, _config: Path) -> str:
            for _ in range(10):
                tick = (int(time.time()) // TICK_S + 1) * TICK_S
                sleep_until(tick - 0.005)  # the reload holds the loop as the tick falls due
                daemon.process.send_signal(signal.SIGHUP)
                sleep_until(tick + 0.3)
            return f"{daemon.events('config_reloaded')} reloads, each 5 ms before a tick"

        return self._observe("reload-before-tick", folder, direct, fault)

    def accounted_stall(self, folder: Path, name: str, direct: str) -> Accounted:
        def fault(daemon: Daemon, _config: Path) -> str:
            daemon.process.send_signal(signal.SIGSTOP)
            time.sleep(self.seconds)
            daemon.process.send_signal(signal.SIGCONT)
            return f"SIGSTOP {self.seconds:g} s"

        return self._observe("stall", folder, direct, fault)

    def accounted_clock_step(self, folder: Path, name: str, direct: str) -> Accounted:
        if LIBFAKETIME is None:
            return Accounted(
                "clock-step", 0, 0, 0, 0, note="skipped: libfaketime not installed (apt-get install faketime)"
            )
        offset = folder / "faketime"
        set_fake_offset(offset, "+0\n")
        env = {
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": str(offset),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

        def fault(daemon: Daemon, config: Path) -> str:
            set_fake_offset(offset, "-120\n")
            time.sleep(self.seconds)
            set_fake_offset(offset, "+0\n")
            time.sleep(2 * TICK_S)
            set_fake_offset(offset, "+3600\n")
            time.sleep(2 * TICK_S)
            set_fake_offset(offset, "+0\n")
            time.sleep(1)
            steps = sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics_text(config).splitlines()
                if line.startswith("ttft_monitor_clock_steps_total{")
            )
            note = f"-120 s for {self.seconds:g} s, then +1 h and back: {steps:g} steps counted"
            if steps != 4:  # the daemon did not see the four steps made: the run says nothing about them
                note += " (INVALID: 4 were made)"
            return note

        # The stored scheduled times follow the stepped clock, so stored counts rows, not distinct times.
        return self._observe("clock-step", folder, direct, fault, env=env)

    def accounted_read_only(self, folder: Path, name: str, direct: str) -> Accounted:
        others = (
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
            "AND pid <> pg_backend_pid()"
        )

        def fault(daemon: Daemon, config: Path) -> str:
            admin(self.postgres, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            admin(self.postgres, others)
            answers = []
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                time.sleep(1)
                answers.append(readyz(config))
            admin(self.postgres, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            admin(self.postgres, others)
            return f"read-only {self.seconds:g} s: /readyz 503 {answers.count(503)} of {len(answers)} times"

        return self._observe("read-only", folder, direct, fault)

    def accounted_delivery_blip(self, folder: Path, name: str, direct: str) -> Accounted:
        return asyncio.run(self._delivery_blip(direct))

    async def _delivery_blip(self, direct: str, count: int = 5) -> Accounted:
        import structlog

        from monitor.alert.dispatcher import Dispatcher
        from monitor.alert.outbox import Outbox
        from monitor.alert.transport import Transport
        from monitor.store.engine import create_engine
        from tests.support.alert_fixtures import (
            Loopback,
            Reply,
            alerts,
            notification,
            outbox_rows,
            receiver,
            store_incident,
        )

        # The dispatcher logs in this process: to stderr, so stdout stays the table.
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
        loopback = Loopback()
        await loopback.start()
        proxy = TcpProxy("127.0.0.1", int(direct.split(":")[-1].split("/")[0])).start()
        proxied = direct.replace(":5432/", f":{proxy.port}/")
        config = alerts({"hook": receiver("webhook", loopback.url("/hook"), timeout_s=1)})
        setup = create_engine(direct)
        try:
            for index in range(count):
                incident = await store_incident(setup, target=f"target-{index}", incident_id=uuid.uuid4())
                await Outbox(setup, config).notify(notification(incident_id=incident))
        finally:
            await setup.dispose()
        blips: list[asyncio.Task[None]] = []

        async def blip() -> None:
            proxy.set_mode("cut")
            await asyncio.sleep(2)
            proxy.set_mode("pass")

        def cut_as_it_arrives(_item: object) -> None:
            blips.append(asyncio.get_running_loop().create_task(blip()))

        loopback.verify("/hook", cut_as_it_arrives)  # type: ignore[arg-type]
        loopback.script("/hook", Reply(200, "ok", delay_s=0.2))  # answered once the database is gone
        engine = create_engine(proxied)
        stop = asyncio.Event()
        try:
            async with Transport() as transport:
                dispatcher = Dispatcher(engine, config, transport, poll_interval_s=0.05, claim_margin_s=0.5)
                task = asyncio.create_task(dispatcher.run(stop))
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    if len(blips) >= count and all(b.done() for b in blips):
                        rows = await outbox_rows(engine)
                        if {row.status for row in rows} == {"sent"}:
                            break
                await asyncio.sleep(3)  # past every claim: time for a second send, if one were coming
                stop.set()
                await asyncio.wait_for(task, timeout=10)
            rows = await outbox_rows(engine)
        finally:
            await engine.dispose()
            await loopback.close()
            proxy.close()
        received = loopback.at("/hook")
        ids = {item.headers.get("webhook-id") for item in received}
        return Accounted(
            "delivery-blip",
            "-",
            "-",
            "-",
            "-",
            sent=count,
            received=len(received),
            note=f"{len(ids)} distinct webhook-ids; outbox {sorted({r.status for r in rows})}, "
            f"attempts {sorted(r.attempts for r in rows)}",
        )


SCENARIOS = ("outage", "hang", "disk-full", "replica", "sigterm", "sigkill")
ACCOUNTED = ("reload-before-tick", "stall", "clock-step", "read-only", "delivery-blip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each fault (default 60)")
    parser.add_argument("--only", default=",".join(SCENARIOS + ACCOUNTED), help="comma-separated scenarios")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (configs, daemon logs) and print its path"
    )
    args = parser.parse_args()
    postgres = os.environ.get("TTFT_TEST_POSTGRES_URL")
    if not postgres:
        raise SystemExit("set TTFT_TEST_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    work = Path(tempfile.mkdtemp(prefix="ttft-faults-"))
    bench = Bench(postgres, args.seconds, work)
    rows = []
    accounted: list[Accounted] = []
    try:
        for scenario in (name.strip() for name in args.only.split(",")):
            if scenario in ACCOUNTED:
                item = bench.accounted(scenario)
                accounted.append(item)
                print(f"{item}", file=sys.stderr, flush=True)
                continue
            row = bench.run(scenario)
            rows.append(row)
            print(
                f"{row.scenario}: probed {row.probed}, stored {row.stored}, distinct {row.distinct}, "
                f"skipped {row.skipped}, exit {row.exit_s:.1f} s {row.note}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        bench.close()
    print(f"\nfaults of {args.seconds:g} s, schedule every {TICK_S} s\n")
    if rows:
        print("| scenario | probed | stored | distinct | ticks skipped | exit s | note |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for r in rows:
            print(
                f"| {r.scenario} | {r.probed} | {r.stored} | {r.distinct} | {r.skipped} | {r.exit_s:.1f} | {r.note} |"
            )
    if accounted:
        print("\n| scenario | ticks due | probed | stored | counted missed | sent | received | note |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for a in accounted:
            counts = f"{a.due} | {a.probed} | {a.stored} | {a.missed} | {a.sent} | {a.received}"
            print(f"| {a.scenario} | {counts} | {a.note} |")
    if args.keep:
        print(f"\nwork directory kept: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
