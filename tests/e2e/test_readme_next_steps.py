"""The README's "Next steps" followed as written, against the simulator started as a separate process.

Each command of the section runs in bash in a directory laid out like the checkout (config.yaml,
.venv); the YAML snippet goes into the copied config as the step says (a provider, a target, the
job's targets), and the example endpoint, model and key are the simulator's. The steps must reach a
daemon that probes the endpoint with the key and serves its overview to the documented token.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, start_sim, stop_sim
from tests.support.ports import free_port

README = (ROOT / "README.md").read_text()
KEY = "sk-next-steps-0123456789"  # what the simulator requires and the user exports


def next_steps() -> str:
    start = README.index("## Next steps")
    return README[start : README.index("\n## ", start + 1)]


def blocks(section: str, language: str) -> list[str]:
    return [textwrap.dedent(b).strip() for b in re.findall(rf"```{language}\n(.*?)\n\s*```", section, flags=re.S)]


def dedent(block: str) -> str:
    return "\n".join(line.strip() for line in block.splitlines())


def merge(config: dict[str, Any], snippet: dict[str, Any]) -> None:
    """What step 3 asks: add the provider and the target, make them the named job's targets."""
    config["providers"].update(snippet["providers"])
    config["targets"].update(snippet["targets"])
    for job in snippet["jobs"]:
        (existing,) = [j for j in config["jobs"] if j["name"] == job["name"]]
        existing["targets"] = job["targets"]


def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:  # not listening yet
        return 0, ""


@pytest.mark.realtime
@pytest.mark.timeout(200)
def test_the_readme_next_steps_reach_a_daemon_probing_the_endpoint_and_its_ui(tmp_path: Path) -> None:
    section = next_steps()
    sh = [dedent(b) for b in blocks(section, "sh")]
    (snippet_text,) = blocks(section, "yaml")
    activate, copy, export_key, check, upgrade, run = sh
    assert activate == ". .venv/bin/activate" and copy.startswith("cp config.yaml ")
    assert "ttft-monitor check-config" in check and "ttft-monitor db upgrade" in upgrade
    assert run.startswith("ttft-monitor run")
    (token_export,) = re.findall(r"`(export TTFT_WEB_TOKEN=[^`]+)`", section)
    config_name = copy.split()[-1]

    # A directory laid out like the checkout: its config.yaml, and the venv the Quick start made.
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TTFT_")},
        "TTFT_METRICS_LISTEN": f"127.0.0.1:{port}",  # the README's way to move it off 9464
        "PYTHONPATH": str(ROOT),  # this tree's code, whichever checkout the venv was installed from
        "MY_LLM_KEY": KEY,
        "PYTHONUNBUFFERED": "1",  # the log file is read while the daemon runs
    }

    def bash(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-ec", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=90
        )

    done = bash(f"{activate}\n{copy}")
    assert done.returncode == 0, done.stdout + done.stderr
    sim = start_sim("--api-key-env", "MY_LLM_KEY", env=env)
    daemon: subprocess.Popen[str] | None = None
    stack = contextlib.ExitStack()
    try:
        snippet = snippet_text.replace("https://llm.example.com/v1", sim.v1).replace("my-model-name", "qwen3-8b")
        config = yaml.safe_load((checkout / config_name).read_text())
        merge(config, yaml.safe_load(snippet))
        # The shipped job runs every minute; the config's own comment gives the quick-demo form with
        # seconds, which puts the first run within 15 s (plus the jitter), not up to a minute away.
        for job in config["jobs"]:
            assert job["schedule"] == "* * * * *", job
            job["schedule"] = "*/15 * * * * *"
        (checkout / config_name).write_text(yaml.safe_dump(config, sort_keys=False))

        key_line = export_key.replace("MY_LLM_KEY=...", f"MY_LLM_KEY={KEY}")
        env.pop("MY_LLM_KEY")  # only the step's export provides it
        done = bash(f"{activate}\n{key_line}\n{check}\n{upgrade}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "my-model" in done.stdout, done.stdout

        log = tmp_path / "daemon.log"
        log_file = stack.enter_context(log.open("w"))
        daemon = subprocess.Popen(
            ["bash", "-ec", f'{activate}\n{key_line}\n{token_export}\necho "$TTFT_WEB_TOKEN" > token\nexec {run}'],
            cwd=checkout,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        token = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            token = (checkout / "token").read_text().strip() if (checkout / "token").exists() else ""
            if token and get(f"{base}/readyz")[0] == 200:
                break
            assert daemon.poll() is None, log.read_text()
            time.sleep(0.5)
        else:
            pytest.fail(f"the daemon was not ready within 60 s:\n{log.read_text()}")

        assert get(f"{base}/")[0] == 401  # the token is required once set, as documented
        status, page = get(f"{base}/", token)
        assert status == 200, page
        # The job runs every 15 s (jitter up to 5 s): its first sample reached the endpoint with the key.
        deadline = time.monotonic() + 75
        while time.monotonic() < deadline and '"probe_sample"' not in log.read_text():
            time.sleep(1)
        samples = [json.loads(line) for line in log.read_text().splitlines() if '"probe_sample"' in line]
        assert samples, log.read_text()
        assert {(s["target"], s.get("error")) for s in samples} == {("my-model", None)}, samples
        # And the run is stored: the API lists the series once the job's rounds are done.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and '"my-model"' not in (body := get(f"{base}/api/v1/series", token)[1]):
            time.sleep(1)
        assert '"my-model"' in body, body
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=40)
        stack.close()
        stop_sim(sim)
    text = (tmp_path / "daemon.log").read_text()
    assert daemon.returncode == 0, text  # SIGTERM: a clean stop
    assert "Traceback" not in text
