"""The Gemini flavour: one event of each kind, built from Google's published streaming examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.probe.api_base import EventInfo, EventKind, MalformedEvent, RequestParams
from monitor.probe.apis import FLAVORS
from monitor.probe.client import Endpoint
from monitor.probe.sse import SSEEvent

ROOT = Path(__file__).resolve().parent.parent.parent
GEMINI = FLAVORS["gemini"]
VERSION = "gemini-2.5-flash"


def chunk(parts: list[dict] | None = None, *, finish: str | None = None, usage: dict | None = None) -> dict:
    obj: dict = {"modelVersion": VERSION, "responseId": "mWWpaJbYJ9KLqtsPkOrz0Ao"}
    if parts is not None:
        candidate: dict = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        obj["candidates"] = [candidate]
    if usage is not None:
        obj["usageMetadata"] = usage
    return obj


USAGE = {
    "promptTokenCount": 2100,
    "cachedContentTokenCount": 2048,
    "candidatesTokenCount": 9,
    "thoughtsTokenCount": 30,
    "totalTokenCount": 2139,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 2100}],
}

CASES = [
    ("text", chunk([{"text": "The"}]), EventInfo(EventKind.ANSWER, served_model=VERSION)),
    (
        "thought summary",
        chunk([{"text": "**Thinking about the question**", "thought": True}]),
        EventInfo(EventKind.REASONING, served_model=VERSION),
    ),
    (
        "thought, then text in one chunk",
        chunk([{"text": "hmm", "thought": True}, {"text": "Answer"}]),
        EventInfo(EventKind.ANSWER, served_model=VERSION),
    ),
    (
        "function call",
        chunk([{"functionCall": {"name": "get_current_weather", "args": {"location": "Boston, MA"}}}]),
        EventInfo(EventKind.TOOL_CALL, served_model=VERSION),
    ),
    ("empty text", chunk([{"text": ""}]), EventInfo(EventKind.OTHER, served_model=VERSION)),
    (
        "last text with STOP and usage",
        chunk([{"text": " sky is blue."}], finish="STOP", usage=USAGE),
        EventInfo(
            EventKind.ANSWER,
            served_model=VERSION,
            prompt_tokens=2100,
            cached_tokens=2048,
            completion_tokens=39,
            reasoning_tokens=30,
            finished=True,
        ),
    ),
    (
        "MAX_TOKENS with no text",
        chunk([{"text": ""}], finish="MAX_TOKENS"),
        EventInfo(EventKind.OTHER, served_model=VERSION, finished=True),
    ),
    (
        "SAFETY stop",
        chunk([], finish="SAFETY"),
        EventInfo(EventKind.ERROR, served_model=VERSION, error_message="generation stopped: SAFETY"),
    ),
    (
        "usage only",
        chunk(usage={"promptTokenCount": 8, "totalTokenCount": 8}),
        EventInfo(EventKind.OTHER, served_model=VERSION, prompt_tokens=8),
    ),
    (
        "blocked prompt",
        {"promptFeedback": {"blockReason": "SAFETY"}, "modelVersion": VERSION},
        EventInfo(EventKind.ERROR, served_model=VERSION, error_message="prompt blocked: SAFETY"),
    ),
    (
        "error",
        {
            "error": {
                "code": 503,
                "message": "The model is overloaded. Please try again later.",
                "status": "UNAVAILABLE",
            }
        },
        EventInfo(EventKind.ERROR, error_message="The model is overloaded. Please try again later."),
    ),
]


@pytest.mark.parametrize(("data", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_gemini_event_is_classified(data: dict, expected: EventInfo) -> None:
    assert GEMINI.classify(SSEEvent(data=json.dumps(data))) == expected


def test_a_candidate_that_is_not_an_object_is_malformed() -> None:
    with pytest.raises(MalformedEvent):
        GEMINI.classify(SSEEvent(data='{"candidates": [5]}'))


PARAMS = RequestParams(model="gemini-2.5-flash", max_tokens=16, temperature=0.0, extra_body={}, include_usage=True)


@pytest.mark.parametrize(
    ("base_url", "model", "url"),
    [
        (
            "https://generativelanguage.googleapis.com/v1beta",
            "gemini-2.5-flash",
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ),
        (
            "https://generativelanguage.googleapis.com/v1beta/",
            "models/gemini-2.5-flash",
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ),
        (
            "https://gateway.example/v1beta?key=abc",
            "gemini-2.5-pro",
            "https://gateway.example/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=abc",
        ),
    ],
)
def test_the_gemini_url_always_asks_for_sse(base_url: str, model: str, url: str) -> None:
    params = RequestParams(model=model, max_tokens=16, temperature=0.0, extra_body={}, include_usage=True)
    assert Endpoint(base_url, GEMINI).url_for(params) == url


def test_the_gemini_request_carries_the_key_in_its_header_and_the_prompt_as_contents() -> None:
    assert GEMINI.auth_headers("AIza-test") == {"x-goog-api-key": "AIza-test"}
    assert GEMINI.build_body("hello", PARAMS) == {
        "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
        "generationConfig": {"maxOutputTokens": 16, "temperature": 0.0},
    }


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        ("https://generativelanguage.googleapis.com/v1beta?alt=json", "remove alt= from base_url"),
        (
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent",
            "base_url must stop before /models/",
        ),
    ],
    ids=["alt-json", "whole-method-url"],
)
def test_a_gemini_config_that_would_drop_alt_sse_is_refused(tmp_path, base_url: str, message: str) -> None:
    import yaml

    from monitor.config.errors import ConfigError
    from monitor.config.loader import load_config

    data = yaml.safe_load((ROOT / "config.yaml").read_text())
    data["providers"]["google"] = {"base_url": base_url, "api": "gemini"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: providers.google: api gemini: ")
    assert message in lines[0]


def test_a_gemini_config_with_a_plain_base_url_loads(tmp_path) -> None:
    import yaml

    from monitor.config.loader import load_config

    data = yaml.safe_load((ROOT / "config.yaml").read_text())
    data["providers"]["google"] = {"base_url": "https://generativelanguage.googleapis.com/v1beta", "api": "gemini"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_config(path, environ={}).providers["google"].api == "gemini"
