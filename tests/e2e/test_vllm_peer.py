"""Where vLLM cannot be installed, its tests are skipped loudly, never silently (tests/support/vllm_peer.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.vllm_peer import ENV_VARIABLE, MODEL_BUILDER, builder_command, engine_cpus

# tests/e2e/test_vllm.py's tests, counted by hand: what is skipped or deselected there, all of them.
VLLM_TESTS = 12


def run_vllm_tests(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_vllm.py", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, ENV_VARIABLE: str(env_dir)},
        timeout=120,
    )


def test_an_impossible_install_skips_every_vllm_test_and_the_summary_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # In two workers: the skips happen there, and the summary that says why is written by the controller.
    done = run_vllm_tests(blocker / "vllm-env", "-n", "2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert re.search(rf"\b{VLLM_TESTS} skipped\b", output) and " passed" not in output, output
    assert "VLLM TESTS SKIPPED" in output, output
    assert f"vLLM cannot be installed here: cannot write {blocker / 'vllm-env'}" in output, output
    assert f"point {ENV_VARIABLE} at a writable directory" in output, output


def test_nothing_is_installed_when_no_vllm_test_is_selected(tmp_path: Path) -> None:
    env_dir = tmp_path / "vllm-env"
    done = run_vllm_tests(env_dir, "-m", "not vllm", "-n", "0")  # in workers, deselection is not reported
    output = done.stdout + done.stderr
    assert re.search(rf"\b{VLLM_TESTS} deselected\b", output), output
    assert "VLLM TESTS SKIPPED" not in output, output
    assert not tmp_path.joinpath("vllm-env.lock").exists() and not env_dir.exists()


def test_the_server_gets_the_lowest_core_and_leaves_the_rest_or_shares_a_lone_core() -> None:
    assert engine_cpus({0, 1}) == {0}
    assert engine_cpus({2, 5, 7}) == {2}
    assert engine_cpus({3}) == {3}
    assert engine_cpus({0, 1, 2, 3}, "all") == {0, 1, 2, 3}
    assert engine_cpus({0, 1, 2, 3}, "1-2") == {1, 2}
    assert engine_cpus({0, 1, 2, 3}, "0,3") == {0, 3}
    with pytest.raises(ValueError, match="cores \\[7\\] are not available here"):
        engine_cpus({0, 1}, "1,7")


def test_the_tiny_model_builder_imports_the_standard_library_not_its_neighbours(tmp_path: Path) -> None:
    # The builder is a script in tests/support/, beside modules named as the standard library's; run as
    # the peer runs it, a neighbour of the script never stands in for a standard module.
    assert (MODEL_BUILDER.parent / "secrets.py").exists()  # the neighbour that broke the build
    (tmp_path / "secrets.py").write_text("raise ImportError('the neighbour, not the standard library')\n")
    script = tmp_path / "builder.py"
    script.write_text("import secrets, sys\nprint(secrets.__file__)\nopen(sys.argv[1], 'w').close()\n")
    done = subprocess.run(
        builder_command(Path(sys.executable), script, tmp_path / "out"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent != tmp_path and (tmp_path / "out").exists(), done.stdout
