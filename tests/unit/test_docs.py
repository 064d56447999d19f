"""The documentation keeps up with the code: commands, options and the two set-up commands."""

from __future__ import annotations

import argparse
import re

from monitor.cli import build_parser
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_is_documented_in_the_readme() -> None:
    missing = [name for name in subcommands() if f"ttft-monitor {name}" not in README]
    assert missing == []


def test_every_probe_option_is_documented_in_the_readme() -> None:
    probe = subcommands()["probe"]
    options = {s for a in probe._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    options -= {"--config", "--timeout-first-token", "--timeout-total"}  # shared / described under Configuration
    missing = sorted(o for o in options if o not in README)
    assert missing == []


def test_ci_runs_the_readme_test_command_unchanged() -> None:
    blocks = re.findall(r"```sh\n(.*?)\n```", README, flags=re.S)
    test_command = next(b for b in blocks if "pytest" in b)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command.strip() in ci.splitlines()


def test_every_action_of_a_command_is_documented() -> None:
    docs = README + "".join(path.read_text() for path in sorted((ROOT / "docs").glob("*.md")))
    missing = []
    for name, parser in subcommands().items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"ttft-monitor {name} {sub}" for sub in action.choices]
    assert [command for command in missing if command not in docs] == []
