"""The export child (monitor/otel/encoder.py) wedged while a snapshot larger than its pipe holds is being
written to it: the parent must still give up within its bound (the export timeout plus the margin),
kill it and start another, not block in the write for as long as the child stays wedged."""

from __future__ import annotations

import os
import signal
import threading
import time

from structlog.testing import capture_logs

from monitor.otel import semconv
from monitor.otel.aggregate import Key, Snapshot
from monitor.otel.encoder import EncoderProcess, EncoderSpec
from monitor.otel.export import instruments
from monitor.otel.settings import OtelConfig, resolve
from monitor.probe.proxy import ProxyEnvironment
from tests.support.otlp_receiver import otlp_receiver


def _snapshot(points: int) -> Snapshot:
    now = time.time_ns()
    keys: list[Key] = [(("ttft.target", f"target-{i:06d}-" + "x" * 40),) for i in range(points)]
    counters = {semconv.PROBES: {key: float(i) for i, key in enumerate(keys)}}
    return Snapshot(start_ns=now - 1_000_000_000, end_ns=now, counters=counters)


def test_a_wedged_child_is_killed_within_its_bound_even_mid_write_of_a_large_snapshot() -> None:
    with otlp_receiver() as receiver:
        settings = resolve(OtelConfig(endpoint=receiver.url, timeout_s=1), {})
        assert settings is not None
        spec = EncoderSpec(settings, instruments((0.1, 1)), ProxyEnvironment.from_environ({}))
        encoder = EncoderProcess(spec, answer_margin_s=1.0)
        try:
            assert encoder.export(_snapshot(1)) is not None  # started, past its start-up
            wedged = encoder.pid
            assert wedged is not None
            os.kill(wedged, signal.SIGSTOP)
            big = _snapshot(50_000)  # several megabytes pickled: far more than a pipe holds
            answers: list[bool | None] = []
            with capture_logs() as logged:
                started = time.monotonic()
                worker = threading.Thread(target=lambda: answers.append(encoder.export(big)), daemon=True)
                worker.start()
                worker.join(15)
                took = time.monotonic() - started
            if worker.is_alive():  # the old code blocks in the write: free it so the test ends
                os.kill(wedged, signal.SIGKILL)
                worker.join(10)
            assert answers == [False] and took < 2.0 + 2.0, (answers, took)
            assert [e["pid"] for e in logged if e["event"] == "otel_encoder_killed"] == [wedged]
            assert encoder.export(_snapshot(1)) is not None and encoder.pid not in (None, wedged)
        finally:
            encoder.close()
