"""systemd: the notify protocol over real unix datagram sockets, and the unit file in systemd/.

The unit is checked by `systemd-analyze verify` (installed from Debian's `systemd` package when missing),
and its command lines are parsed with the real CLI parser.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitor.config.loader import load_config
from monitor.systemd_notify import Notifier, socket_address, watchdog_interval
from tests.conftest import ROOT
from tests.support import apt
from tests.support.commands import parse_cli, shutdown_grace_default

UNIT = ROOT / "systemd" / "ttft-monitor.service"
INSTALLED_BINARY = "/opt/ttft-monitor/.venv/bin/ttft-monitor"
CONFIG_PATH = "/etc/ttft-monitor/config.yaml"
# What systemd substitutes for the specifiers the unit uses, for a system service.
SPECIFIERS = {"%S": "/var/lib", "%d": "/run/credentials/ttft-monitor.service", "%%": "%"}


# ---------------------------------------------------------------- the notify protocol


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for systemd's, and the NOTIFY_SOCKET value naming it."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        yield sock, str(path)


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[socket.socket, str]]:
    name = f"ttft-monitor-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        yield sock, "@" + name


@pytest.mark.parametrize(
    ("send", "expected"),
    [
        (Notifier.ready, b"READY=1"),
        (Notifier.stopping, b"STOPPING=1"),
        (Notifier.watchdog, b"WATCHDOG=1"),
        (lambda n: n.status("probing 3 targets"), b"STATUS=probing 3 targets"),
    ],
    ids=["ready", "stopping", "watchdog", "status"],
)
def test_it_sends_each_state_as_one_datagram_to_a_socket_path(
    receiver: tuple[socket.socket, str], send: Any, expected: bytes
) -> None:
    sock, address = receiver
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": address})
    assert notifier.enabled
    assert send(notifier) is True
    assert sock.recv(4096) == expected


def test_it_sends_to_an_abstract_socket(abstract_receiver: tuple[socket.socket, str]) -> None:
    sock, address = abstract_receiver
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": address})
    assert notifier.ready() is True
    assert notifier.watchdog() is True
    assert notifier.stopping() is True
    assert [sock.recv(4096) for _ in range(3)] == [b"READY=1", b"WATCHDOG=1", b"STOPPING=1"]


def test_a_status_cannot_smuggle_in_other_assignments(receiver: tuple[socket.socket, str]) -> None:
    sock, address = receiver
    assert Notifier.from_environ({"NOTIFY_SOCKET": address}).status("reloaded\nREADY=1")
    assert sock.recv(4096) == b"STATUS=reloaded READY=1"


def test_reloading_carries_the_monotonic_time_systemd_asks_for(receiver: tuple[socket.socket, str]) -> None:
    sock, address = receiver
    assert Notifier.from_environ({"NOTIFY_SOCKET": address}).reloading()
    first, second = sock.recv(4096).decode().split("\n")
    assert first == "RELOADING=1"
    assert second.startswith("MONOTONIC_USEC=")
    assert int(second.removeprefix("MONOTONIC_USEC=")) > 0


def test_it_does_nothing_outside_systemd() -> None:
    notifier = Notifier.from_environ({})
    assert not notifier.enabled
    assert [notifier.ready(), notifier.watchdog(), notifier.status("x"), notifier.stopping()] == [False] * 4


def test_a_send_that_fails_returns_false_instead_of_raising(tmp_path: Path) -> None:
    gone = Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert gone.enabled
    assert gone.ready() is False
    too_long = Notifier.from_environ({"NOTIFY_SOCKET": "/" + "x" * 200})
    assert too_long.watchdog() is False


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@abstract/name", b"\0abstract/name"),
        ("", None),
        ("@", None),
        ("relative/path", None),
        ("vsock:2:1234", None),  # newer systemd transports: not spoken here, so notification is off
    ],
)
def test_notify_socket_values(value: str, address: str | bytes | None) -> None:
    assert socket_address(value) == address


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_the_timeout(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval(environ, pid=4242) == interval


def test_watchdog_interval_checks_this_process_by_default() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0


# ---------------------------------------------------------------- the unit file


def read_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as (key, value) lists, repeated keys kept in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"line {number}: continuation lines make the tests' parsing unreliable"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        assert current is not None, f"line {number}: {line!r} is outside any section"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(section: list[tuple[str, str]], key: str) -> list[str]:
    return [value for k, value in section if k == key]


def one(section: list[tuple[str, str]], key: str) -> str:
    found = values(section, key)
    assert len(found) == 1, f"{key}= appears {len(found)} times, expected once"
    return found[0]


def expand(value: str) -> str:
    for specifier, replacement in SPECIFIERS.items():
        value = value.replace(specifier, replacement)
    return value


def unit_environment(service: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in values(service, "Environment"):
        for assignment in shlex.split(line):
            name, _, value = assignment.partition("=")
            env[name] = expand(value)
    return env


def command_argv(value: str) -> list[str]:
    """An Exec*= line as argv, without systemd's prefixes (-, @, +, !, :)."""
    return shlex.split(value.lstrip("-@+!:"))


SERVICE = read_unit(UNIT.read_text())["Service"]


def test_the_daemon_tells_systemd_when_it_is_ready_and_alive() -> None:
    assert one(SERVICE, "Type") == "notify"
    assert one(SERVICE, "NotifyAccess") == "main"
    assert one(SERVICE, "WatchdogSec") == "30"
    assert one(SERVICE, "Restart") == "on-failure"
    assert values(SERVICE, "RestartSec")


def test_exec_start_runs_the_daemon_with_the_config_in_the_configuration_directory() -> None:
    argv = command_argv(one(SERVICE, "ExecStart"))
    assert argv[0] == INSTALLED_BINARY
    args = parse_cli(argv[1:])
    assert args.command == "run"
    assert args.config == CONFIG_PATH
    assert Path(CONFIG_PATH).parent == Path("/etc") / one(SERVICE, "ConfigurationDirectory")


def test_exec_start_pre_migrates_the_database_with_the_same_config() -> None:
    argv = command_argv(one(SERVICE, "ExecStartPre"))
    assert argv[0] == INSTALLED_BINARY
    assert argv[1:3] == ["db", "upgrade"]
    args = parse_cli(argv[1:])
    assert args.config == CONFIG_PATH


def test_exec_reload_sends_sighup_to_the_main_process() -> None:
    assert command_argv(one(SERVICE, "ExecReload")) == ["/bin/kill", "-HUP", "$MAINPID"]


def test_systemd_waits_longer_than_the_daemons_shutdown_grace() -> None:
    grace = shutdown_grace_default()
    assert float(one(SERVICE, "TimeoutStopSec")) > grace, "systemd would SIGKILL the daemon mid-shutdown"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DynamicUser", "yes"),
        ("StateDirectory", "ttft-monitor"),
        ("UMask", "0077"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("CapabilityBoundingSet", ""),
    ],
)
def test_the_sandbox_is_on(key: str, value: str) -> None:
    assert one(SERVICE, key) == value


def test_system_calls_are_limited_to_what_services_need() -> None:
    assert values(SERVICE, "SystemCallFilter")[0] == "@system-service"


def test_the_example_config_keeps_its_state_in_the_state_directory(tmp_path: Path) -> None:
    """ProtectSystem=strict leaves only the StateDirectory writable: the example config must write there."""
    env = unit_environment(SERVICE)
    state = Path("/var/lib") / one(SERVICE, "StateDirectory")
    assert Path(expand(one(SERVICE, "WorkingDirectory"))) == state
    config = load_config(ROOT / "config.yaml", environ=env)
    assert config.database.state_dir == state
    assert config.database.url.startswith(f"sqlite+aiosqlite:///{state}/")


def test_each_commented_credential_pairs_with_its_file_variable() -> None:
    text = UNIT.read_text()
    credentials = {
        line.removeprefix("#LoadCredential=").split(":", 1)[0]
        for line in text.splitlines()
        if line.startswith("#LoadCredential=")
    }
    files = {
        line.removeprefix("#Environment=").split("=", 1)[1]
        for line in text.splitlines()
        if line.startswith("#Environment=") and "_FILE=" in line
    }
    assert credentials, "the unit should show how to pass an API key with LoadCredential="
    assert files == {f"%d/{name}" for name in credentials}


# ---------------------------------------------------------------- systemd-analyze verify


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        why = apt.install("systemd", "systemd-analyze")
        found = shutil.which("systemd-analyze")
        if found is None:
            pytest.skip(
                "!!! systemd/ttft-monitor.service was NOT verified: systemd-analyze is missing and "
                f"installing Debian's systemd package failed ({why or 'no systemd-analyze after install'})"
            )
    return found


def runnable_copy(text: str, directory: Path) -> Path:
    """The unit with the install path swapped for an executable that exists here.

    `verify` refuses a unit whose Exec*= binary does not exist, and this machine has no /opt/ttft-monitor;
    the installed console script of this checkout stands in (or /bin/true when not installed).
    """
    stand_in = Path(sys.executable).with_name("ttft-monitor")
    binary = str(stand_in) if os.access(stand_in, os.X_OK) else "/bin/true"
    assert INSTALLED_BINARY in text
    path = directory / UNIT.name
    path.write_text(text.replace(INSTALLED_BINARY, binary))
    return path


def verify(systemd_analyze: str, unit: Path) -> list[str]:
    """Problems `systemd-analyze verify` reports about `unit`. It exits 0 on unknown keys, so read its output."""
    done = subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )
    problems = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line or str(unit) in line]
    if done.returncode != 0:
        problems.append(f"exit {done.returncode}: {done.stderr.strip()}")
    return problems


@pytest.mark.timeout(900)  # the first use may install the systemd package
def test_systemd_analyze_verify_accepts_the_unit(systemd_analyze: str, tmp_path: Path) -> None:
    assert verify(systemd_analyze, runnable_copy(UNIT.read_text(), tmp_path)) == []


@pytest.mark.timeout(900)
def test_the_credential_example_verifies_once_uncommented(systemd_analyze: str, tmp_path: Path) -> None:
    text = "\n".join(
        line[1:] if line.startswith(("#LoadCredential=", "#Environment=")) else line
        for line in UNIT.read_text().splitlines()
    )
    assert "\nLoadCredential=" in text
    assert verify(systemd_analyze, runnable_copy(text, tmp_path)) == []


@pytest.mark.timeout(900)
def test_the_verify_check_catches_a_misspelt_key(systemd_analyze: str, tmp_path: Path) -> None:
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict")
    problems = verify(systemd_analyze, runnable_copy(broken, tmp_path))
    assert any("ProtectSystm" in problem for problem in problems), problems


def test_the_deploy_guide_installs_where_the_unit_looks() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text()
    assert "python3 -m venv " + str(Path(INSTALLED_BINARY).parents[1]) in guide
    assert f"install -D -m 0644 config.yaml {CONFIG_PATH}" in guide
    assert f"install -m 0644 systemd/{UNIT.name} /etc/systemd/system/" in guide
    assert "systemctl enable --now ttft-monitor" in guide
    for line in UNIT.read_text().splitlines():
        if line.startswith("#LoadCredential="):
            name, path = line.removeprefix("#LoadCredential=").split(":", 1)
            if name == "openai":
                assert f"LoadCredential={name}:{path}" in guide
