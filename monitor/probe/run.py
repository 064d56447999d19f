"""Which run (one job's tick) the probes being sent belong to, for telemetry that groups them.

A context variable, not a parameter threaded through the runner and client: the pipeline sets it around
one run, and every probe task that run starts inherits it (asyncio copies the context into each task),
so concurrent runs of different jobs never see each other's. Nothing on the probe's path reads it but
the optional request tracing (monitor.otel), which names the run's trace in each `traceparent`.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class RunKey:
    """One run: a probe job's tick, as stored (job and intended time)."""

    probe_job: str
    intended_at: datetime


current_run: ContextVar[RunKey | None] = ContextVar("ttft_monitor_current_run", default=None)
