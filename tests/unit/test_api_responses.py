"""The OpenAI Responses flavour: one event of each type, as OpenAI's API reference shows them."""

from __future__ import annotations

import json

import pytest

from monitor.probe.api_base import EventInfo, EventKind, MalformedEvent, RequestParams
from monitor.probe.apis import FLAVORS
from monitor.probe.sse import SSEEvent

RESPONSES = FLAVORS["openai-responses"]


def event(data: dict) -> SSEEvent:
    return SSEEvent(data=json.dumps(data), event=data.get("type"))


def response(status: str, **extra: object) -> dict:
    return {
        "id": "resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654",
        "object": "response",
        "created_at": 1741290958,
        "status": status,
        "model": "gpt-4.1-2025-04-14",
        "output": [],
        "usage": None,
        **extra,
    }


USAGE = {
    "input_tokens": 2006,
    "input_tokens_details": {"cached_tokens": 1920},
    "output_tokens": 12,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 2018,
}
SERVED = "gpt-4.1-2025-04-14"

CASES = [
    (
        "created",
        {"type": "response.created", "sequence_number": 0, "response": response("in_progress")},
        EventInfo(EventKind.OTHER, served_model=SERVED),
    ),
    (
        "in_progress",
        {"type": "response.in_progress", "sequence_number": 1, "response": response("in_progress")},
        EventInfo(EventKind.OTHER, served_model=SERVED),
    ),
    (
        "output_item.added",
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": "msg_123", "status": "in_progress", "type": "message", "role": "assistant", "content": []},
            "sequence_number": 2,
        },
        EventInfo(EventKind.OTHER),
    ),
    (
        "content_part.added",
        {
            "type": "response.content_part.added",
            "item_id": "msg_123",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
            "sequence_number": 3,
        },
        EventInfo(EventKind.OTHER),
    ),
    (
        "output_text.delta",
        {
            "type": "response.output_text.delta",
            "item_id": "msg_123",
            "output_index": 0,
            "content_index": 0,
            "delta": "In",
            "sequence_number": 4,
        },
        EventInfo(EventKind.ANSWER),
    ),
    (
        "output_text.delta, empty",
        {"type": "response.output_text.delta", "item_id": "msg_123", "delta": "", "sequence_number": 5},
        EventInfo(EventKind.OTHER),
    ),
    (
        "refusal.delta",
        {"type": "response.refusal.delta", "item_id": "msg_123", "delta": "refusal text so far", "sequence_number": 6},
        EventInfo(EventKind.ANSWER),
    ),
    (
        "reasoning_summary_text.delta",
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_6806bfca0b2481918a5748308061a2600d3ce51bdffd5476",
            "output_index": 0,
            "summary_index": 0,
            "delta": '**Responding to a greeting**\n\nThe user just said, "Hello!"',
            "sequence_number": 1,
        },
        EventInfo(EventKind.REASONING),
    ),
    (
        "reasoning_text.delta",
        {
            "type": "response.reasoning_text.delta",
            "item_id": "rs_123",
            "output_index": 0,
            "content_index": 0,
            "delta": "The",
            "sequence_number": 1,
        },
        EventInfo(EventKind.REASONING),
    ),
    (
        "function_call_arguments.delta",
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "item-abc",
            "output_index": 0,
            "delta": '{ "arg":',
            "sequence_number": 1,
        },
        EventInfo(EventKind.TOOL_CALL),
    ),
    (
        "output_text.done",
        {
            "type": "response.output_text.done",
            "item_id": "msg_123",
            "output_index": 0,
            "content_index": 0,
            "text": "In a shimmering forest under a sky full of stars...",
            "sequence_number": 7,
        },
        EventInfo(EventKind.OTHER),
    ),
    (
        "completed",
        {"type": "response.completed", "response": response("completed", usage=USAGE), "sequence_number": 8},
        EventInfo(
            EventKind.DONE,
            served_model=SERVED,
            prompt_tokens=2006,
            completion_tokens=12,
            cached_tokens=1920,
            reasoning_tokens=0,
        ),
    ),
    (
        "incomplete at max_output_tokens",
        {
            "type": "response.incomplete",
            "response": response("incomplete", incomplete_details={"reason": "max_output_tokens"}, usage=USAGE),
            "sequence_number": 8,
        },
        EventInfo(
            EventKind.DONE,
            served_model=SERVED,
            prompt_tokens=2006,
            completion_tokens=12,
            cached_tokens=1920,
            reasoning_tokens=0,
        ),
    ),
    (
        "incomplete for another reason",
        {
            "type": "response.incomplete",
            "response": response("incomplete", incomplete_details={"reason": "content_filter"}),
            "sequence_number": 8,
        },
        EventInfo(EventKind.ERROR, served_model=SERVED, error_message="response incomplete: content_filter"),
    ),
    (
        "failed",
        {
            "type": "response.failed",
            "response": response("failed", error={"code": "server_error", "message": "The model failed to generate"}),
            "sequence_number": 8,
        },
        EventInfo(EventKind.ERROR, served_model=SERVED, error_message="response failed: The model failed to generate"),
    ),
    (
        "error",
        {
            "type": "error",
            "code": "ERR_SOMETHING",
            "message": "Something went wrong",
            "param": None,
            "sequence_number": 1,
        },
        EventInfo(EventKind.ERROR, error_message="Something went wrong"),
    ),
]


@pytest.mark.parametrize(("data", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_responses_event_is_classified(data: dict, expected: EventInfo) -> None:
    assert RESPONSES.classify(event(data)) == expected


def test_a_responses_event_that_is_not_json_is_malformed() -> None:
    with pytest.raises(MalformedEvent):
        RESPONSES.classify(SSEEvent(data="{not json", event="response.output_text.delta"))


def test_the_responses_request_streams_the_prompt_as_input() -> None:
    params = RequestParams(
        model="gpt-4.1", max_tokens=16, temperature=0.0, extra_body={"store": True}, include_usage=True
    )
    assert RESPONSES.path_for(params) == "/responses"
    assert RESPONSES.build_body("hello", params) == {
        "model": "gpt-4.1",
        "input": "hello",
        "stream": True,
        "max_output_tokens": 16,
        "temperature": 0.0,
        "store": True,
    }
    assert RESPONSES.auth_headers("sk-x") == {"Authorization": "Bearer sk-x"}
