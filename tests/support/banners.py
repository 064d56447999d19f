"""Lines for the end of the run's summary (a peer's figures, why its tests were skipped), from
whichever process ran the test.

In a parallel run the summary is written by pytest-xdist's controller, which runs no test: a list
kept in a worker would never be printed. Workers append their lines to a file in the run's folder
(tests/support/parallel.py's `run_folder`), and the controller prints what every worker wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import parallel

_LOCAL: list[dict[str, Any]] = []  # a serial run's lines


def add(title: str, line: str, *, alarm: bool = True) -> None:
    """One line under `title` (red and loud when `alarm`) in the run's summary."""
    entry = {"title": title, "line": line, "alarm": alarm}
    folder = parallel.run_folder()
    if folder is not None and parallel.in_worker():
        with open(folder / "banners.jsonl", "a", encoding="utf-8") as lines:
            lines.write(json.dumps(entry) + "\n")  # one write per line: appends from workers never interleave
    else:
        _LOCAL.append(entry)


def _written(folder: Path | None) -> list[dict[str, Any]]:
    path = None if folder is None else folder / "banners.jsonl"
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def write(terminalreporter: Any) -> None:
    """Every title once, with its lines in the order they came, each line once."""
    sections: dict[str, Section] = {}
    for entry in [*_LOCAL, *_written(parallel.run_folder())]:
        section = sections.setdefault(entry["title"], Section(entry["alarm"], []))
        if entry["line"] not in section.lines:
            section.lines.append(entry["line"])
    for title, section in sections.items():
        if section.alarm:
            terminalreporter.write_sep("!", title, red=True, bold=True)
        else:
            terminalreporter.write_sep("=", title)
        for line in section.lines:
            terminalreporter.write_line(line, red=section.alarm, bold=section.alarm)


@dataclass
class Section:
    alarm: bool
    lines: list[str]


class SummaryLines:
    """A list-like sink for one title's lines: `append` puts a line in the summary."""

    def __init__(self, title: str, *, alarm: bool = False) -> None:
        self.title, self.alarm, self._seen = title, alarm, list[str]()

    def append(self, line: str) -> None:
        self._seen.append(line)
        add(self.title, line, alarm=self.alarm)

    def __getitem__(self, index: int) -> str:
        return self._seen[index]
