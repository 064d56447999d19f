"""Which model answered: a change of what the server says it is starts a new baseline epoch. Pure code.

A provider can move an alias or swap the weights behind an unchanged model id. Then a TTFT shift is
a model change, not a regression: the detector says so once (an `info` event of kind
`model_changed`, which the service turns into a change marker and a notification) and compares the
runs after it with a baseline of their own instead of the one before.

What counts:
* the served model name (the response's `model`, Anthropic's and Gemini's version fields): a change
  counts at once, as it always has: a server names its model deliberately;
* OpenAI's `system_fingerprint`: a change counts once the new value is seen on `CONFIRM_RUNS` runs in
  a row. Fingerprints of one model alternate between backends (a, b, a, b): that never confirms, and
  is no change.
* what a self-hosted server says it runs (`server_build`: its version, the weights behind the model id,
  its cache configuration; monitor/probe/server_metrics.py), confirmed the same way;
* the canary's answer hash (monitor/probe/canary.py), the same way; and an answer that varies on
  every run (3 different in the last 4) is "not deterministic" (`canary_unstable`), ignored until
  its answers agree again, never a change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from monitor.detect.state import Event, RunPoint, SeriesState

# A new fingerprint or canary answer counts once seen on this many runs in a row.
CONFIRM_RUNS = 2
# A canary whose last CANARY_RECENT answers hold UNSTABLE_DISTINCT different ones is not deterministic.
CANARY_RECENT = 4
UNSTABLE_DISTINCT = 3


@dataclass(frozen=True, slots=True)
class IdentityChange:
    """What changed and since which run (the epoch's first run)."""

    since: datetime
    served_from: str | None = None
    served_to: str | None = None
    fingerprint_from: str | None = None
    fingerprint_to: str | None = None
    canary_from: str | None = None
    canary_to: str | None = None
    server_build_from: str | None = None
    server_build_to: str | None = None

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.served_to is not None:
            out["from"], out["to"] = self.served_from, self.served_to
        if self.fingerprint_to is not None:
            out["fingerprint_from"], out["fingerprint_to"] = self.fingerprint_from, self.fingerprint_to
        if self.canary_to is not None:
            out["canary_from"], out["canary_to"] = self.canary_from, self.canary_to
        if self.server_build_to is not None:
            out["server_build_from"], out["server_build_to"] = self.server_build_from, self.server_build_to
        out["epoch_since"] = self.since.isoformat()
        return out

    def event(self, at: datetime) -> Event:
        return Event(kind="model_changed", action="info", severity="info", at=at, opened_at=at, detail=self.detail())


def _confirmed(state: SeriesState, what: str, value: str, at: datetime) -> tuple[str | None, datetime] | None:
    """Feed one run's `value` of `what` (fingerprint, canary) to its confirmation; (before, since) when
    a new value is confirmed (seen on CONFIRM_RUNS runs in a row), since its first run."""
    known = getattr(state, what)
    pending: tuple[str, datetime] | None = getattr(state, f"{what}_pending")
    if known is None or value == known:
        setattr(state, what, value)
        setattr(state, f"{what}_pending", None)
        setattr(state, f"{what}_pending_runs", 0)
        return None
    if pending is not None and pending[0] == value:
        runs = getattr(state, f"{what}_pending_runs") + 1
    else:
        pending, runs = (value, at), 1
    if runs < CONFIRM_RUNS:
        setattr(state, f"{what}_pending", pending)
        setattr(state, f"{what}_pending_runs", runs)
        return None
    setattr(state, what, value)
    setattr(state, f"{what}_pending", None)
    setattr(state, f"{what}_pending_runs", 0)
    return known, pending[1]


def _canary_stable(state: SeriesState, value: str) -> bool:
    """Keep the canary's last hashes; False while they vary too much to mean anything (not deterministic:
    UNSTABLE_DISTINCT different answers in the last CANARY_RECENT runs). It becomes stable again once
    they agree, with the answer they agree on as the known one."""
    recent = state.canary_recent
    recent.append(value)
    del recent[:-CANARY_RECENT]
    if len(set(recent)) >= UNSTABLE_DISTINCT:
        state.canary_unstable = True
        state.canary, state.canary_pending, state.canary_pending_runs = None, None, 0
        return False
    if state.canary_unstable:
        if len(recent) < CANARY_RECENT or len(set(recent)) != 1:
            return False
        state.canary_unstable = False
        state.canary = value
    return True


def observe(state: SeriesState, run: RunPoint) -> IdentityChange | None:
    """Update what `state` knows the series' model to be from `run`; the change, when there is one."""
    served_from = served_to = None
    since = run.at
    if run.served_model is not None:
        if state.served_model is not None and run.served_model != state.served_model:
            served_from, served_to = state.served_model, run.served_model
        state.served_model = run.served_model
    changes: dict[str, tuple[str | None, str]] = {}
    if served_to is not None:
        # Another model by name: the fingerprint and canary answer it brings are the new model's, confirmed
        # by the name itself. Left to their own confirmation they would be a second change a run later.
        if run.fingerprint is not None:
            _adopt(state, "fingerprint", run.fingerprint, changes)
        if run.canary is not None and _canary_stable(state, run.canary):
            _adopt(state, "canary", run.canary, changes)
        if run.server_build is not None:
            _adopt(state, "server_build", run.server_build, changes)
        return IdentityChange(since=since, served_from=served_from, served_to=served_to, **_fields(changes))
    if run.fingerprint is not None:
        found = _confirmed(state, "fingerprint", run.fingerprint, run.at)
        if found is not None:
            changes["fingerprint"] = (found[0], run.fingerprint)
            since = min(since, found[1])
    if run.canary is not None and _canary_stable(state, run.canary):
        found = _confirmed(state, "canary", run.canary, run.at)
        if found is not None:
            changes["canary"] = (found[0], run.canary)
            since = min(since, found[1])
    if run.server_build is not None:
        found = _confirmed(state, "server_build", run.server_build, run.at)
        if found is not None:
            changes["server_build"] = (found[0], run.server_build)
            since = min(since, found[1])
    if not changes:
        return None
    return IdentityChange(since=since, **_fields(changes))


def _adopt(state: SeriesState, what: str, value: str, changes: dict[str, tuple[str | None, str]]) -> None:
    """Take `value` as the known `what` at once (the served model changed with it); a change when it differs."""
    known = getattr(state, what)
    setattr(state, what, value)
    setattr(state, f"{what}_pending", None)
    setattr(state, f"{what}_pending_runs", 0)
    if known is not None and known != value:
        changes[what] = (known, value)


def _fields(changes: dict[str, tuple[str | None, str]]) -> dict[str, str | None]:
    fingerprint = changes.get("fingerprint", (None, None))
    canary = changes.get("canary", (None, None))
    build = changes.get("server_build", (None, None))
    return {
        "fingerprint_from": fingerprint[0],
        "fingerprint_to": fingerprint[1],
        "canary_from": canary[0],
        "canary_to": canary[1],
        "server_build_from": build[0],
        "server_build_to": build[1],
    }


# Tokens per probe that grew at least this many times, and by at least this many: "the model now reasons"
# (as monitor.probe.spend logs it per run).
TOKENS_JUMP_RATIO = 4.0
TOKENS_JUMP_MIN = 100


def tokens_jump(state: SeriesState, run: RunPoint) -> Event | None:
    """An `info` event when the run's output tokens per probe jumped from the last run's (12 -> 950: a model
    that now reasons costs many times what it did, and its first answer token comes after the thinking).
    No new epoch: the same model, answering differently; its latency rules judge what that does."""
    if run.output_tokens is None:
        return None
    was, was_reasoning = state.output_tokens, state.reasoning_tokens
    state.output_tokens, state.reasoning_tokens = run.output_tokens, run.reasoning_tokens
    if was is None:
        return None
    grew = run.output_tokens - was
    if grew < TOKENS_JUMP_MIN or run.output_tokens < TOKENS_JUMP_RATIO * max(was, 1.0):
        return None
    detail: dict[str, Any] = {"tokens_from": was, "tokens_to": run.output_tokens}
    if run.reasoning_tokens is not None:
        detail["reasoning_from"], detail["reasoning_to"] = was_reasoning, run.reasoning_tokens
    return Event(kind="tokens_jump", action="info", severity="info", at=run.at, opened_at=run.at, detail=detail)


def tokens_jump_prefix(model: str) -> str:
    """How every tokens_jump marker of `model` begins, whatever its figures."""
    return f"output tokens per probe of {model} jumped"


def describe_tokens(detail: dict[str, Any], model: str) -> str:
    """`output tokens per probe of qwen3-8b jumped 12 -> 950 (reasoning 0 -> 940): the model now reasons`."""
    text = f"{tokens_jump_prefix(model)} {detail['tokens_from']:g} -> {detail['tokens_to']:g}"
    reasoning_to = detail.get("reasoning_to")
    if reasoning_to:  # 0: none reported or estimated, nothing to say ("reasoning 0 -> 0")
        text += f" (reasoning {detail.get('reasoning_from') or 0:g} -> {reasoning_to:g})"
        if reasoning_to >= 0.5 * detail["tokens_to"]:
            return text + ": the model now reasons"
    return text


def describe(detail: dict[str, Any], model: str) -> str:
    """`model behind gpt-4o-mini changed: fp_a1 -> fp_b7`, for notifications and markers."""
    parts = []
    if detail.get("to") is not None:
        parts.append(f"served model {detail.get('from')} -> {detail['to']}")
    if detail.get("fingerprint_to") is not None:
        parts.append(f"fingerprint {detail.get('fingerprint_from')} -> {detail['fingerprint_to']}")
    if detail.get("canary_to") is not None:
        parts.append("canary answer changed")
    if detail.get("server_build_to") is not None:
        parts.append(f"server {build_difference(detail.get('server_build_from'), detail['server_build_to'])}")
    what = ", ".join(parts) if parts else "changed"
    return f"model behind {model} changed: {what}; a new baseline starts here"


def build_difference(before: str | None, after: str) -> str:
    """What differs between two server builds, part by part: `prefix caching True -> prefix caching False`
    of two descriptions otherwise alike (monitor/probe/server_metrics.py joins its parts with `; ` and `, `)."""
    if before is None:
        return f"-> {after}"
    old, new = re.split(r"; |, ", before), re.split(r"; |, ", after)
    gone = [part for part in old if part not in new]
    came = [part for part in new if part not in old]
    if not gone and not came:  # the same parts in another order
        return f"{before} -> {after}"
    return f"{', '.join(gone) or '(none)'} -> {', '.join(came) or '(none)'}"
