"""Model profiles: how fast each simulated model starts and streams, and how it misbehaves.

Profiles are plain dataclasses so the hot path reads attributes, never validates. Updates
from the control endpoint go through `apply_patch`, which validates once and names the
broken field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ERROR_STATUSES = (401, 404, 429, 500, 503)


class ProfileError(ValueError):
    """A control request asked for a profile change that is not allowed; the message names the field."""


@dataclass(slots=True)
class Faults:
    """Misbehaviour on demand. "after N tokens" faults fire after the last token when N exceeds the output."""

    error_rate: float = 0.0
    error_status: int = 500
    hang_before_first_token: bool = False
    cut_after_tokens: int | None = None
    malformed_after_tokens: int | None = None
    error_event_after_tokens: int | None = None
    drip_gap_ms: float | None = None


@dataclass(slots=True)
class ModelProfile:
    """TTFT = (ttft_base_ms + prefill_ms_per_1k * (uncached + cached_prefill_factor * cached) / 1000)
    * lognormal(0, noise_sigma); then one token every 1/decode_tps seconds. With `ar_share`, that share
    of the noise's variance is autocorrelated in time (AR(1)) instead of independent per request."""

    name: str
    ttft_base_ms: float
    prefill_ms_per_1k: float
    noise_sigma: float
    decode_tps: float
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning_content"
    # Whether the chat and completions usage carries completion_tokens_details.reasoning_tokens (OpenAI
    # does, vLLM does not); Responses and Gemini always count reasoning, Anthropic never separately.
    reports_reasoning_tokens: bool = False
    cached_prefill_factor: float = 0.0
    # False: the model's prefix cache is off (vLLM's --no-enable-prefix-caching, a provider's cache
    # broken): nothing is served from it or kept in it, and usage reports no cached tokens.
    prefix_cache: bool = True
    faults: Faults = field(default_factory=Faults)
    # Whether the model thinks when the request does not say: Qwen3 does (it must be turned
    # off with chat_template_kwargs.enable_thinking=false), Anthropic models do not.
    thinks_by_default: bool = True
    # Answer length before a natural stop ("stop" / "end_turn") when max_tokens allows it.
    answer_tokens: int = 48
    # Some gateways send `: ping` SSE comments every 100 ms while the model prefills.
    comment_pings: bool = False
    # Some OpenAI-compatible servers reject `stream_options` with a 400.
    reject_stream_options: bool = False
    # Load that comes and goes: `ar_share` of noise_sigma's variance is an AR(1) process shared by
    # every request, with correlation `ar_phi` per `ar_step_s` seconds of wall-clock time (0: none).
    ar_share: float = 0.0
    ar_phi: float = 0.9
    ar_step_s: float = 300.0
    # What the server says it is: `served_as` is the model name it reports (an alias moved to other
    # weights), None: the requested one; `system_fingerprint` rides on every OpenAI chat and
    # completions chunk (OpenAI's backend configuration), None: left out, as vLLM does.
    served_as: str | None = None
    system_fingerprint: str | None = None
    # What it answers (None: the canned text), the same every time unless `answer_varies`.
    answer_text: str | None = None
    answer_varies: bool = False


def default_profiles() -> dict[str, ModelProfile]:
    # Shapes follow public figures: ~300 ms (Qwen3-8B) and ~400 ms (Qwen3-14B) at 2k prompt tokens.
    # One row a model, a table to compare by eye: name, ttft_base_ms, prefill_ms_per_1k, noise_sigma,
    # decode_tps, then only what differs from ModelProfile's defaults.
    profiles = (
        ModelProfile("qwen3-8b", 120.0, 90.0, 0.15, 90.0, reasoning_tokens=40),
        ModelProfile("qwen3-14b", 150.0, 125.0, 0.15, 60.0, reasoning_tokens=40),
        ModelProfile("gpt-4o-mini", 250.0, 20.0, 0.2, 80.0),
        ModelProfile("claude-haiku-sim", 300.0, 30.0, 0.2, 70.0, reasoning_tokens=30, thinks_by_default=False),
        ModelProfile("gemini-flash-sim", 250.0, 20.0, 0.2, 120.0),
    )
    return {profile.name: profile for profile in profiles}


def new_profile(name: str) -> ModelProfile:
    """The starting point for a model created through the control endpoint."""
    return ModelProfile(name=name, ttft_base_ms=200.0, prefill_ms_per_1k=50.0, noise_sigma=0.15, decode_tps=50.0)


def without_noise(profile: ModelProfile) -> ModelProfile:
    return dataclasses.replace(profile, noise_sigma=0.0)


def profile_to_dict(profile: ModelProfile) -> dict[str, Any]:
    return dataclasses.asdict(profile)


def copy_profile(profile: ModelProfile) -> ModelProfile:
    return dataclasses.replace(profile, faults=dataclasses.replace(profile.faults))


# --- validation of partial updates ------------------------------------------------------

Rule = Callable[[str, Any], Any]


def _number(*, minimum: float = 0.0, maximum: float | None = None, exclusive_min: bool = False) -> Rule:
    def check(path: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProfileError(f"{path}: expected a number, got {value!r}")
        too_low = value <= minimum if exclusive_min else value < minimum
        if too_low or (maximum is not None and value > maximum):
            low = f"> {minimum:g}" if exclusive_min else f">= {minimum:g}"
            bounds = low if maximum is None else f"{low} and <= {maximum:g}"
            raise ProfileError(f"{path}: {value!r} is out of range (expected {bounds})")
        return float(value)

    return check


def _integer(*, minimum: int = 0) -> Rule:
    def check(path: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"{path}: expected an integer, got {value!r}")
        if value < minimum:
            raise ProfileError(f"{path}: {value!r} is out of range (expected >= {minimum})")
        return value

    return check


def _optional(rule: Rule) -> Rule:
    def check(path: str, value: Any) -> Any:
        return None if value is None else rule(path, value)

    return check


def _text(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ProfileError(f"{path}: expected a string of 1 to 200 characters, got {value!r}")
    return value


def _boolean(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{path}: expected true or false, got {value!r}")
    return value


def _choice(*choices: Any) -> Rule:
    def check(path: str, value: Any) -> Any:
        if isinstance(value, bool) or value not in choices:
            raise ProfileError(f"{path}: {value!r} is not one of {', '.join(map(str, choices))}")
        return value

    return check


_FAULT_RULES: dict[str, Rule] = {
    "error_rate": _number(maximum=1.0),
    "error_status": _choice(*ERROR_STATUSES),
    "hang_before_first_token": _boolean,
    "cut_after_tokens": _optional(_integer()),
    "malformed_after_tokens": _optional(_integer()),
    "error_event_after_tokens": _optional(_integer()),
    "drip_gap_ms": _optional(_number()),
}

_PROFILE_RULES: dict[str, Rule] = {
    "ttft_base_ms": _number(),
    "prefill_ms_per_1k": _number(),
    "noise_sigma": _number(maximum=3.0),
    "decode_tps": _number(exclusive_min=True),
    "reasoning_tokens": _integer(),
    "reasoning_field": _choice("reasoning_content", "reasoning"),
    "reports_reasoning_tokens": _boolean,
    "cached_prefill_factor": _number(),
    "prefix_cache": _boolean,
    "thinks_by_default": _boolean,
    "answer_tokens": _integer(minimum=1),
    "comment_pings": _boolean,
    "reject_stream_options": _boolean,
    "ar_share": _number(maximum=1.0),
    "ar_phi": _number(maximum=0.999),
    "ar_step_s": _number(exclusive_min=True),
    "served_as": _optional(_text),
    "system_fingerprint": _optional(_text),
    "answer_text": _optional(_text),
    "answer_varies": _boolean,
}


def _checked(rules: Mapping[str, Rule], patch: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    unknown = sorted(set(patch) - set(rules))
    if unknown:
        raise ProfileError(f"{prefix}{unknown[0]}: unknown field (known: {', '.join(sorted(rules))})")
    return {key: rules[key](f"{prefix}{key}", value) for key, value in patch.items()}


def apply_patch(profile: ModelProfile, patch: Any) -> ModelProfile:
    """A copy of `profile` with the fields in `patch` changed; `faults` may be partial, or null to clear.

    Raises ProfileError naming the first bad field; `profile` is never modified.
    """
    if not isinstance(patch, Mapping):
        raise ProfileError(f"expected a JSON object, got {type(patch).__name__}")
    patch = dict(patch)
    name = patch.pop("name", profile.name)
    if name != profile.name:
        raise ProfileError(f"name: {name!r} does not match the model in the URL ({profile.name!r})")
    faults = profile.faults
    if "faults" in patch:
        fault_patch = patch.pop("faults")
        if fault_patch is None:
            faults = Faults()
        elif isinstance(fault_patch, Mapping):
            faults = dataclasses.replace(faults, **_checked(_FAULT_RULES, fault_patch, "faults."))
        else:
            raise ProfileError(f"faults: expected an object or null, got {fault_patch!r}")
    changes = _checked(_PROFILE_RULES, patch, "")
    return dataclasses.replace(profile, faults=dataclasses.replace(faults), **changes)
