"""The SSE parser: edge cases as a table, and properties over any chunking and any bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.probe.sse import SSEError, SSEEvent, SSEParser


def parse_all(chunks: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events


CASES = [
    ("lf", b"data: a\n\n", [SSEEvent("a")]),
    ("crlf", b"data: a\r\n\r\n", [SSEEvent("a")]),
    ("cr only", b"data: a\r\r", [SSEEvent("a")]),
    ("no space after colon", b"data:a\n\n", [SSEEvent("a")]),
    ("only the first space is stripped", b"data:  a\n\n", [SSEEvent(" a")]),
    ("multi-line data joined with newline", b"data: a\ndata: b\n\n", [SSEEvent("a\nb")]),
    ("comment is not an event", b": ping\n\ndata: x\n\n", [SSEEvent("x")]),
    ("event field", b"event: message_start\ndata: {}\n\n", [SSEEvent("{}", event="message_start")]),
    ("event without data is dropped", b"event: ping\n\ndata: y\n\n", [SSEEvent("y")]),
    ("id persists", b"id: 7\ndata: a\n\ndata: b\n\n", [SSEEvent("a", id="7"), SSEEvent("b", id="7")]),
    ("empty data line dispatches empty string", b"data\n\n", [SSEEvent("")]),
    ("unterminated event at EOF is discarded", b"data: a\n\ndata: b\n", [SSEEvent("a")]),
    ("leading BOM stripped", b"\xef\xbb\xbfdata: a\n\n", [SSEEvent("a")]),
    ("DONE is just data", b"data: [DONE]\n\n", [SSEEvent("[DONE]")]),
    ("retry and unknown fields ignored", b"retry: 10\nfoo: bar\ndata: a\n\n", [SSEEvent("a")]),
    ("utf-8 content", "data: 你好\n\n".encode(), [SSEEvent("你好")]),
]


@pytest.mark.parametrize(("name", "stream", "expected"), CASES, ids=[c[0] for c in CASES])
def test_it_parses_the_event_stream_edge_cases(name: str, stream: bytes, expected: list[SSEEvent]) -> None:
    assert parse_all([stream]) == expected


def test_it_reassembles_a_utf8_character_split_across_chunks() -> None:
    raw = "data: 首字\n\n".encode()
    split = raw.index("字".encode()) + 1
    assert parse_all([raw[:split], raw[split:]]) == [SSEEvent("首字")]


def test_it_reassembles_a_crlf_split_across_chunks() -> None:
    assert parse_all([b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"]) == [SSEEvent("a"), SSEEvent("b")]


def test_it_counts_comments() -> None:
    parser = SSEParser()
    parser.feed(b": ping\n\n: ping\n\n")
    assert parser.comments == 2


def test_it_rejects_a_line_longer_than_the_bound() -> None:
    parser = SSEParser(max_line_bytes=100)
    with pytest.raises(SSEError, match="longer than 100 bytes"):
        parser.feed(b"data: " + b"x" * 200)


def test_it_parses_an_anthropic_stream() -> None:
    stream = (
        b'event: message_start\ndata: {"type":"message_start"}\n\n'
        b'event: ping\ndata: {"type": "ping"}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    events = parse_all([stream])
    assert [e.event for e in events] == ["message_start", "ping", "content_block_delta", "message_stop"]


def chunkings(raw: bytes) -> st.SearchStrategy[list[bytes]]:
    return st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=20).map(
        lambda cuts: [raw[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(raw)], strict=True)]
    )


field_line = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12).map(lambda t: f"data: {t}"),
    st.sampled_from(["event: message_start", "event: ping", ": ping", "id: 1", "data", ""]),
)
stream_text = st.tuples(st.lists(field_line, max_size=20), st.sampled_from(["\n", "\r\n", "\r"])).map(
    lambda parts: parts[1].join(parts[0]) + parts[1] * 2
)


@settings(max_examples=300, deadline=None)
@given(stream_text.flatmap(lambda text: st.tuples(st.just(text.encode()), chunkings(text.encode()))))
def test_any_chunking_parses_to_the_same_events(case: tuple[bytes, list[bytes]]) -> None:
    raw, chunks = case
    assert b"".join(chunks) == raw
    assert parse_all(chunks) == parse_all([raw])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
def test_arbitrary_bytes_raise_nothing_but_the_parsers_own_error(raw: bytes, step: int) -> None:
    parser = SSEParser(max_line_bytes=512)
    try:
        for i in range(0, len(raw), step):
            parser.feed(raw[i : i + step])
        parser.close()
    except SSEError:
        pass
