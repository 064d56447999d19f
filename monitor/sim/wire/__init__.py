"""The simulator's API flavours: one module each, listed once in `registry.FLAVORS`.

A flavour module exports a `Flavour`: the paths it serves, how its request body is read, the bytes
it puts on the stream, its whole (non-streamed) answer, and its vendor's `Family` (auth, request-id
header, error body). The server (monitor/sim/server.py) only times and writes what these return.

Builders are pure and per stream: everything that does not change between tokens is
serialised once, so a token costs one `json.dumps` of its text and a concatenation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from monitor.sim.parse import SimRequest
from monitor.sim.plan import OutputPlan

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_SLOT = "\x00slot\x00"


def dumps(obj: Any) -> str:
    """Compact JSON, UTF-8 left as is, the way vLLM (pydantic) and the hosted APIs write it."""
    return _ENCODER.encode(obj)


def split_template(event: str) -> tuple[bytes, bytes]:
    """Cut a serialised event around the `slot()` value, for cheap per-token filling."""
    head, tail = event.split(dumps(_SLOT), 1)
    return head.encode(), tail.encode()


def slot() -> str:
    return _SLOT


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    # Written as completion_tokens_details.reasoning_tokens by the chat and completions wires when not
    # None (OpenAI does; vLLM does not, so a client must estimate them from the stream).
    reasoning_tokens: int | None = None


class StreamWire(Protocol):
    """The events of one streamed response, in the order the simulator writes them."""

    def opening(self) -> bytes:
        """Data events sent as soon as the headers go out, before prefill ends (b"" if none)."""
        ...

    def reasoning(self, piece: str) -> bytes: ...

    def begin_answer(self) -> bytes:
        """What separates reasoning from the answer (b"" if nothing); sent with the first answer token."""
        ...

    def answer(self, piece: str) -> bytes: ...

    def closing(self, *, finished: bool, usage: Usage) -> bytes: ...

    def malformed(self) -> bytes:
        """A data line that is not valid JSON."""
        ...

    def error_event(self) -> bytes:
        """The API's in-stream error event; the stream ends after it."""
        ...


COMMENT_PING = b": ping\n\n"

# A forced tool call answers through this function; its arguments are the answer text, cut at
# max_tokens like any output (so, like a real model's, they may stop mid-JSON).
TOOL_NAME = "record_summary"
TOOL_ARGUMENTS_OPENING = '{"summary": "'


def tool_arguments(piece: str, *, first: bool) -> str:
    """One piece of the arguments JSON: the answer's piece, escaped, after the opening on the first."""
    escaped = dumps(piece)[1:-1]
    return TOOL_ARGUMENTS_OPENING + escaped if first else escaped


@dataclass(frozen=True, slots=True)
class Generation:
    """One accepted generation request, as the wire formats need it."""

    request_id: str
    created: int
    model: str
    thinking: bool
    tool_call: bool
    include_usage: bool
    reasoning_field: str
    plan: OutputPlan
    usage: Usage
    fingerprint: str | None = None  # OpenAI's system_fingerprint, when the model's profile sets one


@dataclass(frozen=True, slots=True)
class Route:
    """What some APIs read from the request line: the path's parameters and the query."""

    match: Mapping[str, str]
    query: Mapping[str, str]


class ErrorBody(Protocol):
    def __call__(
        self, status: int, *, request_id: str, message: str | None = None, model: str | None = None
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class Family:
    """What one vendor's APIs share: how the key is sent, the request-id header, the error body."""

    name: str
    # (request headers, query, the simulator's key) -> whether the request carries that key.
    authorized: Callable[[Mapping[str, str], Mapping[str, str], str], bool]
    response_headers: Callable[[str], dict[str, str]]
    error_body: ErrorBody


def _serves_every_route(_route: Route) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Flavour:
    """One generation API of the simulator: its POST paths, its request parsing, its answers."""

    name: str
    paths: tuple[str, ...]
    family: Family
    parse: Callable[[Mapping[str, Any], Route], SimRequest]
    stream: Callable[[Generation], StreamWire]
    whole: Callable[[Generation], Any]
    # False answers 404, for a path pattern that also matches what the API does not serve.
    serves: Callable[[Route], bool] = _serves_every_route
