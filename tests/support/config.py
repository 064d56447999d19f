"""One builder for the test configs: a provider, its targets and prompts, and whatever sections a test adds.

    write_yaml(tmp_path / "config.yaml", build_config(sim.v1, database_url=url, detection={"min_history_runs": 6}))

The result is a plain dict, so a test can change any part of it before writing; YAML is written with
yaml.safe_dump, so no value needs quoting by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


def build_config(
    base_url: str,
    *,
    provider: str = "sim",
    api: str = "openai-chat",
    provider_settings: Mapping[str, Any] | None = None,
    targets: Mapping[str, str | Mapping[str, Any]] | None = None,
    prompts: Mapping[str, int] | None = None,
    database_url: str | None = None,
    state_dir: Path | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A config probing `base_url` (the API root, e.g. the simulator's `.../v1`) through one provider.

    `targets` maps a target's name to its model, or to its settings (the provider is filled in);
    `prompts` maps a prompt's name to its size in tokens. `sections` are top-level sections as they
    are (`location`, `jobs`, `detection`, `alerts`, ...)."""
    data: dict[str, Any] = {}
    if database_url is not None or state_dir is not None:
        data["database"] = {"url": database_url} if database_url is not None else {}
        if state_dir is not None:
            data["database"]["state_dir"] = str(state_dir)
    data["providers"] = {provider: {"base_url": base_url, "api": api, **(provider_settings or {})}}
    data["targets"] = {
        name: {"provider": provider, **({"model": target} if isinstance(target, str) else target)}
        for name, target in (targets or {"fast": "gpt-4o-mini"}).items()
    }
    data["prompts"] = {name: {"tokens": tokens} for name, tokens in (prompts or {"short": 128}).items()}
    return data | sections


def write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False), encoding="utf-8")
    return path
