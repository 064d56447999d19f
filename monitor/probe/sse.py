"""Incremental Server-Sent Events parser (WHATWG event-stream rules), pure: bytes in, events out.

It splits lines on bytes, before decoding, so a UTF-8 character or a CRLF split across two network
chunks is reassembled exactly; every chunking of the same stream yields the same events.
"""

from __future__ import annotations

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024


class SSEError(ValueError):
    """The stream cannot be an event stream (a line longer than the bound)."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str | None = None
    id: str | None = None


class SSEParser:
    """Feed it bytes as they arrive; it returns the events completed by those bytes.

    Comments (`: ping`) are not events; they are counted in `comments` so a caller can tell
    keep-alives from silence.
    """

    __slots__ = (
        "_at_start",
        "_buffer",
        "_data",
        "_event",
        "_has_data",
        "_id",
        "_last_was_cr",
        "_max_line",
        "comments",
    )

    def __init__(self, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._buffer = bytearray()
        self._max_line = max_line_bytes
        self._last_was_cr = False
        self._at_start = True
        self._data: list[str] = []
        self._has_data = False
        self._event: str | None = None
        self._id: str | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        buf = self._buffer
        if self._last_was_cr and chunk[:1] == b"\n":
            # The second half of a CRLF that the previous chunk ended in the middle of.
            chunk = chunk[1:]
        self._last_was_cr = False
        buf += chunk
        if self._at_start:
            if len(buf) < len(_BOM) and _BOM.startswith(bytes(buf)):
                return []
            if buf.startswith(_BOM):
                del buf[: len(_BOM)]
            self._at_start = False
        events: list[SSEEvent] = []
        start = 0
        end = len(buf)
        while start < end:
            lf = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, lf if lf >= 0 else end)
            if cr >= 0:
                line_end, next_start = cr, cr + 1
                if next_start < end and buf[next_start] == 0x0A:
                    next_start += 1
                elif next_start == end:
                    self._last_was_cr = True
            elif lf >= 0:
                line_end, next_start = lf, lf + 1
            else:
                break
            event = self._process_line(bytes(buf[start:line_end]))
            if event is not None:
                events.append(event)
            start = next_start
        del buf[:start]
        if len(buf) > self._max_line:
            raise SSEError(f"event-stream line longer than {self._max_line} bytes without a line break")
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream. Per the standard, an event not terminated by a blank line is discarded."""
        self._buffer.clear()
        self._reset_event()
        return []

    def _reset_event(self) -> None:
        self._data = []
        self._has_data = False
        self._event = None

    def _process_line(self, raw: bytes) -> SSEEvent | None:
        if not raw:
            if not self._has_data:
                self._event = None
                return None
            event = SSEEvent(data="\n".join(self._data), event=self._event, id=self._id)
            self._reset_event()
            return event
        if raw[:1] == b":":
            self.comments += 1
            return None
        line = raw.decode("utf-8", errors="replace")
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._id = value
        # `retry` and unknown fields are ignored, as the standard says.
        return None
