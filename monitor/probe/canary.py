"""The canary: a fixed short request after a run's probes, whose answer's hash says which weights answered.

A provider can swap the weights behind a model id without a word (no fingerprint, the same `model`).
The same prompt at temperature 0 (and a seed where the API takes one) gets the same answer from the
same model; the hash of the answer (normalised: whitespace collapsed, case kept) is stored per run
and the detector counts a change once it repeats (detect/identity.py). It is not a measurement: its
timings are not stored, it runs after the run's probes, so it never queues ahead of one.

While the canary's request streams, the probe's event reader keeps each answer event's data
(`current_answer`, set only here); `answer_text` takes the text out per API, off the probe's path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from monitor.probe.body import current_answer
from monitor.probe.client import ProbeClient
from monitor.probe.result import Sample
from monitor.probe.runner import ProbeTarget

# APIs whose request takes a `seed` (OpenAI chat and completions, vLLM and SGLang behind them).
SEEDED_APIS = frozenset({"openai-chat", "openai-completions"})
HASH_CHARS = 16


@dataclass(frozen=True, slots=True)
class CanaryAnswer:
    target: str
    digest: str | None  # None: the request failed or the answer was empty
    error: str | None = None


def _event_text(api: str, data: str) -> str:
    try:
        obj: Any = json.loads(data)
    except ValueError:
        return ""
    if not isinstance(obj, dict):
        return ""
    if api == "openai-chat":
        choice = (obj.get("choices") or [{}])[0]
        return str((choice.get("delta") or {}).get("content") or "")
    if api == "openai-completions":
        return str((obj.get("choices") or [{}])[0].get("text") or "")
    if api == "anthropic-messages":
        return str((obj.get("delta") or {}).get("text") or "")
    if api == "openai-responses":
        return str(obj.get("delta") or "")
    if api == "gemini":
        parts = (((obj.get("candidates") or [{}])[0].get("content")) or {}).get("parts") or []
        return "".join(str(p.get("text") or "") for p in parts if isinstance(p, dict) and not p.get("thought"))
    return ""


def answer_text(api: str, events: Sequence[str]) -> str:
    """The visible answer in a canary's answer events (reasoning and tool calls left out)."""
    try:
        return "".join(_event_text(api, data) for data in events)
    except (AttributeError, IndexError, TypeError):  # a shape the API did not promise: no answer to compare
        return ""


def answer_digest(text: str) -> str | None:
    """The answer's hash, whitespace collapsed; None for an empty answer."""
    normal = " ".join(text.split())
    if not normal:
        return None
    return hashlib.sha256(normal.encode()).hexdigest()[:HASH_CHARS]


async def ask(client: ProbeClient, target: ProbeTarget) -> CanaryAnswer:
    """Send the target's canary and hash its answer. Never raises for a failed request."""
    canary = target.canary
    assert canary is not None
    api = target.endpoint.flavor.name
    extra = dict(target.params.extra_body)
    if canary.seed is not None and api in SEEDED_APIS:
        extra.setdefault("seed", canary.seed)
    params = replace(target.params, max_tokens=canary.max_tokens, temperature=0.0, extra_body=extra)
    sample = Sample(target=target.name, model=target.params.model, api=api, prompt="canary", round=0, warmup=True)
    events: list[str] = []
    token = current_answer.set(events)
    try:
        await client.probe(target.endpoint, params, canary.prompt, sample)
    finally:
        current_answer.reset(token)
    if not sample.ok:
        return CanaryAnswer(target.name, None, sample.error.value if sample.error is not None else "failed")
    return CanaryAnswer(target.name, answer_digest(answer_text(api, events)))
