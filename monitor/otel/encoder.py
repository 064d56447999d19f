"""Periodic metric exports encoded and sent by a child process, so that encoding never holds this one's GIL.

Why a process: the official OTLP exporter turns `MetricsData` into protobuf in a Python loop, about
40 ms for 1,700 points (100 series), and a thread doing that holds the interpreter lock the probes'
loop needs to stamp its bytes: the probes that straddle an export read several milliseconds late
(bench/daemon.py --otel). Here the parent only takes its snapshot (about 1 ms) and pickles it (about
2 ms); `python -m monitor.otel.encoder` builds the SDK's data, encodes and posts it, and answers one
byte per export.

The protocol on the child's stdin is length-prefixed pickles: first an `EncoderSpec`, then one
`Snapshot` per export; on its stdout one byte per snapshot, b"1" when the export went through. The
child is ours (same interpreter, same code), so pickle is safe here. It runs in a session of its own
(a terminal's Ctrl-C and the daemon's signals are not its business), ignores SIGINT, and exits when
its stdin closes: when the parent closes it, or dies.

The parent's side (`EncoderProcess`) starts it lazily at the first export, replaces a child that
died, kills one that does not answer within the export timeout plus a margin, and says when it cannot
be started at all, so that the caller falls back to exporting in its own process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import structlog

from monitor.otel.aggregate import Instrument, Snapshot
from monitor.otel.settings import Resolved
from monitor.probe.proxy import ProxyEnvironment

_LENGTH = struct.Struct("!I")
OK, FAILED = b"1", b"0"
# Seconds beyond the export's own timeout before a silent child is taken for wedged and killed.
ANSWER_MARGIN_S = 10.0
# More for its first answer: it imports the SDK and builds its exporter first (about a second; a
# loaded machine may take much longer).
START_MARGIN_S = 30.0
_DIED = object()  # the child ended before it answered


@dataclass(frozen=True)
class EncoderSpec:
    """What the child needs to export as the parent would: where to, how, and what each instrument is."""

    settings: Resolved
    instruments: tuple[Instrument, ...]
    proxies: ProxyEnvironment


def write_frame(stream: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Any | None:
    """The next value, or None at the end of the stream."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


class EncoderProcess:
    """The parent's handle on the child: `export(snapshot)` is True or False when the child answered,
    None when no child could do it (the caller exports in-process). One caller at a time."""

    def __init__(
        self,
        spec: EncoderSpec,
        *,
        answer_margin_s: float = ANSWER_MARGIN_S,
        start_margin_s: float = START_MARGIN_S,
        command: Sequence[str] | None = None,
    ) -> None:
        self._spec = spec
        self._answer_margin_s = answer_margin_s
        self._start_margin_s = start_margin_s
        self._command = list(command) if command is not None else [sys.executable, "-m", "monitor.otel.encoder"]
        self._child: subprocess.Popen[bytes] | None = None
        self._answered = False  # has the current child answered once (it is past its start-up)
        self._early_deaths = 0  # children in a row that ended before their first answer
        self._unavailable = False  # could not be started: said once, then the caller exports itself
        self._lock = threading.Lock()
        self._log = structlog.get_logger()

    @property
    def answer_bound_s(self) -> float:
        """How long one export may wait for the child at most (its start-up included)."""
        return self._spec.settings.timeout_for("metrics") + self._answer_margin_s + self._start_margin_s

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def export(self, snapshot: Snapshot) -> bool | None:
        with self._lock:
            if self._unavailable:
                return None
            # A child found dead is replaced and the snapshot sent again, once.
            for _attempt in range(2):
                child = self._running()
                if child is None:
                    return None
                answered_before = self._answered
                answer = self._exchange(child, snapshot)
                if answer is not _DIED:
                    self._early_deaths = 0
                    return answer is True  # False: failed, or killed for not answering (not retried)
                if not answered_before:
                    self._early_deaths += 1
                    if self._early_deaths >= 2:  # it cannot even start (a broken install): stop trying
                        self._give_up("the export child ended before its first answer, twice")
                        return None
            return False

    def _running(self) -> subprocess.Popen[bytes] | None:
        child = self._child
        if child is not None and child.poll() is None:
            return child
        if child is not None:
            self._stopped(child)
        try:
            child = subprocess.Popen(
                self._command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            assert child.stdin is not None
            write_frame(child.stdin, self._spec)
            os.set_blocking(child.stdin.fileno(), False)  # snapshots are written within a deadline (_exchange)
        except (OSError, ValueError) as exc:
            if child is not None and child.poll() is None:
                child.kill()
            self._child = None
            self._give_up(type(exc).__name__)
            return None
        self._child, self._answered = child, False
        return child

    def _exchange(self, child: subprocess.Popen[bytes], snapshot: Snapshot) -> bool | object:
        """The child's answer (False also when it was killed for not answering); `_DIED` when it ended
        (or its pipe broke) before answering."""
        assert child.stdin is not None and child.stdout is not None
        margin = self._answer_margin_s + (0.0 if self._answered else self._start_margin_s)
        bound = self._spec.settings.timeout_for("metrics") + margin
        deadline = time.monotonic() + bound
        # Written within the same bound: a snapshot larger than the pipe holds would block on a wedged child.
        data = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
        frame = memoryview(_LENGTH.pack(len(data)) + data)
        fd_in = child.stdin.fileno()
        try:
            while frame:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._wedged(child, bound)
                _, writable, _ = select.select([], [fd_in], [], left)
                if writable:
                    with contextlib.suppress(BlockingIOError):
                        frame = frame[os.write(fd_in, frame) :]
        except OSError:  # BrokenPipeError: it ended
            self._stopped(child)
            return _DIED
        fd = child.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return self._wedged(child, bound)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                break
        answer = os.read(fd, 1)
        if not answer:
            self._stopped(child)
            return _DIED
        self._answered = True
        return answer == OK

    def _wedged(self, child: subprocess.Popen[bytes], bound: float) -> bool:
        self._log.warning(
            "otel_encoder_killed",
            pid=child.pid,
            after_s=round(bound, 1),
            hint="the export child did not answer within the export timeout; a new one takes the next export",
        )
        self._kill(child)
        return False

    def _give_up(self, why: str) -> None:
        self._unavailable = True
        self._log.warning(
            "otel_encoder_unavailable",
            error=why,
            hint="metric exports are encoded in the daemon's own process instead, which delays probes "
            "by a few milliseconds around each export",
        )

    def _stopped(self, child: subprocess.Popen[bytes]) -> None:
        try:
            code = child.wait(5)  # it closed its pipe: it is gone or going
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        self._log.warning(
            "otel_encoder_stopped",
            pid=child.pid,
            exit_code=code,
            hint="the export child ended; a new one is started for the next export",
        )
        self._close_pipes(child)
        if self._child is child:
            self._child = None

    def _kill(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:
            child.kill()
        child.wait()
        self._close_pipes(child)
        if self._child is child:
            self._child = None

    @staticmethod
    def _close_pipes(child: subprocess.Popen[bytes]) -> None:
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def close(self, timeout_s: float = 5.0) -> None:
        """End the child: its stdin closes, it exits; killed if it has not within `timeout_s`."""
        with self._lock:
            child, self._child = self._child, None
            if child is None:
                return
            try:
                if child.stdin is not None:
                    child.stdin.close()
                child.wait(timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def serve(stdin: IO[bytes], stdout: IO[bytes], *, export: Callable[[Snapshot], bool] | None = None) -> int:
    """The child's loop: read the spec, then export each snapshot and answer; 0 at the end of stdin."""
    spec = read_frame(stdin)
    if not isinstance(spec, EncoderSpec):
        return 2
    if export is None:
        export = _exporter(spec)
    while True:
        snapshot = read_frame(stdin)
        if snapshot is None:
            return 0
        try:
            ok = export(snapshot)
        except Exception:  # an exporter's failure is an answer, not the end of the child
            ok = False
        stdout.write(OK if ok else FAILED)
        stdout.flush()


def _exporter(spec: EncoderSpec) -> Callable[[Snapshot], bool]:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult
    from opentelemetry.sdk.resources import Resource

    from monitor.otel.export import metrics_data, otlp_session, quiet_sdk_loggers

    quiet_sdk_loggers()
    settings = spec.settings
    timeout = settings.timeout_for("metrics")
    exporter = OTLPMetricExporter(
        endpoint=settings.endpoints["metrics"],
        headers=settings.headers["metrics"],
        timeout=timeout,
        session=otlp_session(settings.endpoints["metrics"], spec.proxies),
    )
    resource = Resource(dict(settings.resource))

    def export(snapshot: Snapshot) -> bool:
        data = metrics_data(snapshot, spec.instruments, resource, settings)
        return exporter.export(data, timeout_millis=timeout * 1000) == MetricExportResult.SUCCESS

    return export


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when it ends: by closing stdin
    try:
        return serve(sys.stdin.buffer, sys.stdout.buffer)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


if __name__ == "__main__":
    # Run as the package's module, not as __main__: the spec and snapshots unpickle as its classes.
    from monitor.otel import encoder

    sys.exit(encoder.main())
