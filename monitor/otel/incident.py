"""An incident's change as the detector reports it: one record that `detect/service.py` hands to `Metrics`,
and `Metrics` on to its telemetry (`OtelTelemetry`), instead of the same eight parameters at every hop.

Here, below both, because the metrics forward it to OpenTelemetry without importing the exporter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class IncidentReading:
    action: str  # the detector's word (detect.rules.Action): open, update, resolve, info
    series: Sequence[str]  # target, prompt, location
    kind: str
    severity: str | None
    baseline_ms: float | None
    observed_ms: float | None
    ratio: float | None
    error_class: str | None

    def facts(self) -> dict[str, str | float | None]:
        """All but the action and the series, by name: what the detector's log line adds to the run's."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("action", "series")}
