"""Installing a real peer from Debian's packages when it is missing (the tests run as root on CI)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# One apt-get at a time across every process of every run: dpkg refuses a second one ("Could not get
# lock /var/lib/dpkg/lock-frontend"), and parallel workers may want two peers at once.
LOCK = Path(tempfile.gettempdir()) / "ttft-tests-apt.lock"


def install(package: str, binary: Path | str) -> str | None:
    """Install `package` with apt-get unless `binary` (a path, or a command's name) exists; None once it
    does, else the reason it could not be installed."""

    def present() -> bool:
        return Path(binary).exists() if os.sep in str(binary) else shutil.which(str(binary)) is not None

    if present():
        return None
    if shutil.which("apt-get") is None:
        return "apt-get is not available (not a Debian-like system)"
    if os.geteuid() != 0:
        return f"not root, so apt-get cannot install it (run `apt-get install -y {package}`)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    with open(LOCK, "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if present():  # another worker installed it while this one waited
            return None
        done = None
        try:
            for attempt in range(2):
                if attempt:  # maybe stale package lists
                    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300, check=False)
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
                if done.returncode == 0 and present():
                    return None
        except subprocess.TimeoutExpired:
            return f"apt-get install {package} timed out"
    return f"apt-get install {package} failed: {done.stderr.strip()[-300:] if done else ''}"
