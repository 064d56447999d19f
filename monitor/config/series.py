"""Which series a job's prompts make: a `cache: both` prompt is measured as two, its busted self and its
warm twin. Pure code over the config's prompt profiles (monitor/probe/settings.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

if TYPE_CHECKING:  # models.py imports this module
    from monitor.config.models import Config


class _Profile(Protocol):
    """What is read of a prompt profile (monitor/probe/settings.py's PromptProfile, above this layer)."""

    @property
    def cache(self) -> str: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self: ...


PromptProfile = TypeVar("PromptProfile", bound=_Profile)

# A prompt with `cache: both` is measured as two series: its own name (busted) and this suffix (warm).
WARM_TWIN_SUFFIX = ".warm"


def warm_twin(name: str) -> str:
    return name + WARM_TWIN_SUFFIX


def series_prompts(prompts: Mapping[str, PromptProfile], names: Iterable[str]) -> list[tuple[str, PromptProfile]]:
    """The prompts a job measures, one per series, in its order: a `cache: both` prompt is two, its busted
    self and its warm twin (`NAME.warm`) right after it. Names not in `prompts` are left out."""
    out: list[tuple[str, PromptProfile]] = []
    for name in names:
        profile = prompts.get(name)
        if profile is None:
            continue
        if profile.cache != "both":
            out.append((name, profile))
            continue
        out.append((name, profile.model_copy(update={"cache": "bust"})))
        out.append((warm_twin(name), profile.model_copy(update={"cache": "warm"})))
    return out


def cache_pairs(prompts: Mapping[str, _Profile]) -> dict[str, str]:
    """The warm twin of every `cache: both` prompt, and its busted prompt: `{"long.warm": "long"}`."""
    return {warm_twin(name): name for name, profile in prompts.items() if profile.cache == "both"}


def job_series(config: Config, job_names: Iterable[str]) -> dict[str, set[tuple[str, str]]]:
    """Each named job's (target, prompt) pairs, from its plan in the config (a `cache: both` prompt's warm
    twin included)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for name in job_names:
        job = config.job(name)
        prompts = [prompt for prompt, _profile in series_prompts(config.prompts, job.prompts)]
        out[name] = {(target, prompt) for target in job.targets for prompt in prompts}
    return out
