"""The one error the config package raises, carrying every problem found, each with its key path."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem: which file, where in it (`jobs[1].targets[0]`), and what to do about it.

    `line`/`column` are set only for problems found while parsing YAML, where no key path exists yet.
    """

    file: str
    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is not None:
            where = f"{self.file}:{self.line}:{self.column}" if self.column is not None else f"{self.file}:{self.line}"
            return f"{where}: {self.message}"
        if self.path:
            return f"{self.file}: {self.path}: {self.message}"
        return f"{self.file}: {self.message}"


class ConfigError(Exception):
    """The config cannot be used. `str()` is one line per issue, ready to print."""

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.errors: list[ConfigIssue] = list(issues)
        super().__init__("\n".join(str(issue) for issue in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.errors)
