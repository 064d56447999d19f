"""The export child (monitor/otel/encoder.py) as a real process: it encodes and sends the periodic metric
exports, is replaced when it dies, killed when it wedges, and given up for in-process export when it
cannot start; to a loopback OTLP/HTTP receiver that decodes with the official opentelemetry-proto messages."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from monitor.otel import semconv
from monitor.otel.export import OtelTelemetry
from monitor.otel.incident import IncidentReading
from monitor.otel.settings import OtelConfig, resolve
from tests.support.otlp_receiver import Receiver, metrics_by_name, otlp_receiver
from tests.support.store_fixtures import T0, make_samples

INTERVAL_S = 0.2


@contextmanager
def exporting(
    receiver: Receiver,
    environ: dict[str, str] | None = None,
    registry: CollectorRegistry | None = None,
    **encoder_options: Any,
) -> Iterator[OtelTelemetry]:
    settings = resolve(OtelConfig(endpoint=receiver.url, export_interval_s=INTERVAL_S, timeout_s=1), environ or {})
    assert settings is not None
    telemetry = OtelTelemetry(
        settings,
        registry=registry if registry is not None else CollectorRegistry(),
        location="lab",
        endpoints={},
        ttft_buckets_s=(0.1, 1),
        encoder_options=encoder_options,
    )
    try:
        yield telemetry
    finally:
        telemetry.close()


def probe(telemetry: OtelTelemetry, n: int = 1) -> None:
    for sample in make_samples("fast", "short", at=T0, rounds=n, warmup=0):
        telemetry.observe_sample(sample, provider="p", probe_job="j")


def wait_until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s")


def exports(receiver: Receiver) -> int:
    return len(receiver.of("metrics"))


def probes_counted(receiver: Receiver) -> int:
    counted = metrics_by_name(receiver.of("metrics")).get(semconv.PROBES, [])
    return int(sum(p.as_int for p in counted[-1].sum.data_points)) if counted else 0


def test_a_child_process_in_its_own_session_sends_the_exports_and_a_stopped_child_stops_them() -> None:
    with otlp_receiver() as receiver, exporting(receiver) as telemetry:
        probe(telemetry, 2)
        wait_until(lambda: probes_counted(receiver) == 2)
        pid = telemetry.encoder_pid
        assert pid is not None and pid != os.getpid()
        assert os.getsid(pid) != os.getsid(0)  # a terminal's Ctrl-C or the unit's signals are not its business
        # The child is what sends: stopped, nothing arrives however long the export thread waits.
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(2 * INTERVAL_S)  # an export may have been on the wire as it stopped
            before = exports(receiver)
            time.sleep(5 * INTERVAL_S)
            assert exports(receiver) == before
        finally:
            os.kill(pid, signal.SIGCONT)
        probe(telemetry)
        wait_until(lambda: probes_counted(receiver) == 3)
        assert telemetry.encoder_pid == pid  # resumed, not replaced: it answered within its bound
    wait_until(lambda: not _alive(pid), timeout=10)  # close ended it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_that_dies_is_replaced_and_its_end_logged_with_its_exit_code() -> None:
    with otlp_receiver() as receiver, capture_logs() as logged, exporting(receiver) as telemetry:
        probe(telemetry)
        wait_until(lambda: probes_counted(receiver) == 1)
        first = telemetry.encoder_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        probe(telemetry)
        wait_until(lambda: probes_counted(receiver) == 2)
        second = telemetry.encoder_pid
        assert second is not None and second != first
    stopped = [e for e in logged if e["event"] == "otel_encoder_stopped"]
    assert [(e["pid"], e["exit_code"]) for e in stopped] == [(first, -signal.SIGKILL)]


def test_a_wedged_child_is_killed_after_the_export_timeout_and_a_new_one_takes_over() -> None:
    registry = CollectorRegistry()
    exports = {"signal": "metrics", "outcome": "ok"}
    with (
        otlp_receiver() as receiver,
        capture_logs() as logged,
        exporting(receiver, registry=registry, answer_margin_s=1.0) as telemetry,
    ):
        probe(telemetry)
        wait_until(lambda: probes_counted(receiver) == 1)
        # Stopped only once its first answer reached this process: the receiver has the export a moment before
        # that, and a child stopped in between is waited for with its start-up margin (30 s), not 1 s.
        wait_until(lambda: (registry.get_sample_value("ttft_monitor_otel_exports_total", exports) or 0) >= 1)
        wedged = telemetry.encoder_pid
        assert wedged is not None
        os.kill(wedged, signal.SIGSTOP)
        stopped_at = time.monotonic()
        probe(telemetry)
        wait_until(lambda: not _running(wedged))
        took = time.monotonic() - stopped_at
        wait_until(lambda: probes_counted(receiver) == 2, timeout=60)  # a new child, started anew
        assert telemetry.encoder_pid not in (None, wedged)
    killed = [e for e in logged if e["event"] == "otel_encoder_killed"]
    assert [e["pid"] for e in killed] == [wedged]
    assert killed[0]["after_s"] == 2.0  # timeout_s 1 + the margin
    # Killed after its bound (timeout 1 s + margin 1 s from the first export it did not answer), not later.
    assert 2.0 <= took < 2.0 + INTERVAL_S + 1.5, took


def test_a_child_that_cannot_start_leaves_export_in_process_said_once() -> None:
    for command in (["/nonexistent/python"], [sys.executable, "-c", "pass"]):
        with otlp_receiver() as receiver, capture_logs() as logged, exporting(receiver, command=command) as telemetry:
            for n in (1, 2, 3):
                probe(telemetry)
                wait_until(lambda n=n: probes_counted(receiver) == n)
            assert telemetry.encoder_pid is None
        unavailable = [e for e in logged if e["event"] == "otel_encoder_unavailable"]
        assert len(unavailable) == 1, (command, logged)
        assert "in the daemon's own process" in unavailable[0]["hint"]


def test_metrics_turned_off_by_the_environment_still_export_incidents_and_start_no_child() -> None:
    with otlp_receiver() as receiver:
        with exporting(receiver, {"OTEL_METRICS_EXPORTER": "none"}) as telemetry:
            probe(telemetry)
            telemetry.observe_incident(
                IncidentReading(
                    "open",
                    series=("fast", "short", "lab"),
                    kind="regression",
                    severity="page",
                    baseline_ms=200.0,
                    observed_ms=520.0,
                    ratio=2.6,
                    error_class=None,
                )
            )
            time.sleep(3 * INTERVAL_S)
            assert telemetry.encoder_pid is None
        receiver.wait_for("logs")
        assert receiver.of("metrics") == []


PARENT = """
import sys, time
from prometheus_client import CollectorRegistry
from monitor.otel.export import OtelTelemetry
from monitor.otel.settings import OtelConfig, resolve
from tests.support.store_fixtures import T0, make_samples

settings = resolve(OtelConfig(endpoint=sys.argv[1], export_interval_s=0.2), {})
telemetry = OtelTelemetry(settings, registry=CollectorRegistry(), location="lab", endpoints={}, ttft_buckets_s=(0.1,))
for sample in make_samples("fast", "short", at=T0, rounds=1, warmup=0):
    telemetry.observe_sample(sample, provider="p", probe_job="j")
while telemetry.encoder_pid is None:
    time.sleep(0.05)
print(telemetry.encoder_pid, flush=True)
time.sleep(600)
"""


def test_the_child_never_outlives_a_daemon_killed_outright() -> None:
    import subprocess

    with otlp_receiver() as receiver:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, receiver.url],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            receiver.wait_for("metrics")
            parent.kill()  # SIGKILL: no close, no atexit; the child sees its stdin end
            parent.wait()
            # Not our child: it is reaped by init, so "gone" is "no such process" or a zombie's state.
            wait_until(lambda: not _running(child), timeout=10)
        finally:
            parent.kill()
            parent.wait()
            if parent.stdout is not None:
                parent.stdout.close()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    # Gone before the open, or reaped between the open and the read (the read then fails with ESRCH).
    except (FileNotFoundError, ProcessLookupError):
        return False
