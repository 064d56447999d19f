"""The real command line's parser, for tests that check a unit file or manifest names commands and options it has."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from monitor.cli import build_parser
from monitor.config.models import Config


def registered_commands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """`argv` (without the program name) parsed by the real CLI; a command the CLI lacks fails the test."""
    missing = [word for word in argv[:1] if word not in registered_commands()]
    assert not missing, f"`ttft-monitor {missing[0]}` is not registered in monitor.cli.build_parser()"
    if argv[:1] == ["db"]:
        db = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["db"]
        subs = [a for a in db._actions if isinstance(a, argparse._SubParsersAction)]
        if len(argv) > 1:
            assert subs and argv[1] in subs[0].choices, (
                f"`ttft-monitor db {argv[1]}` is not registered in monitor.cli.build_parser()"
            )
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exit_:
        raise AssertionError(f"the CLI rejects {shlex.join(argv)!r} (exit {exit_.code})") from None


def shutdown_grace_default() -> float:
    """The default of the config's `shutdown_grace_s`, wherever in the model it lives."""

    def find(model: Any) -> float | None:
        for name, field in model.model_fields.items():
            if name == "shutdown_grace_s":
                return float(field.default)
            nested = field.annotation
            if isinstance(nested, type) and hasattr(nested, "model_fields"):
                found = find(nested)
                if found is not None:
                    return found
        return None

    grace = find(Config)
    assert grace is not None, "the config has no `shutdown_grace_s` key (monitor/config/models.py)"
    return grace
