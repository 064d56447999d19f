"""Which model answered: a change of what the server says it is starts a new baseline epoch. Pure code.

A provider can move an alias or swap the weights behind an unchanged model id. Then a TTFT shift is
a model change, not a regression: the detector says so once (an `info` event of kind
`model_changed`, which the service turns into a change marker and a notification) and compares the
runs after it with a baseline of their own instead of the one before.

What counts:
* the served model name (the response's `model`, Anthropic's and Gemini's version fields): a change
  counts at once, as it always has: a server names its model deliberately;
* OpenAI's `system_fingerprint`: a change counts once the new value is seen on `FINGERPRINT_CONFIRM_RUNS`
  runs in a row. Fingerprints of one model alternate between backends (a, b, a, b): that never
  confirms, and is no change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from monitor.detect.state import Event, RunPoint, SeriesState

FINGERPRINT_CONFIRM_RUNS = 2


@dataclass(frozen=True, slots=True)
class IdentityChange:
    """What changed and since which run (the epoch's first run)."""

    since: datetime
    served_from: str | None = None
    served_to: str | None = None
    fingerprint_from: str | None = None
    fingerprint_to: str | None = None

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.served_to is not None:
            out["from"], out["to"] = self.served_from, self.served_to
        if self.fingerprint_to is not None:
            out["fingerprint_from"], out["fingerprint_to"] = self.fingerprint_from, self.fingerprint_to
        out["epoch_since"] = self.since.isoformat()
        return out

    def event(self, at: datetime) -> Event:
        return Event(kind="model_changed", action="info", severity="info", at=at, opened_at=at, detail=self.detail())


def observe(state: SeriesState, run: RunPoint) -> IdentityChange | None:
    """Update what `state` knows the series' model to be from `run`; the change, when there is one."""
    served_from = served_to = None
    since = run.at
    if run.served_model is not None:
        if state.served_model is not None and run.served_model != state.served_model:
            served_from, served_to = state.served_model, run.served_model
        state.served_model = run.served_model
    fingerprint_from = fingerprint_to = None
    value = run.fingerprint
    if value is not None:
        known = state.fingerprint
        if known is None or value == known:
            state.fingerprint, state.fingerprint_pending, state.fingerprint_pending_runs = value, None, 0
        else:
            if state.fingerprint_pending is not None and state.fingerprint_pending[0] == value:
                state.fingerprint_pending_runs += 1
            else:
                state.fingerprint_pending, state.fingerprint_pending_runs = (value, run.at), 1
            pending_since = state.fingerprint_pending[1]
            if state.fingerprint_pending_runs >= FINGERPRINT_CONFIRM_RUNS:
                fingerprint_from, fingerprint_to = known, value
                since = min(since, pending_since)
                state.fingerprint, state.fingerprint_pending, state.fingerprint_pending_runs = value, None, 0
    if served_to is None and fingerprint_to is None:
        return None
    return IdentityChange(
        since=since,
        served_from=served_from,
        served_to=served_to,
        fingerprint_from=fingerprint_from,
        fingerprint_to=fingerprint_to,
    )


def describe(detail: dict[str, Any], model: str) -> str:
    """`model behind gpt-4o-mini changed: fp_a1 -> fp_b7`, for notifications and markers."""
    parts = []
    if detail.get("to") is not None:
        parts.append(f"served model {detail.get('from')} -> {detail['to']}")
    if detail.get("fingerprint_to") is not None:
        parts.append(f"fingerprint {detail.get('fingerprint_from')} -> {detail['fingerprint_to']}")
    what = ", ".join(parts) if parts else "changed"
    return f"model behind {model} changed: {what}; a new baseline starts here"
