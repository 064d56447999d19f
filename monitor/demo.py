"""`ttft-monitor demo`: the simulator and the real daemon, on a fast schedule, with one regression.

It runs the production code paths (the same `run` command, SQLite in a state directory, the `log`
receiver); only the schedule and the detection history are shortened so the story fits in minutes.
"""

from __future__ import annotations

import contextlib
import fcntl
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
import urllib.request
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from monitor.alert.receivers.log import EVENT as ALERT_LOG_EVENT
from monitor.exitcodes import EXIT_USAGE

TARGETS = ("qwen3-8b", "qwen3-14b", "gpt-4o-mini")
SLOWED = "qwen3-14b"
SLOW_FACTOR = 2.5
# The detector's trailing baseline in the demo (its config's `trailing_runs`). The slowdown waits until
# the slowed model has this many runs: a slowdown inside that window becomes part of the baseline it is
# measured against, and no page opens (replayed on a demo's own history: losing 3 of the 9 runs before
# a slowdown at 45 s, as a slow start on a busy machine does, and it never paged).
BASELINE_RUNS = 12


# Two demos started together (a second terminal, parallel tests) both found 9464 free, and the second's
# daemon could not bind it. A demo holds this lock from choosing its ports until
# its daemon listens, so the next one finds them taken and picks others.
PORTS_LOCK = Path(tempfile.gettempdir()) / "ttft-monitor-demo.ports.lock"
PORTS_LOCK_WAIT_S = 60.0  # past it the demo goes on unlocked: a port taken meanwhile is named by its daemon


class PortsLock:
    """The lock above, taken on creation and released once (`release`), or on exit, whatever ends it."""

    def __init__(self, path: Path = PORTS_LOCK, wait_s: float = PORTS_LOCK_WAIT_S) -> None:
        self._handle: IO[str] | None
        try:
            self._handle = open(path, "a")  # noqa: SIM115 - held until `release`
        except OSError:  # another user's lock file, a read-only /tmp: no lock, as before
            self._handle = None
            return
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.1)

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing drops the flock
            self._handle = None


def _wait_listening(daemon: subprocess.Popen[str], port: int, within_s: float = 60.0) -> None:
    """Until the daemon accepts connections on `port`, exits, or `within_s` passes."""
    deadline = time.monotonic() + within_s
    while daemon.poll() is None and time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def _free_port(preferred: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])


def demo_config(sim_url: str, state_dir: Path, metrics_port: int) -> str:
    targets = "\n".join(
        f"  {name}:\n    provider: sim\n    model: {name}\n    params:\n      max_tokens: 4\n"
        + ("      reasoning: least\n" if name.startswith("qwen") else "")
        for name in TARGETS
    )
    return f"""# Written by `ttft-monitor demo`: the simulator, a 5-second schedule, the log receiver.
location: demo
# The demo shares the machine with whatever else runs there: on a busy laptop the monitor's own
# lateness passes the production bound (5 ms) and every run would be left out of detection, so no
# incident would open. Its regression is hundreds of milliseconds; 100 ms of lateness cannot fake it.
probe_self_delay_bound_ms: 100
database:
  url: "sqlite+aiosqlite:///{state_dir}/demo.db"
  state_dir: "{state_dir}"
metrics:
  listen: "127.0.0.1:{metrics_port}"
providers:
  sim:
    base_url: "{sim_url}/v1"
    api: openai-chat
    max_concurrency: 3
targets:
{targets}prompts:
  short: {{tokens: 256}}
  long: {{tokens: 2048}}
jobs:
  - name: demo
    schedule: "*/5 * * * * *"
    targets: [{", ".join(TARGETS)}]
    prompts: [short, long]
    rounds: 3
    warmup: 0
    pause_s: 0.2
detection:
  # Production defaults want hours of history and 5-minute runs; the demo has a minute of 5-second runs.
  min_history_runs: 6
  trailing_runs: {BASELINE_RUNS}
alerts:
  base_url: "http://127.0.0.1:{metrics_port}/series"
  receivers:
    console: {{type: log}}
"""


def _start_sim(port: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "sim", "--port", str(port), "--seed", "7"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if match is None:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise RuntimeError(f"the simulator did not start on port {port} (`ttft-monitor sim --port {port}` says why)")
    return proc, match.group(1)


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=5).read()


class LiveTable:
    """Keeps the last TTFTs per series and redraws a small table."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.recent: dict[tuple[str, str], deque[float]] = defaultdict(lambda: deque(maxlen=9))
        self.errors: dict[tuple[str, str], int] = defaultdict(int)
        self.tty = out.isatty()
        self.last_draw = 0.0
        self.drawn_lines = 0  # lines of the table on screen (a terminal only)

    def add(self, event: dict[str, Any]) -> None:
        key = (event.get("target", "?"), event.get("prompt", "?"))
        if event.get("error") is None and event.get("ttft_ms") is not None:
            self.recent[key].append(float(event["ttft_ms"]))
        else:
            self.errors[key] += 1

    def render(self) -> str:
        lines = [f"{'target':12} {'prompt':6} {'last ms':>8} {'p50 ms':>8} {'n':>3} {'err':>3}"]
        for key in sorted(self.recent):
            values = sorted(self.recent[key])
            p50 = values[len(values) // 2]
            lines.append(
                f"{key[0]:12} {key[1]:6} {self.recent[key][-1]:8.0f} {p50:8.0f} {len(values):3d} {self.errors[key]:3d}"
            )
        return "\n".join(lines)

    def maybe_draw(self, elapsed: float) -> None:
        # A terminal redraws the table in place every second; a pipe gets a new table every 5 s.
        if not self.recent or time.monotonic() - self.last_draw < (1 if self.tty else 5):
            return
        self.last_draw = time.monotonic()
        text = f"-- TTFT after {elapsed:.0f} s (last 9 samples per series) --\n{self.render()}\n"
        if self.tty:
            self._erase()
            self.drawn_lines = text.count("\n")
            self.out.write(text)
        else:
            self.out.write("\n" + text)
        self.out.flush()

    def note(self, text: str) -> None:
        """A line above the table: on a terminal the table is erased, the line written, the table redrawn."""
        if self.tty:
            self._erase()
            self.out.write(text.strip("\n") + "\n")
            self.last_draw = 0.0
        else:
            self.out.write(text)
        self.out.flush()

    def _erase(self) -> None:
        if self.drawn_lines:
            # Cursor up to the table's first line, then clear to the end of the screen.
            self.out.write(f"\x1b[{self.drawn_lines}F\x1b[J")
            self.drawn_lines = 0


def _state_dir_problem(state_dir: Path) -> str | None:
    """Why the demo must not use (and first delete) `state_dir`: only a new, empty or earlier demo's directory."""
    if not state_dir.exists():
        try:
            state_dir.mkdir(parents=True)
        except OSError as exc:
            return f"cannot create it: {exc.strerror}; choose another --state-dir"
        return None
    if not state_dir.is_dir():
        return "is not a directory; choose another --state-dir"
    if any(state_dir.iterdir()) and not (state_dir / "demo.yaml").is_file():
        return (
            "holds files that are not an earlier demo's (no demo.yaml), and the demo starts by deleting its "
            "directory; choose a new or empty --state-dir"
        )
    return None


def run_demo(
    *, state_dir: Path, slow_after_s: float, recover_after_s: float, duration_s: float | None, out: IO[str] = sys.stdout
) -> int:
    problem = _state_dir_problem(state_dir)
    if problem:
        print(f"ttft-monitor demo: --state-dir {state_dir}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if state_dir.exists():
        shutil.rmtree(state_dir)
    state_dir.mkdir(parents=True)
    ports = PortsLock()
    try:
        # Any free port, not the simulator's 8400: `probe --with-sim` uses a server it finds there, and
        # the demo's would vanish under it when the demo ends (and its slowed model is no baseline).
        sim_proc, sim_url = _start_sim(0)
    except BaseException:
        ports.release()
        raise
    metrics_port = _free_port(9464)
    config_path = state_dir / "demo.yaml"
    config_path.write_text(demo_config(sim_url, state_dir.resolve(), metrics_port))
    daemon: subprocess.Popen[str] | None = None
    died: int | None = None
    stop = False

    def on_signal(_signum: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        upgrade = subprocess.run(
            [sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config_path)],
            capture_output=True,
            text=True,
        )
        if upgrade.returncode != 0:
            out.write(upgrade.stdout + upgrade.stderr)
            return upgrade.returncode
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        daemon = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            preexec_fn=os.setpgrp,  # Ctrl-C goes to the demo, which stops the daemon with SIGTERM
        )
        _wait_listening(daemon, metrics_port)
        ports.release()
        out.write(
            f"ttft-monitor demo: simulator at {sim_url}, daemon probing {', '.join(TARGETS)} every 5 s "
            f"(short and long prompts)\n  status pages: http://127.0.0.1:{metrics_port}/\n"
            f"  metrics: http://127.0.0.1:{metrics_port}/metrics   "
            f"config: {config_path}   database: {state_dir / 'demo.db'}\n"
            f"  {slow_after_s:.0f} s after the first probe {SLOWED} gets {SLOW_FACTOR}x slower (once it has "
            f"{BASELINE_RUNS} runs of history); {recover_after_s - slow_after_s:.0f} s later it recovers. "
            "Ctrl-C stops.\n"
        )
        out.flush()
        ended = _follow(
            daemon,
            sim_url,
            out,
            slow_after_s=slow_after_s,
            recover_after_s=recover_after_s,
            duration_s=duration_s,
            should_stop=lambda: stop,
        )
        # A daemon that exited on its own (a port taken, a database it cannot open) ends the demo with
        # its status; its one line naming the fix is on the screen already.
        if ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                died = daemon.wait(timeout=10)  # its output ended: it is exiting
    finally:
        ports.release()
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        sim_proc.terminate()
        sim_proc.wait(timeout=10)
        for pipe in (sim_proc.stdout, daemon.stdout if daemon is not None else None):
            if pipe is not None:
                pipe.close()
        signal.signal(signal.SIGINT, previous)
        out.write("ttft-monitor demo: stopped\n")
    return died or 0


@dataclass
class Story:
    """When the demo slows its model and lets it recover. Its clock starts at the first probe, not at the
    daemon's launch: the start-up (seconds on a busy machine) would otherwise eat the history the detector
    needs before the slowdown; and the slowdown waits for `BASELINE_RUNS` runs of the slowed model."""

    slow_after_s: float
    recover_after_s: float
    started: float | None = None  # monotonic time of the first probe sample
    runs: int = 0  # the slowed model's runs so far (its short prompt's first rounds: one a run)
    slowed_at: float | None = None  # on the story's clock
    recovered: bool = False

    def saw_sample(self, event: dict[str, Any], now: float) -> None:
        if self.started is None:
            self.started = now
        if event.get("target") == SLOWED and event.get("prompt") == "short" and event.get("round") == 1:
            self.runs += 1

    def elapsed(self, now: float) -> float:
        return 0.0 if self.started is None else now - self.started

    def slow_due(self, now: float) -> bool:
        return (
            self.started is not None
            and self.slowed_at is None
            and self.elapsed(now) >= self.slow_after_s
            and self.runs >= BASELINE_RUNS
        )

    def recover_due(self, now: float) -> bool:
        # Slowed for as long as asked, however long the slowdown waited for its history.
        if self.slowed_at is None or self.recovered:
            return False
        return self.elapsed(now) >= max(self.recover_after_s, self.slowed_at + self.recover_after_s - self.slow_after_s)


def _follow(
    daemon: subprocess.Popen[str],
    sim_url: str,
    out: IO[str],
    *,
    slow_after_s: float,
    recover_after_s: float,
    duration_s: float | None,
    should_stop: Any,
) -> bool:
    """Tells the story while the daemon runs; whether the daemon ended on its own (its output ended)."""
    import selectors

    assert daemon.stdout is not None
    table = LiveTable(out)
    story = Story(slow_after_s=slow_after_s, recover_after_s=recover_after_s)
    selector = selectors.DefaultSelector()
    selector.register(daemon.stdout, selectors.EVENT_READ)
    launched = time.monotonic()
    while not should_stop() and daemon.poll() is None:
        now = time.monotonic()
        if duration_s is not None and now - launched > duration_s:
            break
        elapsed = story.elapsed(now)
        if story.slow_due(now):
            profile = json.load(urllib.request.urlopen(f"{sim_url}/sim/models", timeout=5))["models"][SLOWED]
            _post(
                f"{sim_url}/sim/models/{SLOWED}",
                {
                    "ttft_base_ms": profile["ttft_base_ms"] * SLOW_FACTOR,
                    "prefill_ms_per_1k": profile["prefill_ms_per_1k"] * SLOW_FACTOR,
                },
            )
            table.note(f"\n>>> {elapsed:.0f} s: made {SLOWED} {SLOW_FACTOR}x slower (simulated regression)\n")
            story.slowed_at = elapsed
        if story.recover_due(now):
            _post(f"{sim_url}/sim/reset", {})
            table.note(f"\n>>> {elapsed:.0f} s: {SLOWED} is back to normal\n")
            story.recovered = True
        if not selector.select(timeout=0.5):
            table.maybe_draw(elapsed)
            continue
        line = daemon.stdout.readline()
        if not line:
            return True
        try:
            event = json.loads(line)
        except ValueError:
            table.note(line)
            continue
        name = event.get("event")
        if name == "probe_sample":
            story.saw_sample(event, time.monotonic())
            table.add(event)
        elif name == ALERT_LOG_EVENT:
            # The headline first ("[PAGE] TTFT regression on ..."), then why, in the detector's words.
            headline = event.get("message") or event.get("summary") or json.dumps(event)
            summary = event.get("summary")
            why = f"\n    {summary}" if summary and summary != headline else ""
            table.note(f"\n!!! {headline}{why}\n")
        elif event.get("level") in ("warning", "error"):
            details = {k: v for k, v in event.items() if k not in ("event", "level", "timestamp")}
            table.note(f"  [{event.get('level')}] {name}: {json.dumps(details)[:300]}\n")
        table.maybe_draw(elapsed)
    return daemon.poll() is not None
