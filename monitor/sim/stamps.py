"""Per-request timing records, so a benchmark can compare client-side timings with the server's."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# Prefixes the APIs put in front of the request id; a lookup accepts any of these forms.
ID_PREFIXES = ("chatcmpl-", "cmpl-", "msg_", "req_")


@dataclass(slots=True)
class Stamp:
    """Times are `time.perf_counter_ns()` values: CLOCK_MONOTONIC, comparable across processes on Linux."""

    request_id: str
    api: str
    received_ns: int
    model: str | None = None
    stream: bool | None = None
    status: int = 200
    # in_progress, ok, error (an HTTP error status), hang, cut, malformed, error_event, client_gone,
    # shutdown
    outcome: str = "in_progress"
    configured_ttft_ms: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning: bool = False
    completion_tokens: int = 0
    first_event_write_ns: int | None = None
    first_token_write_ns: int | None = None
    # When the write of the first token returned: on loopback its bytes are in the client's socket by
    # then, so the client's arrival lies between this and `first_token_write_ns`; far apart, the
    # simulator itself was held up in between (a loaded machine), not the client.
    first_token_sent_ns: int | None = None
    first_answer_write_ns: int | None = None
    last_token_write_ns: int | None = None
    completed_ns: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def strip_id_prefix(request_id: str) -> str:
    for prefix in ID_PREFIXES:
        if request_id.startswith(prefix):
            return request_id[len(prefix) :]
    return request_id


class StampStore:
    """The most recent `capacity` stamps, keyed by request id."""

    def __init__(self, *, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._stamps: OrderedDict[str, Stamp] = OrderedDict()

    def __len__(self) -> int:
        return len(self._stamps)

    def add(self, stamp: Stamp) -> None:
        self._stamps[stamp.request_id] = stamp
        self._stamps.move_to_end(stamp.request_id)
        while len(self._stamps) > self.capacity:
            self._stamps.popitem(last=False)

    def get(self, request_id: str) -> Stamp | None:
        found = self._stamps.get(request_id)
        if found is None:
            found = self._stamps.get(strip_id_prefix(request_id))
        return found

    def clear(self) -> None:
        self._stamps.clear()
