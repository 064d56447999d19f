"""`${VAR}` / `${VAR:-default}` / `$$` expansion over parsed YAML, so each problem knows its key path."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Loc = tuple[str | int, ...]

# One alternation, scanned left to right, so `$$` is consumed before it could start a reference.
_TOKEN = re.compile(r"\$\$|\$\{(?P<body>[^}]*)\}|\$\{")
_REFERENCE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>.*))?$", re.DOTALL)


@dataclass
class Expansion:
    value: Any
    problems: list[tuple[Loc, str]] = field(default_factory=list)
    # Key paths whose value came (partly) from the environment; such values may be secrets.
    substituted: set[Loc] = field(default_factory=set)
    # The environment values put in at each such path, so they can be masked wherever they show up.
    inserted: dict[Loc, list[str]] = field(default_factory=dict)


def expand_env(data: Any, environ: Mapping[str, str]) -> Expansion:
    """`data` with references in every string value replaced, the problems found, and where values changed.

    Keys are left alone. A string with a problem is kept unexpanded so validation can still run; the
    caller should ignore validation errors under the paths reported as problems.
    """
    result = Expansion(value=None)
    result.value = _expand(data, environ, (), result)
    return result


def _expand(data: Any, environ: Mapping[str, str], loc: Loc, result: Expansion) -> Any:
    if isinstance(data, str):
        inserted: list[str] = []
        try:
            expanded = expand_string(data, environ, inserted=inserted)
        except ValueError as exc:
            result.problems.append((loc, str(exc)))
            return data
        if "${" in data:
            result.substituted.add(loc)
        if inserted:
            result.inserted[loc] = inserted
        return expanded
    if isinstance(data, Mapping):
        return {key: _expand(value, environ, (*loc, key), result) for key, value in data.items()}
    if isinstance(data, list):
        return [_expand(value, environ, (*loc, index), result) for index, value in enumerate(data)]
    return data


def expand_string(text: str, environ: Mapping[str, str], *, inserted: list[str] | None = None) -> str:
    """Expand one string. Like the shell, `:-default` is used when the variable is unset *or* empty.

    Values taken from the environment (not defaults written in the file) are appended to `inserted`.
    """
    problems: list[str] = []

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$$":
            return "$"
        body = match.group("body")
        reference = _REFERENCE.match(body) if body is not None else None
        if reference is None or "${" in (reference["default"] or ""):
            problems.append(
                f"'{token if body is not None else text}' is not a valid reference; write ${{NAME}} or "
                "${NAME:-default} (nesting is not supported), or $$ for a literal $"
            )
            return token
        name, default = reference["name"], reference["default"]
        value = environ.get(name)
        if value and inserted is not None:
            inserted.append(value)
        if default is not None:
            return value if value else default
        if value is None:
            problems.append(f"environment variable {name} is not set; export it or write ${{{name}:-default}}")
            return token
        return value

    expanded = _TOKEN.sub(replace, text)
    if problems:
        raise ValueError("; ".join(dict.fromkeys(problems)))
    return expanded
