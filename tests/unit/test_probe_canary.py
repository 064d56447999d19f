"""The canary's answer, per API, from its answer events' data (monitor/probe/canary.py): pure."""

from __future__ import annotations

import json

import pytest

from monitor.probe.canary import answer_digest, answer_text


@pytest.mark.parametrize(
    ("api", "events"),
    [
        ("openai-chat", [{"choices": [{"delta": {"content": "rea"}}]}, {"choices": [{"delta": {"content": "dy"}}]}]),
        ("openai-completions", [{"choices": [{"text": "rea"}]}, {"choices": [{"text": "dy"}]}]),
        ("anthropic-messages", [{"type": "content_block_delta", "delta": {"type": "text_delta", "text": "ready"}}]),
        ("openai-responses", [{"type": "response.output_text.delta", "delta": "rea"}, {"delta": "dy"}]),
        (
            "gemini",
            [{"candidates": [{"content": {"parts": [{"text": "hmm", "thought": True}, {"text": "ready"}]}}]}],
        ),
    ],
)
def test_each_api_gives_the_visible_answer(api: str, events: list[dict]) -> None:
    assert answer_text(api, [json.dumps(e) for e in events]) == "ready"


def test_the_digest_ignores_whitespace_but_not_words_and_an_empty_answer_has_none() -> None:
    assert answer_digest(" ready\n") == answer_digest("ready")
    assert answer_digest("ready now") == answer_digest("ready   now")
    assert answer_digest("Ready") != answer_digest("ready")
    assert answer_digest("  ") is None
    digest = answer_digest("ready")
    assert digest is not None and len(digest) == 16


def test_events_of_a_shape_the_api_did_not_promise_give_no_answer_not_an_error() -> None:
    assert answer_text("openai-chat", ["not json", json.dumps({"choices": 5}), "[DONE]"]) == ""
