"""Reasoning tokens per sample: read from each API's usage where it counts them, estimated otherwise."""

from __future__ import annotations

import json

import pytest

from monitor.probe.apis import FLAVORS
from monitor.probe.body import estimated_reasoning_tokens
from monitor.probe.sse import SSEEvent


def classify(api: str, obj: dict) -> int | None:
    return FLAVORS[api].classify(SSEEvent(data=json.dumps(obj))).reasoning_tokens


CHAT_USAGE = {"prompt_tokens": 20, "completion_tokens": 977, "total_tokens": 997}


@pytest.mark.parametrize(
    ("api", "event", "expected"),
    [
        (
            "openai-chat",
            {"choices": [], "usage": {**CHAT_USAGE, "completion_tokens_details": {"reasoning_tokens": 950}}},
            950,
        ),
        ("openai-chat", {"choices": [], "usage": CHAT_USAGE}, None),  # vLLM: no details, so estimated later
        ("openai-chat", {"choices": [], "usage": {**CHAT_USAGE, "completion_tokens_details": None}}, None),
        (
            "openai-completions",
            {"choices": [], "usage": {**CHAT_USAGE, "completion_tokens_details": {"reasoning_tokens": 0}}},
            0,
        ),
        (
            "openai-responses",
            {
                "type": "response.completed",
                "response": {
                    "usage": {"input_tokens": 5, "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 33}}
                },
            },
            33,
        ),
        (
            "gemini",
            {
                "candidates": [],
                "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 9, "thoughtsTokenCount": 30},
            },
            30,
        ),
        ("gemini", {"candidates": [], "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 9}}, 0),
        # Anthropic's output_tokens include thinking and nothing counts it apart: always estimated.
        ("anthropic-messages", {"type": "message_delta", "usage": {"output_tokens": 120}}, None),
    ],
)
def test_each_api_reports_the_reasoning_tokens_it_counts(api: str, event: dict, expected: int | None) -> None:
    assert classify(api, event) == expected


@pytest.mark.parametrize(
    ("reasoning_events", "token_events", "completion_tokens", "expected"),
    [
        (40, 88, 88, 40),  # one token per event: the events themselves
        (20, 40, 80, 40),  # two tokens an event: the share of what the server counted
        (0, 48, 48, 0),  # no reasoning channel seen
        (12, 30, None, 12),  # no usage: one token an event
        (3, 0, 10, 3),
    ],
)
def test_an_estimate_is_the_reasoning_events_share_of_the_counted_output(
    reasoning_events: int, token_events: int, completion_tokens: int | None, expected: int
) -> None:
    got = estimated_reasoning_tokens(
        reasoning_events=reasoning_events, token_events=token_events, completion_tokens=completion_tokens
    )
    assert got == expected
