"""Checks that names used in one section are defined in another.

Works on plain parsed data rather than models so the loader can report broken references even when
other parts of the file fail validation; anything of the wrong shape is skipped here because the
schema validation reports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Loc = tuple[str | int, ...]


def reference_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """Every (key path, message) for a reference to an undefined name, or a job name used twice."""
    providers = _keys(data.get("providers"))
    targets = _keys(data.get("targets"))
    prompts = _keys(data.get("prompts"))
    alerts: Mapping[str, Any] = data["alerts"] if isinstance(data.get("alerts"), Mapping) else {}
    receivers = _keys(alerts.get("receivers"))
    problems: list[tuple[Loc, str]] = []

    target_items = data.get("targets")
    if isinstance(target_items, Mapping):
        for name, target in target_items.items():
            if isinstance(target, Mapping) and isinstance(target.get("provider"), str):
                problems += _unknown(
                    ("targets", name, "provider"), target["provider"], providers, "provider", "providers:"
                )

    job_names: dict[str, int] = {}
    for index, job in _items(data.get("jobs")):
        name = job.get("name")
        if isinstance(name, str):
            if name in job_names:
                problems.append(
                    (
                        ("jobs", index, "name"),
                        f"job name '{name}' is already used by jobs[{job_names[name]}]; job names must be unique",
                    )
                )
            else:
                job_names[name] = index
        problems += _unknown(("jobs", index, "targets"), job.get("targets"), targets, "target", "targets:")
        problems += _unknown(("jobs", index, "prompts"), job.get("prompts"), prompts, "prompt", "prompts:")

    for index, route in _items(alerts.get("routes")):
        problems += _unknown(
            ("alerts", "routes", index, "receivers"),
            route.get("receivers"),
            receivers,
            "receiver",
            "alerts.receivers:",
        )
        problems += _unknown(("alerts", "routes", index, "jobs"), route.get("jobs"), set(job_names), "job", "jobs:")
    for index, silence in _items(alerts.get("silences")):
        problems += _unknown(
            ("alerts", "silences", index, "targets"), silence.get("targets"), targets, "target", "targets:"
        )
    return problems


def unknown_name_message(kind: str, name: str, known: Iterable[str], section: str) -> str:
    """`unknown target 'x' (known: a, b); fix the name or define it under targets:`."""
    names = sorted(known)
    listing = f"known: {', '.join(names)}" if names else f"no {kind}s are defined"
    return f"unknown {kind} '{name}' ({listing}); fix the name or define it under {section}"


def _unknown(loc: Loc, used: Any, known: set[str], kind: str, section: str) -> list[tuple[Loc, str]]:
    if isinstance(used, str):
        return [] if used in known else [(loc, unknown_name_message(kind, used, known, section))]
    if not isinstance(used, list):
        return []
    return [
        ((*loc, position), unknown_name_message(kind, name, known, section))
        for position, name in enumerate(used)
        if isinstance(name, str) and name not in known
    ]


def _keys(section: Any) -> set[str]:
    return {str(key) for key in section} if isinstance(section, Mapping) else set()


def _items(section: Any) -> list[tuple[int, Mapping[str, Any]]]:
    if not isinstance(section, list):
        return []
    return [(index, item) for index, item in enumerate(section) if isinstance(item, Mapping)]
