"""Wire formats: the bytes each API puts on the stream. One module per API flavour.

Builders are pure and per stream: everything that does not change between tokens is
serialised once, so a token costs one `json.dumps` of its text and a concatenation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

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
