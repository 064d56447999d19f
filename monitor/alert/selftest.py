"""What `ttft-monitor alert test` sends: a notification shaped like a real regression of the config's first
target, marked as a test, and why a receiver cannot be tried."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from monitor.alert.deliver import config_problems
from monitor.alert.model import Notification, series_link
from monitor.config.models import Config


def sample_notification(config: Config, now: datetime, *, state: str = "firing") -> Notification:
    """A notification that looks like a real regression of the config's first target, marked as a test."""
    target = next(iter(config.targets), "example-target")
    target_config = config.targets.get(target)
    prompt = next(iter(config.prompts), "short")
    job = next((j.name for j in config.jobs if target in j.targets), "alert-test")
    since = now - timedelta(minutes=5)
    return Notification(
        incident_id=uuid.uuid4(),
        state="resolved" if state == "resolved" else "firing",
        kind="test",
        severity="info",
        job=job,
        target=target,
        model=target_config.model if target_config else "example-model",
        provider=target_config.provider if target_config else "example-provider",
        prompt=prompt,
        location=config.location,
        since=since,
        resolved_at=now if state == "resolved" else None,
        baseline_ms=400.0,
        observed_ms=620.0,
        ratio=1.55,
        summary="Test notification from `ttft-monitor alert test`: nothing has regressed.",
        link=series_link(config.alerts.base_url, target=target, prompt=prompt, location=config.location, job=job),
    )


def receiver_problems(config: Config, receiver_name: str) -> list[str]:
    """Why `alert test --receiver NAME` cannot send, one line each; empty when it can."""
    receiver = config.alerts.receivers.get(receiver_name)
    if receiver is None:
        known = ", ".join(sorted(config.alerts.receivers)) or "none are defined"
        return [f"ttft-monitor alert test: no receiver named '{receiver_name}' (known: {known})"]
    return [f"alerts.receivers.{receiver_name}: {problem}" for problem in config_problems(receiver)]
