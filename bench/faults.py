"""Faults against real daemons: what is probed, stored, doubled, skipped, and how fast they stop.

Every scenario runs real `ttft-monitor run` processes on a 2-second schedule against the simulator
(`ttft-monitor sim`) and the real PostgreSQL behind a real TCP proxy (tests/tcp_proxy.py):

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

    TTFT_TEST_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test \\
        .venv/bin/python bench/faults.py [--seconds 60] [--only hang,sigterm]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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

from tests.tcp_proxy import TcpProxy  # noqa: E402 - the repository's own proxy

TICK_S = 2
SKIP_EVENTS = ("job_run_skipped", "job_run_missed", "job_runs_coalesced")


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


def start_daemon(config: Path, log: Path) -> Daemon:
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
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


SCENARIOS = ("outage", "hang", "disk-full", "replica", "sigterm", "sigkill")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each fault (default 60)")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    args = parser.parse_args()
    postgres = os.environ.get("TTFT_TEST_POSTGRES_URL")
    if not postgres:
        raise SystemExit("set TTFT_TEST_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    work = Path(tempfile.mkdtemp(prefix="ttft-faults-"))
    bench = Bench(postgres, args.seconds, work)
    rows = []
    try:
        for scenario in args.only.split(","):
            row = bench.run(scenario.strip())
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
    print("| scenario | probed | stored | distinct | ticks skipped | exit s | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r.scenario} | {r.probed} | {r.stored} | {r.distinct} | {r.skipped} | {r.exit_s:.1f} | {r.note} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
