"""JSON shapes the API and the commands' `--format json` share: an incident's triage fields. The
store hands over records; how they read as JSON is decided here, once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.store.triage import Annotation, TriageRecord
from monitor.timefmt import iso


def annotation_json(annotation: Annotation) -> dict[str, Any]:
    return {
        "id": str(annotation.id),
        "at": iso(annotation.at, whole_seconds=True),
        "text": annotation.text,
        "target": annotation.target,
        "created_by": annotation.created_by,
    }


def triage_json(record: TriageRecord | None, annotations: Sequence[Annotation]) -> dict[str, Any]:
    """The triage fields of an incident as `incidents --format json` and /api/v1/incidents show them."""
    record = record or TriageRecord()
    return {
        "acked_at": None if record.acked_at is None else iso(record.acked_at, whole_seconds=True),
        "acked_by": record.acked_by,
        "label": record.label,
        "resolved_by": record.resolved_by,
        "note": record.note,
        "annotations": [annotation_json(item) for item in annotations],
    }
