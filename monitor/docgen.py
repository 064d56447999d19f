"""The `--write PATH` / `--check PATH` command shared by every generated reference in docs/."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def regenerate(argv: list[str] | None, *, prog: str, description: str, update: Callable[[str], str]) -> int:
    """Rewrite the generated part of PATH with `update(document)` (--write), or exit 1 if it is stale (--check)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", type=Path, metavar="PATH", help="regenerate the reference in PATH")
    action.add_argument("--check", type=Path, metavar="PATH", help="exit 1 if the reference in PATH is stale")
    args = parser.parse_args(argv)
    path: Path = args.write or args.check
    document = path.read_text(encoding="utf-8")
    updated = update(document)
    if args.check:
        if updated != document:
            print(f"{path} is out of date; run: python -m {prog.removeprefix('python -m ')} --write {path}")
            return 1
        return 0
    path.write_text(updated, encoding="utf-8")
    return 0
