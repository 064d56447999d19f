"""systemd's readiness and watchdog protocol (sd_notify), without libsystemd.

The protocol is one datagram per message to the unix socket named by `$NOTIFY_SOCKET`, carrying
newline-separated `KEY=VALUE` assignments (`READY=1`, `WATCHDOG=1`, ...). See sd_notify(3).

Outside systemd (no `$NOTIFY_SOCKET`) every call is a no-op returning False, so callers never branch on
where they run. A failed send returns False and never raises or logs: a monitor must not stop probing
because its supervisor went away.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"


class Notifier:
    """Sends state changes to the service manager. Build it with `Notifier.from_environ(os.environ)`."""

    def __init__(self, address: str | bytes | None) -> None:
        # A str is a filesystem path; bytes starting with NUL name an abstract socket.
        self.address = address

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Notifier:
        """A notifier for `$NOTIFY_SOCKET` (`/path` or `@abstract`); disabled when unset or unusable."""
        return cls(socket_address(environ.get(NOTIFY_SOCKET, "")))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send `KEY=VALUE` assignments in one datagram. True if it was sent, False otherwise."""
        if self.address is None or not assignments:
            return False
        message = "\n".join(assignments).encode("utf-8", errors="replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Called from the event loop: a full receive queue must cost a lost message, not a stall.
                sock.setblocking(False)
                sock.sendto(message, self.address)
        except OSError:
            return False
        return True

    def ready(self) -> bool:
        """Start-up is complete: with `Type=notify`, systemd considers the service started from now."""
        return self.notify("READY=1")

    def reloading(self) -> bool:
        """A config reload began; send `ready()` when it is done (or rejected and the old config kept)."""
        # MONOTONIC_USEC lets systemd tell this reload from an earlier one (required for Type=notify-reload).
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> bool:
        """Shutdown began; systemd shows the unit as deactivating while in-flight work drains."""
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        """Still alive: resets the `WatchdogSec=` timer. Send it from the loop whose liveness it vouches for."""
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """A one-line status shown by `systemctl status`."""
        # A newline would start a new assignment: status text must not be able to send READY=1 etc.
        return self.notify("STATUS=" + " ".join(text.splitlines()))


def socket_address(value: str) -> str | bytes | None:
    """The address to send to for a `$NOTIFY_SOCKET` value, or None when there is none we can use.

    `/run/systemd/notify` is a path; `@name` is the abstract socket `\\0name`. Anything else (empty,
    relative, or a newer transport such as `vsock:`) disables notification rather than failing.
    """
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode("utf-8")
    return None


def watchdog_interval(environ: Mapping[str, str], *, pid: int | None = None) -> float | None:
    """Seconds between `WATCHDOG=1` pings: half of `WatchdogSec=`, as sd_watchdog_enabled(3) advises.

    None when systemd expects no pings: `$WATCHDOG_USEC` unset or not a positive integer, or
    `$WATCHDOG_PID` naming another process (the variables were inherited from a parent).
    """
    try:
        usec = int(environ.get(WATCHDOG_USEC, ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = environ.get(WATCHDOG_PID)
    if owner is not None:
        try:
            if int(owner) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    return usec / 2 / 1_000_000
